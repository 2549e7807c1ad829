package cni

import (
	"context"
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

// The hop label of the request metrics. A call a replica forwards to the
// node's owner passes this service twice, once per replica: the entry hop
// is the call a CNI plugin made (count these for calls and their latency),
// the forwarded hop the owner's share of it (count these for the owner's
// load). Without the label every forwarded call was counted twice.
const (
	HopEntry     = "entry"
	HopForwarded = "forwarded"
)

type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	inflight *prometheus.GaugeVec
	waiting  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_cni_requests_total",
			Help: "CNI gRPC calls by method, result (ok, error, busy, invalid) and hop (entry: from a CNI plugin, " +
				"counted once per call; forwarded: served here for the replica that received it).",
		}, []string{"method", "result", "hop"}),
		latency: f.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cce_ipam_cni_request_duration_seconds",
			Help: "Latency of CNI gRPC calls by method, result and hop (entry: as the CNI plugin waited, forwarding included).",
			// 1 ms to ~33 s: a warm-pool hit is milliseconds, a cloud
			// call hundreds of milliseconds, the deadline 30 s.
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"method", "result", "hop"}),
		inflight: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cce_ipam_cni_requests_in_flight",
			Help: "CNI gRPC calls being served, by method and hop.",
		}, []string{"method", "hop"}),
		waiting: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_cni_requests_waiting",
			Help: "CNI calls from CNI plugins waiting for a slot at the concurrency limit (--cni-slot-wait).",
		}),
	}
}

func (m *metrics) observe(method, result, hop string, start time.Time) {
	m.requests.WithLabelValues(method, result, hop).Inc()
	m.latency.WithLabelValues(method, result, hop).Observe(time.Since(start).Seconds())
}

// hop names the hop of a call: forwarded when the server's forwarded func
// (WithForwarded) says so.
func (s *Server) hop(ctx context.Context) string {
	if s.forwarded != nil && s.forwarded(ctx) {
		return HopForwarded
	}
	return HopEntry
}
