package kubeletsim

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The max gauge keeps the longest call per method, whatever the order.
func TestMetrics_MaxCallDuration(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry())
	for _, d := range []time.Duration{time.Second, 3 * time.Second, 2 * time.Second} {
		m.observeCall("AllocateIP", d)
	}
	m.observeCall("ReleaseIP", 500*time.Millisecond)
	if got := testutil.ToFloat64(m.maxDuration.WithLabelValues("AllocateIP")); got != 3 {
		t.Errorf("AllocateIP max = %v, want 3", got)
	}
	if got := testutil.ToFloat64(m.maxDuration.WithLabelValues("ReleaseIP")); got != 0.5 {
		t.Errorf("ReleaseIP max = %v, want 0.5", got)
	}
	if got := testutil.CollectAndCount(m.duration); got != 2 {
		t.Errorf("the histogram has %d series, want 2", got)
	}
}
