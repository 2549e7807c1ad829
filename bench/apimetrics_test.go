package bench

import (
	"strings"
	"testing"
)

const apiserverMetrics = `# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="cce.io",resource="workloadendpoints",scope="resource",subresource="",verb="POST",version="v1alpha1"} 7
apiserver_request_total{code="409",component="apiserver",dry_run="",group="cce.io",resource="workloadendpoints",scope="resource",subresource="",verb="POST",version="v1alpha1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PUT",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 4
# HELP apiserver_request_duration_seconds x
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_bucket{verb="POST",le="+Inf"} 9
apiserver_request_duration_seconds_sum{verb="POST"} 1
apiserver_request_duration_seconds_count{verb="POST"} 9
`

func TestParseRequestCounts_SumsByVerbAndResource(t *testing.T) {
	got, err := parseRequestCounts(strings.NewReader(apiserverMetrics))
	if err != nil {
		t.Fatal(err)
	}
	want := reqCounts{
		{verb: "POST", resource: "workloadendpoints"}: 9,
		{verb: "PUT", resource: "pods/status"}:        3,
		{verb: "LIST", resource: "pods"}:              4,
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	before := reqCounts{{verb: "POST", resource: "workloadendpoints"}: 5, {verb: "GET", resource: "leases"}: 1}
	d := got.minus(before)
	if d[reqKey{verb: "POST", resource: "workloadendpoints"}] != 4 || d[reqKey{verb: "GET", resource: "leases"}] != -1 {
		t.Errorf("minus: %v", d)
	}
	if w := got.total(reqKey.isWrite); w != 12 {
		t.Errorf("writes = %v, want 12", w)
	}
}

func TestParseRequestCounts_RefusesBadText(t *testing.T) {
	for _, in := range []string{
		"apiserver_request_total{verb=\"GET\"} notanumber\n",
		"apiserver_request_total{verb=\"GET\" 1\n",
		"apiserver_request_total{verb=\"GET\"} NaN\n",
	} {
		if _, err := parseRequestCounts(strings.NewReader(in)); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
	got, err := parseRequestCounts(strings.NewReader("up 1\n"))
	if err != nil || len(got) != 0 {
		t.Errorf("text without the metric: %v, %v", got, err)
	}
}

// The parser reads the API server's text: arbitrary input gives counts or an
// error, never a panic, and the counts add up to the metric's samples.
func FuzzParseRequestCounts(f *testing.F) {
	f.Add(apiserverMetrics)
	f.Add("apiserver_request_total 1\n")
	f.Add("# TYPE apiserver_request_total counter\napiserver_request_total{verb=\"GET\",resource=\"pods\",subresource=\"log\"} 2e3\n")
	f.Fuzz(func(t *testing.T, in string) {
		got, err := parseRequestCounts(strings.NewReader(in))
		if err != nil {
			return
		}
		for k, v := range got {
			if v != v {
				t.Fatalf("%s: NaN count", k)
			}
		}
	})
}
