package spread

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Controller names, the "controller" label of the metrics.
const (
	controllerStatus = "psts-status"
	controllerTable  = "pstt"
)

type metrics struct {
	reconciles   *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	statusWrites *prometheus.CounterVec
	spreadWrites *prometheus.CounterVec
	refused      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		reconciles: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_spread_reconciles_total",
			Help: "Reconciles of the PodSubnetTopologySpread controllers, by controller and result (ok, error).",
		}, []string{"controller", "result"}),
		duration: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cce_ipam_spread_reconcile_duration_seconds",
			Help:    "Time one reconcile of a PodSubnetTopologySpread controller took, API writes included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 8),
		}, []string{"controller"}),
		statusWrites: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_spread_status_writes_total",
			Help: "Statuses written (only those that changed), by controller.",
		}, []string{"controller"}),
		spreadWrites: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_spread_table_psts_writes_total",
			Help: "PodSubnetTopologySpreads the table controller created, updated (a drifted spec) or deleted (no longer listed).",
		}, []string{"op"}),
		refused: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_spread_table_refused_entries_total",
			Help: "Table entries newly refused: a PodSubnetTopologySpread of another owner (foreign), " +
				"or an invalid or repeated name (invalid).",
		}, []string{"reason"}),
	}
}

func (m *metrics) observe(controller string, err error, took time.Duration) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.reconciles.WithLabelValues(controller, result).Inc()
	m.duration.WithLabelValues(controller).Observe(took.Seconds())
}
