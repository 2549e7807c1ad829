package cloud

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metrics are the client's Prometheus collectors, registered on the
// registerer given to New (nil registers nowhere, for tests that do not care).
type metrics struct {
	calls     *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	wait      *prometheus.HistogramVec
	throttled *prometheus.CounterVec
	rate      prometheus.Gauge
	burst     prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		calls: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_cloud_api_calls_total",
			Help: "BCE API calls by operation and result (ok or the error class).",
		}, []string{"operation", "result"}),
		latency: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cce_ipam_cloud_api_duration_seconds",
			Help:    "Duration of one BCE API attempt, SDK retries included, by operation.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}, []string{"operation"}),
		wait: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cce_ipam_cloud_api_ratelimit_wait_seconds",
			Help:    "Time a BCE API call waited for a client-side rate-limit token, by operation.",
			Buckets: prometheus.ExponentialBuckets(0.001, 3, 10),
		}, []string{"operation"}),
		throttled: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_cloud_api_throttled_total",
			Help: "BCE API attempts answered with a RateLimit error, by operation.",
		}, []string{"operation"}),
		rate: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_cloud_api_ratelimit_rate",
			Help: "Current client-side BCE API rate limit in calls per second.",
		}),
		burst: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_cloud_api_ratelimit_burst",
			Help: "Current client-side BCE API burst size.",
		}),
	}
}
