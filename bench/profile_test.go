package bench

import (
	"strings"
	"testing"
)

func TestCheckItemsRefusesUnknown(t *testing.T) {
	if err := CheckItems([]string{"latency", "scale"}); err != nil {
		t.Fatalf("known items refused: %v", err)
	}
	if err := CheckItems([]string{"latency", "memory"}); err == nil {
		t.Fatal(`unknown item "memory" accepted`)
	}
}

func TestConfigRunsOnlyTheChosenItems(t *testing.T) {
	all := Config{}
	for _, it := range items {
		if !all.runs(it) {
			t.Errorf("a full run skips %q", it)
		}
	}
	only := Config{Items: []string{"failover", "scale"}}
	want := map[string]bool{"latency": false, "failover": true, "budget": false, "scale": true}
	for it, w := range want {
		if got := only.runs(it); got != w {
			t.Errorf("runs(%q) with items failover,scale = %v, want %v", it, got, w)
		}
	}
}

// An interrupted run did not run the invariant checker: its report must not
// say the cluster was found clean.
func TestReport_InterruptedRunIsNotCalledClean(t *testing.T) {
	cfg := Config{Profile: Profiles["smoke"], OutDir: t.TempDir()}
	render := func(res *results) string {
		t.Helper()
		var b strings.Builder
		for _, s := range buildDoc(cfg, res, func(f string) string { return f }).Sections {
			b.WriteString(strings.Join(s.Paragraphs, "\n"))
			for _, tb := range s.Tables {
				for _, r := range tb.Rows {
					b.WriteString(strings.Join(r, "|") + "\n")
				}
			}
		}
		return b.String()
	}
	if got := render(&results{unchecked: true}); !strings.Contains(got, "not checked (interrupted)") || strings.Contains(got, "found the settled cluster clean") {
		t.Fatalf("interrupted run's report:\n%s", got)
	}
	if got := render(&results{}); !strings.Contains(got, "found the settled cluster clean") {
		t.Fatalf("checked run's report:\n%s", got)
	}
}
