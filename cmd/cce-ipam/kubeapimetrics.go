package main

import (
	"context"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/metrics"
)

// kubeAPIMetrics are client-go's REST client metrics: every request to the
// API server, its answer, its retries, its latency and its wait in the
// client-side rate limiter. The API server's load is the product's main
// cost (ipamcore/ipam/REQUESTS.md budgets it per CNI call); these show it
// from the replica's side.
//
// client-go reports through process-wide hooks (k8s.io/client-go/tools/metrics)
// that metrics.Register sets once per process; so the collectors are built
// and hooked once (processKubeAPIMetrics), and each replica registers them in
// its own registry. The hooks do not say which client sent a request: the
// series cover all of a process's clients (main, lease, probe, watch,
// metadata); cce_ipam_kube_api_throttled_total keeps its per-client split.
//
// Labels stay bounded: verb is the HTTP method, code the HTTP status
// ("<error>" when no answer came); no URL, host or object name.
type kubeAPIMetrics struct {
	requests    *prometheus.CounterVec
	retries     *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	rateLimiter *prometheus.HistogramVec
}

func newKubeAPIMetrics() *kubeAPIMetrics {
	return &kubeAPIMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_kube_api_requests_total",
			Help: "API server requests of the process's client-go clients by verb (HTTP method) and code " +
				"(HTTP status, <error> without an answer); every attempt, retries included.",
		}, []string{"verb", "code"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_kube_api_retries_total",
			Help: "Retries of API server requests by client-go (after a 429 or a Retry-After): attempts after the first, " +
				"by verb and the code the retry got.",
		}, []string{"verb", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cce_ipam_kube_api_request_duration_seconds",
			Help: "Latency of API server requests (not watches) by verb, retries and rate-limiter waits included.",
			// 2 ms to ~33 s: a GET is milliseconds, a large LIST seconds.
			Buckets: prometheus.ExponentialBuckets(0.002, 2, 15),
		}, []string{"verb"}),
		rateLimiter: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cce_ipam_kube_api_rate_limiter_duration_seconds",
			Help: "Wait of API server requests in the client-side rate limiter (--kube-api-qps and the clients' own), by verb.",
			// 1 ms to ~16 s; most requests of a client without a limiter
			// are not observed at all.
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"verb"}),
	}
}

// processKubeAPIMetrics returns the process's client-go metrics, hooking
// them into client-go on the first call. ok is false when client-go's
// hooks were set by someone else first (metrics.Register is once per
// process), so that these collectors stay empty.
var processKubeAPIMetrics = sync.OnceValues(func() (*kubeAPIMetrics, bool) {
	m := newKubeAPIMetrics()
	hooks := metrics.RegisterOpts{
		RequestLatency:     latencyHook{m.latency},
		RateLimiterLatency: latencyHook{m.rateLimiter},
		RequestResult:      resultHook{m.requests},
		RequestRetry:       retryHook{m.retries},
	}
	metrics.Register(hooks)
	ok := metrics.RequestResult == hooks.RequestResult && metrics.RequestLatency == hooks.RequestLatency
	return m, ok
})

func (m *kubeAPIMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.retries, m.latency, m.rateLimiter}
}

type latencyHook struct{ h *prometheus.HistogramVec }

func (l latencyHook) Observe(_ context.Context, verb string, _ url.URL, d time.Duration) {
	l.h.WithLabelValues(verb).Observe(d.Seconds())
}

type resultHook struct{ c *prometheus.CounterVec }

func (r resultHook) Increment(_ context.Context, code, verb, _ string) {
	r.c.WithLabelValues(verb, code).Inc()
}

type retryHook struct{ c *prometheus.CounterVec }

func (r retryHook) IncrementRetry(_ context.Context, code, verb, _ string) {
	r.c.WithLabelValues(verb, code).Inc()
}
