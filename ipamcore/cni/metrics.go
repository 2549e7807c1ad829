package cni

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

const (
	methodAllocate = "AllocateIP"
	methodRelease  = "ReleaseIP"
	methodCheck    = "CheckIP"

	resultOK      = "ok"
	resultError   = "error"
	resultBusy    = "busy"
	resultInvalid = "invalid"
)

type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	inflight *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_cni_requests_total",
			Help: "CNI gRPC calls by method and result (ok, error, busy, invalid).",
		}, []string{"method", "result"}),
		latency: f.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cce_ipam_cni_request_duration_seconds",
			Help: "Latency of CNI gRPC calls by method and result.",
			// 1 ms to ~33 s: a warm-pool hit is milliseconds, a cloud
			// call hundreds of milliseconds, the deadline 30 s.
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"method", "result"}),
		inflight: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cce_ipam_cni_requests_in_flight",
			Help: "CNI gRPC calls being served, by method.",
		}, []string{"method"}),
	}
}

func (m *metrics) observe(method, result string, start time.Time) {
	m.requests.WithLabelValues(method, result).Inc()
	m.latency.WithLabelValues(method, result).Observe(time.Since(start).Seconds())
}
