package bench

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cce-ipam/sharded/cloud/bcesim"
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
	want := map[string]bool{"latency": false, "psts": false, "failover": true, "budget": false, "scale": true}
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

// A cold start that went wrong shows in the report: with two starts the
// median is the lower one, so every start is listed and the slowest named.
func TestReport_ColdStartListsEveryStart(t *testing.T) {
	cfg := Config{Profile: Profiles["smoke"], OutDir: t.TempDir()}
	start := func(replicas int, took time.Duration, calls int64) coldStart {
		return coldStart{replicas: replicas, took: took, total: calls, calls: map[bcesim.Op]int64{bcesim.OpListENIs: calls},
			peakRSS: []float64{100}, heapInuse: []float64{50}, anonRSS: []float64{80}, owned: []float64{10}}
	}
	res := &results{scales: []*scaleResult{{nodes: 10, pods: 100, enis: 10, cold: []coldStart{
		start(3, 39300*time.Millisecond, 56), start(1, 16*time.Second, 6),
		start(3, 161100*time.Millisecond, 206), start(1, 21*time.Second, 8),
	}}}}
	res.idle = &idleReplica{peakRSS: 40 << 20, anonRSS: 20 << 20, heapInuse: 10 << 20, after: 10 * time.Second}
	cold := res.scales[0].cold
	cold[0].settledWrites = map[string]float64{"PUT": 3, "POST": 1.1}
	cold[1].settledWrites = map[string]float64{"PUT": 1}
	cold[2].settledWrites = map[string]float64{"PUT": 6}
	cold[3].settledWrites = map[string]float64{"PUT": 1}
	var b strings.Builder
	for _, s := range buildDoc(cfg, res, func(f string) string { return f }).Sections {
		for _, tb := range s.Tables {
			for _, r := range tb.Rows {
				b.WriteString(strings.Join(r, "|") + "\n")
			}
		}
	}
	got := b.String()
	for _, want := range []string{"39.3 (39.3, 161.1)", "56 (56, 206)", "slowest of 2: 161.1 s, 206 calls",
		// Settled writes: the starts' median, each start, the first by verb;
		// above 3.5/s (3 replicas' and the leader's renewals) is a miss.
		"5. API writes/s of a settled cluster, 3 replicas, 10 nodes / 100 pods|≤ 3.5 (the Leases' renewals)|4.1 (post 1.1, put 3)|missed by 0.6/s",
		"|4.1 (4.1, 6) (post 1.1, put 3)|1 (1, 1) (put 1)",
		// The idle replica: its own row and summary line.
		"idle replica, no node (10s after ready)|40 MiB|—|—|10 MiB|—|—|20 MiB|—|—|0",
		"4. fixed cost of an idle replica (no node)|(reported)|peak RSS 40 MiB, heap in use 10 MiB, anonymous RSS 20 MiB|—"} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
}

// Item 7's section: the three kinds in one table with their ratios to the
// warm ADD, and one summary row per PSTS kind.
func TestReport_PSTSRowsAreRatiosToWarm(t *testing.T) {
	cfg := Config{Profile: Profiles["smoke"], OutDir: t.TempDir()}
	run := func(name string, ms ...int) *latRun {
		var ds []time.Duration
		for _, m := range ms {
			ds = append(ds, time.Duration(m)*time.Millisecond)
		}
		return &latRun{name: name, repeats: [][]time.Duration{ds}, rates: []float64{100}}
	}
	res := &results{psts: &pstsResult{warm: run("ordinary, warm pool", 10, 10, 10), elastic: run("PSTS Elastic", 20, 20, 20),
		fixed: run("PSTS Fixed", 40, 40, 40), replicas: 3}}
	var b strings.Builder
	for _, s := range buildDoc(cfg, res, func(f string) string { return filepath.Join(cfg.OutDir, f) }).Sections {
		for _, tb := range s.Tables {
			for _, r := range tb.Rows {
				b.WriteString(strings.Join(r, "|") + "\n")
			}
		}
	}
	got := b.String()
	for _, want := range []string{"PSTS Elastic|3|20|2×|20|2×", "PSTS Fixed|3|40|4×|40|4×",
		"7. p99 ADD, PSTS Fixed|(reported)|4× warm ADD (40 ms)"} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
}
