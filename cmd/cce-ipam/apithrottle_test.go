package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// A 429 with Retry-After is counted, and the request still succeeds: the
// counter sits under client-go's retry, which sees the 429 and tries again.
// (A narrow unit test of the transport; the IPAM's integration test
// TestIPAM_Requests_ThrottledWritesRetriedNotFailed covers the CNI path.)
func TestThrottleCounter_CountsRetried429s(t *testing.T) {
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
	reg := prometheus.NewRegistry()
	c := newThrottleCounter(reg)
	cfg := &rest.Config{Host: srv.URL, QPS: clientQPS(0)}
	c.wrap(cfg, "main")
	if _, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Namespaces().Get(context.Background(), "x", metav1.GetOptions{}); err != nil {
		t.Fatalf("the request failed after a 429: %v", err)
	}
	var m dto.Metric
	if err := c.throttled.WithLabelValues("main").Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 1 {
		t.Errorf("cce_ipam_kube_api_throttled_total{client=main} = %v, want 1", got)
	}
	if calls.Load() != 2 {
		t.Errorf("%d requests reached the server, want 2 (one retry)", calls.Load())
	}
}

// clientQPS turns "no limit" (0 or negative) into client-go's QPS < 0, which
// builds no limiter; 0 itself would mean client-go's default of 5/s.
func TestClientQPS(t *testing.T) {
	for in, want := range map[float32]float32{0: -1, -3: -1, 50: 50} {
		if got := clientQPS(in); got != want {
			t.Errorf("clientQPS(%v) = %v, want %v", in, got, want)
		}
	}
}
