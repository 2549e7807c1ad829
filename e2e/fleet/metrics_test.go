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
