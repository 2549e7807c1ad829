package fleet

import (
	"math"
	"strings"
	"testing"
)

const exposition = `# HELP cce_ipam_allocations_total Allocations.
# TYPE cce_ipam_allocations_total counter
cce_ipam_allocations_total{result="ok"} 41
cce_ipam_allocations_total{result="error",reason="a \"quoted\", comma"} 2
cce_ipam_shard_members 3
lat_seconds_bucket{op="a",le="0.1"} 50
lat_seconds_bucket{op="a",le="0.2"} 90
lat_seconds_bucket{op="a",le="+Inf"} 100
lat_seconds_count{op="a"} 100 1700000000000
`

func TestParseText_SumAndQuantile(t *testing.T) {
	ss, err := ParseText(strings.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := ss.Sum("cce_ipam_allocations_total", nil); !ok || v != 43 {
		t.Errorf("sum = %v %v, want 43", v, ok)
	}
	if v, _ := ss.Sum("cce_ipam_allocations_total", map[string]string{"reason": `a "quoted", comma`}); v != 2 {
		t.Errorf("escaped label: %v, want 2", v)
	}
	if v, ok := ss.Sum("cce_ipam_shard_members", nil); !ok || v != 3 {
		t.Errorf("no labels: %v %v", v, ok)
	}
	if _, ok := ss.Sum("missing", nil); ok {
		t.Error("missing series reported present")
	}
	if v, _ := ss.Sum("lat_seconds_count", nil); v != 100 {
		t.Errorf("timestamped line: %v", v)
	}
	if q := ss.Quantile("lat_seconds", 0.5, nil); math.Abs(q-0.1) > 1e-9 {
		t.Errorf("p50 = %v, want 0.1", q)
	}
	if q := ss.Quantile("lat_seconds", 0.7, map[string]string{"op": "a"}); math.Abs(q-0.15) > 1e-9 {
		t.Errorf("p70 = %v, want 0.15", q)
	}
	if q := ss.Quantile("lat_seconds", 0.99, nil); q != 0.2 {
		t.Errorf("p99 in +Inf bucket = %v, want the highest finite bound 0.2", q)
	}
	if q := ss.Quantile("none", 0.5, nil); !math.IsNaN(q) {
		t.Errorf("empty histogram = %v, want NaN", q)
	}
}

func TestParseText_RejectsGarbage(t *testing.T) {
	for _, in := range []string{"name_without_value", `x{a="b} 1`, "x notanumber"} {
		if _, err := ParseText(strings.NewReader(in)); err == nil {
			t.Errorf("%q parsed", in)
		}
	}
}

// client_golang writes histograms and summaries under # TYPE lines; expfmt
// folds them into one metric each, and ParseText flattens them back into the
// series a dashboard queries.
const typedExposition = `# HELP rpc_seconds RPC latency.
# TYPE rpc_seconds histogram
rpc_seconds_bucket{method="add",le="0.1"} 50
rpc_seconds_bucket{method="add",le="0.2"} 90
rpc_seconds_bucket{method="add",le="+Inf"} 100
rpc_seconds_sum{method="add"} 12.5
rpc_seconds_count{method="add"} 100
rpc_seconds_bucket{method="del",le="0.1"} 10
rpc_seconds_bucket{method="del",le="0.2"} 10
rpc_seconds_bucket{method="del",le="+Inf"} 10
rpc_seconds_sum{method="del"} 0.5
rpc_seconds_count{method="del"} 10
# TYPE gc_seconds summary
gc_seconds{quantile="0.5"} 0.002
gc_seconds{quantile="0.99"} 0.03
gc_seconds_sum 1.5
gc_seconds_count 300
# TYPE up gauge
up 1
`

func TestParseText_TypedHistogramAndSummary(t *testing.T) {
	ss, err := ParseText(strings.NewReader(typedExposition))
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := ss.Sum("rpc_seconds_count", nil); v != 110 {
		t.Errorf("histogram count = %v, want 110", v)
	}
	if v, _ := ss.Sum("rpc_seconds_sum", map[string]string{"method": "add"}); v != 12.5 {
		t.Errorf("histogram sum = %v, want 12.5", v)
	}
	b := ss.Buckets("rpc_seconds", nil)
	if b[0.1] != 60 || b[0.2] != 100 || b[math.Inf(1)] != 110 {
		t.Errorf("buckets = %v, want 0.1:60 0.2:100 +Inf:110", b)
	}
	if q := ss.Quantile("rpc_seconds", 0.7, map[string]string{"method": "add"}); math.Abs(q-0.15) > 1e-9 {
		t.Errorf("p70 of add = %v, want 0.15", q)
	}
	if v, _ := ss.Sum("gc_seconds", map[string]string{"quantile": "0.99"}); v != 0.03 {
		t.Errorf("summary quantile = %v, want 0.03", v)
	}
	if v, _ := ss.Sum("gc_seconds_count", nil); v != 300 {
		t.Errorf("summary count = %v, want 300", v)
	}
	if v, ok := ss.Sum("up", nil); !ok || v != 1 {
		t.Errorf("gauge = %v %v, want 1", v, ok)
	}
}
