package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
)

// The main client's wep create, refused once because the API server could
// not configure the fencing policy's binding, is sent again, succeeds, and
// the retry is counted under client="main". (A narrow unit test of the
// wiring; TestFencingPolicy_UnconfiguredRefusalRetried in e2e/cluster has a
// real API server refuse.)
func TestAdmissionRetries_CountsTheRetriedWrite(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"workloadendpoints.cce.io \"p\" `+
				`is forbidden: ValidatingAdmissionPolicy 'f' with binding 'f-7' denied request: failed to configure binding: `+
				`context deadline exceeded","reason":"Invalid","code":422}`)
			return
		}
		_, _ = io.WriteString(w, `{"kind":"WorkloadEndpoint","apiVersion":"cce.io/v1alpha1","metadata":{"name":"p","namespace":"ns"}}`)
	}))
	t.Cleanup(srv.Close)
	reg := prometheus.NewRegistry()
	a := newAdmissionRetries(reg, slog.New(slog.DiscardHandler))
	cfg := &rest.Config{Host: srv.URL, QPS: clientQPS(0)}
	a.wrap(cfg, "main")
	value := func() float64 {
		var m dto.Metric
		if err := a.retried.WithLabelValues("main").Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	if v := value(); v != 0 {
		t.Fatalf("cce_ipam_kube_api_admission_retries_total{client=main} = %v before any call, want 0", v)
	}
	wep := &cce.WorkloadEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}
	if _, err := cceclient.NewForConfigOrDie(cfg).CceV1alpha1().WorkloadEndpoints("ns").Create(context.Background(), wep, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the create failed after one unconfigured refusal: %v", err)
	}
	if v, n := value(), calls.Load(); v != 1 || n != 2 {
		t.Fatalf("counted %v retries over %d requests, want 1 over 2", v, n)
	}
}
