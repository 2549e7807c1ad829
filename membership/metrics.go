package membership

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

type metrics struct {
	members      prometheus.Gauge
	events       *prometheus.CounterVec
	queue        prometheus.Gauge
	joinAttempts prometheus.Counter
	joinFailures prometheus.Counter
	metaRejected prometheus.Counter
}

// newMetrics registers the membership metrics on reg; a nil reg keeps them
// unregistered (promauto.With(nil)).
func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		members: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_membership_members",
			Help: "Live gossip members this replica sees, itself included.",
		}),
		events: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_membership_events_total",
			Help: "Membership changes delivered to the consumer, by type (join, update, leave, fail).",
		}, []string{"type"}),
		queue: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_membership_event_queue_length",
			Help: "Membership changes waiting for the consumer.",
		}),
		joinAttempts: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_membership_join_attempts_total",
			Help: "Attempts to join a seed or DNS address that was not a live member.",
		}),
		joinFailures: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_membership_join_failures_total",
			Help: "Join attempts that failed (address unreachable, refused, wrong key or label, or DNS failure).",
		}),
		metaRejected: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_membership_meta_rejected_total",
			Help: "Alive messages ignored because the peer's meta is not a valid replica meta.",
		}),
	}
	for _, t := range []string{"join", "update", "leave", "fail"} {
		m.events.WithLabelValues(t)
	}
	return m
}

type leaderMetrics struct {
	isLeader    prometheus.Gauge
	transitions prometheus.Counter
}

func newLeaderMetrics(reg prometheus.Registerer) *leaderMetrics {
	f := promauto.With(reg)
	return &leaderMetrics{
		isLeader: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_membership_is_leader",
			Help: "1 while this replica holds the leader Lease, else 0.",
		}),
		transitions: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_membership_leader_transitions_total",
			Help: "Times this replica started leading.",
		}),
	}
}
