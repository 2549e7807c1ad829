package shard

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// RenewDurationBuckets are cce_ipam_shard_lease_renew_duration_seconds'
// bounds (seconds): fine below the renew period, and every half second or
// second up to the default deadline, where a lapse threatens.
var RenewDurationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 4}

// Per-shard metrics. The replica is the scrape target, so no replica label.
type metrics struct {
	ownedNodes        prometheus.Gauge
	ownedPartitions   prometheus.Gauge
	members           prometheus.Gauge
	partitionsClaimed prometheus.Counter
	handovers         *prometheus.CounterVec
	handoverDuration  prometheus.Histogram
	renewFailures     prometheus.Counter
	renewDuration     prometheus.Histogram
	leaseValid        prometheus.Gauge
	balancePublished  prometheus.Counter
	policyPresent     prometheus.Gauge
	fenceCatchUp      prometheus.Histogram
	budget            budgetMetrics
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		budget: newBudgetMetrics(reg),
		policyPresent: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_fencing_policy_present",
			Help: "1 when the fencing ValidatingAdmissionPolicy and its binding exist " +
				"(the API server refuses wep writes under a stale claim), else 0.",
		}),
		fenceCatchUp: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "cce_ipam_shard_fence_catchup_seconds",
			Help:    "After a takeover's claim CAS, until the API server's fencing policy refused the old holder's token.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
		}),
		ownedNodes: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_shard_owned_nodes", Help: "Nodes this replica serves.",
		}),
		ownedPartitions: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_shard_owned_partitions", Help: "Partitions this replica holds and serves.",
		}),
		members: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_shard_members", Help: "Live replicas in this replica's ring (fresh Leases, not leaving).",
		}),
		partitionsClaimed: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_shard_partitions_claimed_total", Help: "Partitions this replica claimed.",
		}),
		handovers: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_shard_handovers_total",
			Help: "Partition hand-overs by reason: free (claimed after a release or first start), " +
				"takeover (of an expired replica), reclaim, released (drained and given up), " +
				"fenced (stopped because the lease was at risk or the claim was lost).",
		}, []string{"reason"}),
		handoverDuration: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "cce_ipam_shard_handover_duration_seconds",
			Help:    "From the ring giving this replica a partition until its nodes are served.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 12),
		}),
		balancePublished: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_shard_balance_published_total",
			Help: "Times this replica published the partitions' node counts (the ring's node balance moved).",
		}),
		renewFailures: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_shard_lease_renew_failures_total", Help: "Failed renewals of this replica's Lease.",
		}),
		renewDuration: f.NewHistogram(prometheus.HistogramOpts{
			Name: "cce_ipam_shard_lease_renew_duration_seconds",
			Help: "Round trip of each renewal of this replica's Lease, failed ones included. A replica lapses when " +
				"a renewal (counted as at least --shard-renew-period) and the next one together take longer than " +
				"--shard-renew-deadline: the margin to size the lease by.",
			Buckets: RenewDurationBuckets,
		}),
		leaseValid: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_shard_lease_valid", Help: "1 while this replica's Lease is valid (it may serve), else 0.",
		}),
	}
}

// budgetMetrics are the budget's own.
type budgetMetrics struct {
	rate  prometheus.Gauge
	burst prometheus.Gauge
}

func newBudgetMetrics(reg prometheus.Registerer) budgetMetrics {
	f := promauto.With(reg)
	return budgetMetrics{
		rate: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_shard_budget_rate", Help: "This replica's share of the cluster-wide BCE call rate (calls per second).",
		}),
		burst: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_shard_budget_burst", Help: "This replica's share of the cluster-wide BCE burst.",
		}),
	}
}

// routerMetrics are the router's own.
type routerMetrics struct {
	forwarded       *prometheus.CounterVec
	ownerWaits      *prometheus.CounterVec
	forwardRejected prometheus.Counter
}

func newRouterMetrics(reg prometheus.Registerer) routerMetrics {
	f := promauto.With(reg)
	m := routerMetrics{
		forwarded: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_shard_forwarded_requests_total",
			Help: "CNI calls forwarded to the owning replica, by result (ok, error, not_owner).",
		}, []string{"result"}),
		ownerWaits: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_shard_owner_waits_total",
			Help: "CNI calls that had to wait for their node to get an owner, by outcome (served, timeout).",
		}, []string{"outcome"}),
		forwardRejected: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_shard_forward_rejected_total", Help: "Forwarded calls rejected because their authentication failed.",
		}),
	}
	// Both outcomes are exported at 0 from the start: a series that appears
	// at 1 has no increase() in Prometheus, so a replica's first timeout
	// would never fire CCEIPAMOwnerWaitTimeouts.
	for _, outcome := range []string{"served", "timeout"} {
		m.ownerWaits.WithLabelValues(outcome)
	}
	return m
}

// updateMetrics refreshes the gauges (on the loop).
func (c *Coordinator) updateMetrics() {
	up := 0
	for _, st := range c.serving.state {
		if st == nodeUp {
			up++
		}
	}
	c.metrics.ownedNodes.Set(float64(up))
	c.metrics.ownedPartitions.Set(float64(len(c.own.Serving())))
	c.metrics.members.Set(float64(len(c.live)))
	valid := 0.0
	if c.clock.Now().Before(c.own.LeaseValidUntil()) {
		valid = 1
	}
	c.metrics.leaseValid.Set(valid)
}
