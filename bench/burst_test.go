package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/cce-ipam/sharded/cloud"
)

// The floor adds the batches beyond the owner's burst at its rate, one
// attach when new ENIs are needed, and the wep creates: all of the burst's
// when no call waits, the last batch's share when calls wait (the others'
// overlap the wait).
func TestBurstFloor(t *testing.T) {
	// 30 pods, 25 idle: 5 to add in 1 batch, within the burst: no wait;
	// all 30 creates at once, 100 ms.
	r := burstRun{pods: 30, idleAt0: 25, enisAt0: 100, share: 2, shareB: 1, apiFloor: 100 * time.Millisecond}
	got, note := burstFloor(r, 10, 39, 50*time.Millisecond)
	if got != 100*time.Millisecond {
		t.Errorf("floor = %v, want 100ms (%s)", got, note)
	}
	// 30 pods, 4 idle: 26 to add in 3 batches of 10; plenty of free slots;
	// share 2/s with a burst of 1: 2 calls wait 1 s; then the last 10 of
	// the 30 creates (100 ms all at once): 33 ms.
	r = burstRun{pods: 30, idleAt0: 4, enisAt0: 100, share: 2, shareB: 1, apiFloor: 100 * time.Millisecond}
	got, note = burstFloor(r, 10, 39, 50*time.Millisecond)
	if want := time.Second + 100*time.Millisecond/3; got != want {
		t.Errorf("floor = %v, want %v (%s)", got, want, note)
	}
	// 100 pods, 10 idle, 5 free slots: 90 to add; 5 fill the slots in 1
	// batch, 85 come with 3 new ENIs of 39 (6 calls): 7 calls; share 2/s
	// with a burst of 1: 6 wait 3 s; one attach of 50 ms; the last 10 of
	// 100 creates (300 ms): 30 ms.
	r = burstRun{pods: 100, idleAt0: 10, enisAt0: 5, share: 2, shareB: 1, apiFloor: 300 * time.Millisecond}
	got, note = burstFloor(r, 10, 39, 50*time.Millisecond)
	if got != 3080*time.Millisecond {
		t.Errorf("floor = %v, want 3.08s (%s)", got, note)
	}
	if !strings.Contains(note, "3 new ENI(s)") || !strings.Contains(note, "7 BCE calls") {
		t.Errorf("note: %s", note)
	}
	// 100 pods, 9 idle, 61 free slots: 91 to add; 61 fill the slots in 7
	// batches, 30 come with 1 new ENI; the owner holds a third of the
	// upstream's per-operation limits (BatchAddPrivateIP 5/s, burst 10 →
	// 1.67/s, burst 3): 4 batches wait 2.4 s, more than the 9 calls at the
	// budget share of 5/s with a burst of 5 (0.8 s); attach 50 ms; the last
	// 10 of 100 creates: 30 ms.
	r = burstRun{pods: 100, idleAt0: 9, enisAt0: 61, share: 5, shareB: 5, apiFloor: 300 * time.Millisecond,
		opShare: 1.0 / 3, opLimits: cloud.DefaultOpLimits()}
	got, note = burstFloor(r, 10, 39, 50*time.Millisecond)
	if got != 2480*time.Millisecond {
		t.Errorf("floor with a third of the operation limits = %v, want 2.48s (%s)", got, note)
	}
	if !strings.Contains(note, "7 BatchAddPrivateIP calls at the owner's share of its limit, 1.67/s with a burst of 3") {
		t.Errorf("note: %s", note)
	}
}

// tableRows renders every table row of the report on res (smoke profile),
// cells joined by "|", a row per line.
func tableRows(t *testing.T, res *results) string {
	t.Helper()
	cfg := Config{Profile: Profiles["smoke"], OutDir: t.TempDir()}
	var b strings.Builder
	for _, s := range buildDoc(cfg, res, func(f string) string { return cfg.OutDir + "/" + f }).Sections {
		for _, tb := range s.Tables {
			for _, r := range tb.Rows {
				b.WriteString(strings.Join(r, "|") + "\n")
			}
		}
	}
	return b.String()
}

// Item 10's rows and verdicts: a burst that missed a pod is missed whatever
// its time; one within its target is met.
func TestReport_BurstVerdicts(t *testing.T) {
	ok := burstRun{name: "a. pool at its minimum", pods: 2, took: ms(100, 300), all: 300 * time.Millisecond,
		floor: 250 * time.Millisecond, target: 375 * time.Millisecond, targetText: "≤ 1.5× floor"}
	lost := burstRun{name: "b. first ENI full", pods: 3, took: ms(100, 200), all: time.Second,
		floor: 900 * time.Millisecond, target: 2 * time.Second, targetText: "≤ attach (50ms) + 2 s"}
	got := tableRows(t, &results{burst: &burstResult{runs: []burstRun{ok, lost}}})
	for _, want := range []string{
		"10a. pool at its minimum, 2 pods: until every pod has its IP|≤ 1.5× floor|0.3 s (floor 0.25 s, 1.2×)|met",
		"10b. first ENI full, 3 pods: until every pod has its IP|≤ attach (50ms) + 2 s|1 s (floor 0.9 s, 1.11×)|missed: 2 of 3 pods got an IP",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
}

// Item 1 with 3 replicas: the #25 line holds p99 to 1.5× the floor, and the
// hop table splits calls by where they entered.
func TestReport_LatencyHopAndRaisedTarget(t *testing.T) {
	run := func(name string, d int) *latRun {
		return &latRun{name: name, repeats: [][]time.Duration{ms(d)}, rates: []float64{100}}
	}
	res := &results{latency: &latencyResult{
		floor1: run("floor, 1-replica phase", 10), ours1: run("1 replica", 12),
		floor3: run("floor, 3-replica phase", 10), ours3: run("3 replicas", 17),
		direct: ms(10, 10, 12), forwarded: ms(15, 15, 20),
	}}
	got := tableRows(t, res)
	for _, want := range []string{
		"1. p99 warm ADD, 3 replicas|≤ 2× floor|1.7× floor|met",
		"1. p99 warm ADD, 3 replicas, forwarded hop included (#25)|≤ 1.5× floor|1.7× floor|missed by 0.2×",
		"the node's owner (no hop)|3|10|",
		"another replica (forwarded)|3|15|",
		"the hop's cost (forwarded − direct)||5|",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
}
