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
	allocations   *prometheus.CounterVec
	releases      *prometheus.CounterVec
	rebuilds      *prometheus.CounterVec
	prefetches    prometheus.Counter
	poolErrors    *prometheus.CounterVec
	poolAdded     prometheus.Counter
	poolReturned  prometheus.Counter
	enisCreated   prometheus.Counter
	enisAhead     prometheus.Counter
	gcActions     *prometheus.CounterVec
	gcDuration    prometheus.Histogram
	leakSuspects  prometheus.Gauge
	leakOldest    prometheus.Gauge
	leakPastGrace prometheus.Gauge
	heldInUse     prometheus.Gauge
	// finishesPending: releases whose DEL is answered and whose finalizer
	// removal has not finished (pendingFinish).
	finishesPending prometheus.Gauge
	// Writes refused as fenced, by who refused them (the "by" label):
	// this replica's own fence, before sending anything, or the API
	// server's fencing policy, a wep write it sent (fencing.go).
	fencedByReplica   prometheus.Counter
	fencedByAPIServer prometheus.Counter
	reconciled        *prometheus.CounterVec
	ghostWEPs         *prometheus.CounterVec
}

const prefetchesHelp = "ENI lists read ahead of a takeover, when another replica's Lease went stale " +
	"(a takeover within a lease duration starts from it)."

const poolAddedHelp = "IPs added to node pools from the cloud."

const finishesPendingHelp = "Releases whose CNI DEL was answered once the wep's delete was marked and whose " +
	"finalizer removal (and the address's return to the pool) has not finished yet."

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	fenced := f.NewCounterVec(prometheus.CounterOpts{
		Name: "cce_ipam_fenced_writes_total",
		Help: "Writes for a node refused because this replica may no longer act for it, by who refused them: " +
			"replica (its own fence, before sending: ownership moved or lease at risk) or apiserver (the API " +
			"server's fencing policy refused a wep write whose fencing token is no longer the partition's claim).",
	}, []string{"by"})
	return &metrics{
		// Both series exist from the start at 0: a series first seen at 1
		// shows no increase() in Prometheus, and the first refusal is the
		// one that matters.
		fencedByReplica:   fenced.WithLabelValues("replica"),
		fencedByAPIServer: fenced.WithLabelValues("apiserver"),
		allocations: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_allocations_total", Help: "Pod IP allocations by result and path (pool, fixed, repeat).",
		}, []string{"result", "path"}),
		releases: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_releases_total", Help: "Pod IP releases by result and path (pool; fixed keeps the IP reserved).",
		}, []string{"result", "path"}),
		prefetches: f.NewCounter(prometheus.CounterOpts{Name: "cce_ipam_eni_prefetches_total", Help: prefetchesHelp}),
		rebuilds: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_node_rebuilds_total", Help: "Node state rebuilds (ServeNode) by result.",
		}, []string{"result"}),
		poolErrors: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_pool_cloud_errors_total", Help: "Cloud errors while growing or trimming pools, by error class.",
		}, []string{"class"}),
		poolAdded: f.NewCounter(prometheus.CounterOpts{Name: "cce_ipam_pool_ips_added_total", Help: poolAddedHelp}),
		poolReturned: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_pool_ips_returned_total", Help: "Idle IPs returned to the cloud by pool trimming.",
		}),
		enisCreated: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_enis_created_total", Help: "ENIs created and attached for nodes that needed capacity.",
		}),
		enisAhead: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_enis_created_ahead_total",
			Help: "ENIs created ahead of demand (pre-attached count, warm IP target), a subset of cce_ipam_enis_created_total.",
		}),
		gcActions: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_gc_actions_total",
			Help: "Garbage-collection actions by kind: addresses released or deleted (deleted_statefulset, " +
				"scaled_down_statefulset, leaked_pod, leaked_ip: deleted from the cloud), held or released for a running " +
				"pod without a wep (in_use_held, in_use_released), weps whose eniID was repaired (wep_eni_repaired).",
		}, []string{"kind"}),
		reconciled: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_ip_reconcile_total",
			Help: "Addresses whose cloud state was settled address by address, by outcome: confirmed (held, then " +
				"listed), gone (held or idle, then missing from two reads), adopted (listed twice, unknown to the " +
				"datastore, named by a wep), held_in_use (the same, used by a running pod without a wep), orphan (the " +
				"same, named by nothing: deleted after the leak grace), assigned_missing (a pod's address the cloud " +
				"does not list).",
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
			Name: "cce_ipam_leaked_ip_suspects",
			Help: "Addresses of served ENIs that no WorkloadEndpoint names and no running pod uses (assigned, or orphaned " +
				"cloud addresses), waiting out the leak grace period before their cloud delete.",
		}),
		leakOldest: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_leaked_ip_oldest_suspect_age_seconds", Help: "Age of the oldest leaked-IP suspect.",
		}),
		leakPastGrace: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_leaked_ip_suspects_past_grace",
			Help: "Leaked-IP suspects past the leak grace that the last GC pass could not delete (the cloud delete or " +
				"the check that no pod uses them failed, or the node is no longer ours to act for); retried each pass.",
		}),
		finishesPending: f.NewGauge(prometheus.GaugeOpts{Name: "cce_ipam_release_finishes_pending", Help: finishesPendingHelp}),
		heldInUse: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_ips_held_in_use",
			Help: "Addresses held out of the pool because a running pod uses them without a WorkloadEndpoint (as of the last GC pass).",
		}),
	}
}
