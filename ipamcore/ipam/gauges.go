package ipam

import (
	"github.com/prometheus/client_golang/prometheus"
)

// poolCollector reports the pools of the served node set as sums, computed
// at scrape time from the datastore: no per-node series, so cardinality does
// not grow with the cluster.
type poolCollector struct {
	ipam *IPAM
	ips  *prometheus.Desc
	enis *prometheus.Desc
	node *prometheus.Desc
}

func newPoolCollector(i *IPAM) *poolCollector {
	return &poolCollector{
		ipam: i,
		ips: prometheus.NewDesc("cce_ipam_pool_ips",
			"IPs on the ENIs of the served nodes, by state (idle, cooling, assigned, held).", []string{"state"}, nil),
		enis: prometheus.NewDesc("cce_ipam_enis", "ENIs of the served nodes.", nil, nil),
		node: prometheus.NewDesc("cce_ipam_served_nodes", "Nodes this replica serves.", nil, nil),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.ips
	ch <- c.enis
	ch <- c.node
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	var idle, cooling, assigned, held, enis int
	nodes := c.ipam.ServedNodes()
	now := c.ipam.deps.Clock.Now()
	for _, n := range nodes {
		st, err := c.ipam.store.Stats(n, now)
		if err != nil {
			continue
		}
		idle += st.Idle - st.Cooling
		cooling += st.Cooling
		assigned += st.Assigned
		held += st.Held
		enis += len(st.ENIs)
	}
	for state, v := range map[string]int{"idle": idle, "cooling": cooling, "assigned": assigned, "held": held} {
		ch <- prometheus.MustNewConstMetric(c.ips, prometheus.GaugeValue, float64(v), state)
	}
	ch <- prometheus.MustNewConstMetric(c.enis, prometheus.GaugeValue, float64(enis))
	ch <- prometheus.MustNewConstMetric(c.node, prometheus.GaugeValue, float64(len(nodes)))
}
