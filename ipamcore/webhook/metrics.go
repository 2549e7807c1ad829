package webhook

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	admissionv1 "k8s.io/api/admission/v1"
)

// Results of an admission request, the result label.
const (
	resultAllowed    = "allowed"     // admitted unchanged
	resultPatched    = "patched"     // admitted with a patch
	resultDenied     = "denied"      // refused
	resultBadRequest = "bad_request" // not an AdmissionReview: HTTP 400
)

type metrics struct {
	requests  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	notAfter  *prometheus.GaugeVec
	writes    *prometheus.CounterVec
	caPatches prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_webhook_requests_total",
			Help: "Admission requests answered by this replica, by webhook and result (allowed, patched, denied, bad_request).",
		}, []string{"webhook", "result"}),
		duration: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cce_ipam_webhook_request_duration_seconds",
			Help:    "Time to answer an admission request, by webhook.",
			Buckets: []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10},
		}, []string{"webhook"}),
		notAfter: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cce_ipam_webhook_certificate_not_after_seconds",
			Help: "End of validity (Unix time) of the served certificate (cert=serving) and of the newest CA (cert=ca).",
		}, []string{"cert"}),
		writes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_webhook_secret_writes_total",
			Help: "Writes of the webhook Secret by this replica, by outcome (created, rotated, conflict, error).",
		}, []string{"outcome"}),
		caPatches: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_webhook_cabundle_patches_total",
			Help: "caBundle patches of the webhook configurations made by this replica.",
		}),
	}
}

func (m *metrics) observe(webhook, result string, start time.Time) {
	m.requests.WithLabelValues(webhook, result).Inc()
	m.duration.WithLabelValues(webhook).Observe(time.Since(start).Seconds())
}

func resultOf(resp *admissionv1.AdmissionResponse) string {
	switch {
	case !resp.Allowed:
		return resultDenied
	case len(resp.Patch) > 0:
		return resultPatched
	}
	return resultAllowed
}
