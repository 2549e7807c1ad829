package ipam

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Allocation and release paths (the "path" label).
const (
	pathPool   = "pool"   // an ordinary pod, from or back to the warm pool
	pathFixed  = "fixed"  // a fixed-IP StatefulSet pod
	pathRepeat = "repeat" // a repeated ADD of the same sandbox
)

type metrics struct {
	allocations  *prometheus.CounterVec
	releases     *prometheus.CounterVec
	rebuilds     *prometheus.CounterVec
	poolErrors   *prometheus.CounterVec
	poolAdded    prometheus.Counter
	poolReturned prometheus.Counter
	enisCreated  prometheus.Counter
	gcActions    *prometheus.CounterVec
	gcDuration   prometheus.Histogram
	leakSuspects prometheus.Gauge
	leakOldest   prometheus.Gauge
	fenced       prometheus.Counter
	reconciled   *prometheus.CounterVec
	ghostWEPs    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		allocations: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_allocations_total", Help: "Pod IP allocations by result and path (pool, fixed, repeat).",
		}, []string{"result", "path"}),
		releases: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_releases_total", Help: "Pod IP releases by result and path (pool; fixed keeps the IP reserved).",
		}, []string{"result", "path"}),
		rebuilds: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_node_rebuilds_total", Help: "Node state rebuilds (ServeNode) by result.",
		}, []string{"result"}),
		poolErrors: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_pool_cloud_errors_total", Help: "Cloud errors while growing or trimming pools, by error class.",
		}, []string{"class"}),
		poolAdded: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_pool_ips_added_total", Help: "IPs added to node pools from the cloud.",
		}),
		poolReturned: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_pool_ips_returned_total", Help: "Idle IPs returned to the cloud by pool trimming.",
		}),
		enisCreated: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_enis_created_total", Help: "ENIs created and attached for nodes that needed capacity.",
		}),
		gcActions: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_gc_actions_total", Help: "IPs released by garbage collection, by kind.",
		}, []string{"kind"}),
		reconciled: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_ip_reconcile_total",
			Help: "Addresses whose cloud state was settled address by address, by outcome: confirmed (held, then " +
				"listed), gone (held or idle, then missing from two reads), adopted (listed twice, unknown to the " +
				"datastore), assigned_missing (a pod's address the cloud does not list).",
		}, []string{"outcome"}),
		ghostWEPs: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_ghost_weps_total",
			Help: "WorkloadEndpoints of served nodes naming an address the datastore holds idle (held out of the pool: " +
				"idle_held) or gives another pod (claimed_twice).",
		}, []string{"kind"}),
		gcDuration: f.NewHistogram(prometheus.HistogramOpts{
			Name: "cce_ipam_gc_duration_seconds", Help: "Duration of one garbage-collection pass.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 12),
		}),
		leakSuspects: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_leaked_ip_suspects", Help: "Assigned IPs without a WorkloadEndpoint, waiting out the leak grace period.",
		}),
		leakOldest: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_leaked_ip_oldest_suspect_age_seconds", Help: "Age of the oldest leaked-IP suspect.",
		}),
		fenced: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_fenced_writes_total",
			Help: "Writes for a node refused because this replica may no longer act for it (ownership moved or lease at risk).",
		}),
	}
}
