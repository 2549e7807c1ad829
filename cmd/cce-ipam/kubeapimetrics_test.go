package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// client-go's hooks feed the process's collectors: a GET answered 429 then
// 200 counts both attempts, one retry (the second attempt, by its code) and
// one latency; a client with a limiter observes its wait. Registering the
// collectors in two registries (two replicas' in one process) works. A
// narrow unit test of the hooks; TestReplicas_CNIMetricsCountEachCallOnce
// covers the process.
func TestKubeAPIMetrics_HookClientGo(t *testing.T) {
	m, hooked := processKubeAPIMetrics()
	if !hooked {
		t.Fatal("client-go's metrics hooks are not ours")
	}
	for range 2 {
		prometheus.NewRegistry().MustRegister(m.collectors()...)
	}
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"x"}}`))
	}))
	t.Cleanup(srv.Close)

	count := func() (ok, throttled, retried, latencies, waits float64) {
		return testutil.ToFloat64(m.requests.WithLabelValues("GET", "200")),
			testutil.ToFloat64(m.requests.WithLabelValues("GET", "429")),
			testutil.ToFloat64(m.retries.WithLabelValues("GET", "200")),
			histogramCount(t, m.latency, "GET"),
			histogramCount(t, m.rateLimiter, "GET")
	}
	ok0, thr0, ret0, lat0, wait0 := count()
	cfg := &rest.Config{Host: srv.URL, QPS: 100, Burst: 10}
	if _, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Namespaces().Get(context.Background(), "x", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	ok1, thr1, ret1, lat1, wait1 := count()
	for _, c := range []struct {
		name       string
		got, wantD float64
	}{
		{`cce_ipam_kube_api_requests_total{verb="GET",code="200"}`, ok1 - ok0, 1},
		{`cce_ipam_kube_api_requests_total{verb="GET",code="429"}`, thr1 - thr0, 1},
		{`cce_ipam_kube_api_retries_total{verb="GET",code="200"}`, ret1 - ret0, 1},
		{`cce_ipam_kube_api_request_duration_seconds_count{verb="GET"}`, lat1 - lat0, 1},
	} {
		if c.got != c.wantD {
			t.Errorf("%s grew by %v, want %v", c.name, c.got, c.wantD)
		}
	}
	if wait1-wait0 < 1 {
		t.Errorf("cce_ipam_kube_api_rate_limiter_duration_seconds_count{verb=\"GET\"} grew by %v, want ≥ 1 (a client with a limiter)", wait1-wait0)
	}
}

// histogramCount is the observation count of h's series for verb.
func histogramCount(t *testing.T, h *prometheus.HistogramVec, verb string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(h)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "verb" && l.GetValue() == verb {
					return float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
	}
	return 0
}
