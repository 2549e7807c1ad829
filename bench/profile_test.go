package bench

import (
	"math"
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

// Item 2: a block of repeats per lease configuration, the #25 verdicts of
// each (within 5 s of the kill, within 1.5× memberlist's detection), and
// the renewals' table.
func TestReport_FailoverPerLeaseConfig(t *testing.T) {
	lcs := leaseConfigs()
	rep := func(lc leaseConfig, detect time.Duration, recovered ...time.Duration) failoverRepeat {
		return failoverRepeat{config: lc.name(), victimNodes: 11, detectFirst: detect, recovered: recovered}
	}
	res := &results{failover: &failoverResult{
		repeats: []failoverRepeat{
			rep(lcs[0], 5500*time.Millisecond, 7*time.Second, 9*time.Second),
			rep(lcs[0], 5600*time.Millisecond, 8*time.Second),
			rep(lcs[1], 5500*time.Millisecond, 3*time.Second, 4500*time.Millisecond),
			rep(lcs[1], 5*time.Second, 4*time.Second),
		},
		renewals: []renewals{
			{config: lcs[0].name(), total: 300, slow: 0, max: 0.25, margin: lcs[0].margin()},
			{config: lcs[1].name(), total: 600, slow: 2, max: math.Inf(1), margin: lcs[1].margin()},
		},
	}}
	got := tableRows(t, res)
	for _, want := range []string{
		lcs[0].name() + "|1|11|5.5|9|1.64×|7|0",
		lcs[0].name() + "|**max**||5.6|9|1.61×||",
		lcs[1].name() + "|**max**||5.5|4.5|0.82×||",
		"2. failover within 5 s of the kill (#25), max over repeats, " + lcs[0].name() + "|≤ 5 s|9 s (p50 8 s)|missed by 4 s",
		"2. failover within 5 s of the kill (#25), max over repeats, " + lcs[1].name() + "|≤ 5 s|4.5 s (p50 4 s)|met",
		"2. failover / memberlist's detection (#25), max over repeats, " + lcs[1].name() + "|≤ 1.5×|0.82×|met",
		"2. failover (max over repeats), defaults|≤ 10 s|9 s (p50 8 s)|met",
		"2. failover / memberlist's detection (#25), max over repeats, " + lcs[0].name() + "|≤ 1.5×|1.64×|missed by 0.14×",
		lcs[0].name() + "|300|0|3s|≤ 0.25 s",
		lcs[1].name() + "|600|2|1.5s|> 4 s",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
}

// Items 4 to 6 with another replica count than 3 (issue #25 item 6: 5
// replicas): the rows name N, the memory ratio is reported without the
// 3-replica target, the settled writes' floor counts N Leases, and each
// replica's settled CPU is listed.
func TestReport_ScaleWithFiveReplicas(t *testing.T) {
	start := func(replicas int, cpu ...float64) coldStart {
		c := coldStart{replicas: replicas, took: 30 * time.Second, total: 10, calls: map[bcesim.Op]int64{bcesim.OpListENIs: 10},
			peakRSS: []float64{100 << 20}, heapInuse: []float64{50 << 20}, anonRSS: []float64{80 << 20}, owned: []float64{10},
			settledWrites: map[string]float64{"PUT": float64(replicas) + 0.5}, settledCPU: cpu}
		if replicas == 5 {
			c.peakRSS, c.heapInuse = []float64{40 << 20, 30 << 20}, []float64{10 << 20, 5 << 20}
		}
		return c
	}
	res := &results{scales: []*scaleResult{{scale: Scale{Nodes: 5000, PodsPerNode: 30, Replicas: 5}, nodes: 5000, pods: 150000,
		enis: 5000, cold: []coldStart{start(5, 0.01, 0.03, 0.02), start(1, 0.05)}}}}
	got := tableRows(t, res)
	for _, want := range []string{
		"4. memory per replica at 5 (peak RSS; heap in use), 5000 nodes / 150000 pods, N = 5|(reported)|40 %; 20 % of 1 replica (40 MiB; 10 MiB)|—",
		"5. API writes/s of a settled cluster, 5 replicas, 5000 nodes / 150000 pods, N = 5|≤ 5.5 (the Leases' renewals)|5.5 (put 5.5)|met",
		"6. cold start of 5 replicas, 5000 nodes / 150000 pods, N = 5|(reported)|",
		"|0.03 / 0.02 / 0.01|0.05",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "memory per replica at 3") {
		t.Errorf("a 5-replica scale is judged against the 3-replica target:\n%s", got)
	}
}
