package main

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"k8s.io/client-go/rest"
)

// throttleCounter counts the API server's 429 answers (API Priority and
// Fairness refusing to queue a request, or an overloaded server) per client.
// client-go already retries them after the server's Retry-After, up to 10
// times and within the request's context deadline (rest.withRetry), so a
// CNI call does not fail on one; the count shows how often it waited.
type throttleCounter struct {
	throttled *prometheus.CounterVec
}

func newThrottleCounter(reg prometheus.Registerer) *throttleCounter {
	return &throttleCounter{throttled: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Name: "cce_ipam_kube_api_throttled_total",
		Help: "API server responses 429 (Too Many Requests: API Priority and Fairness), by client; " +
			"client-go retries them after Retry-After.",
	}, []string{"client"})}
}

// wrap makes cfg's requests count their 429 answers under client.
func (c *throttleCounter) wrap(cfg *rest.Config, client string) {
	counter := c.throttled.WithLabelValues(client)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return throttleCountingTransport{next: rt, counter: counter}
	})
}

type throttleCountingTransport struct {
	next    http.RoundTripper
	counter prometheus.Counter
}

func (t throttleCountingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		t.counter.Inc()
	}
	return resp, err
}
