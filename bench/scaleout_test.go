package bench

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseStatCPU_CountsFromTheLastParenthesis(t *testing.T) {
	// A command name with a space and a ')' in it: fields are counted from
	// the last ')'. utime 1500, stime 250.
	line := "4242 (cce ipam) x) S 1 4242 4242 0 -1 4194560 9000 0 0 0 1500 250 0 0 20 0 12 0 100 0 0"
	got, err := parseStatCPU(line)
	if err != nil || got != 1750 {
		t.Fatalf("parseStatCPU = %v, %v; want 1750", got, err)
	}
	for _, bad := range []string{"", "4242 cce", "4242 (x) S 1 2", "4242 (x) S 1 2 3 4 5 6 7 8 9 u s"} {
		if _, err := parseStatCPU(bad); err == nil {
			t.Errorf("parseStatCPU(%q) did not fail", bad)
		}
	}
}

func TestParseProcStat_BusyIsAllButIdleAndIOWait(t *testing.T) {
	s := "cpu  100 10 50 800 40 5 5 0 30 0\ncpu0 50 5 25 400 20 2 3 0 0 0\ncpu1 50 5 25 400 20 3 2 0 0 0\nintr 1 2\n"
	got, err := parseProcStat(s)
	if err != nil {
		t.Fatal(err)
	}
	// user+nice+system+irq+softirq+steal = 170; +idle+iowait = 1010; guest
	// (30, in user already) not added again.
	if got.busy != 170 || got.total != 1010 || got.cores != 2 {
		t.Errorf("parseProcStat = %+v, want busy 170, total 1010, cores 2", got)
	}
	if _, err := parseProcStat("intr 1 2\n"); err == nil {
		t.Error("no cpu line: no error")
	}
}

// The closed-loop rate reads the gaps between starts once every worker is
// busy: a slow drain does not lower it.
func TestClosedLoopRate_IgnoresFillAndDrain(t *testing.T) {
	p := phase{starts: ms(0, 0, 0, 0, 10, 20, 30, 40, 50), took: ms(1, 1, 1, 1, 1, 1, 1, 1, 1), elapsed: 500 * time.Millisecond}
	if got := closedLoopRate(p, 4); math.Abs(got-100) > 1e-9 {
		t.Errorf("closedLoopRate = %v, want 100/s (4 gaps of 10 ms)", got)
	}
	few := phase{starts: ms(0, 0), took: ms(1, 1), elapsed: 100 * time.Millisecond}
	if got := closedLoopRate(few, 4); math.Abs(got-20) > 1e-9 {
		t.Errorf("closedLoopRate with fewer calls than workers = %v, want 20/s (calls over the phase)", got)
	}
}

// Item 9's verdict holds the target below saturation only: a shortfall at a
// saturated N is reported, not failed; one below it fails.
func TestReport_ScaleOutVerdict(t *testing.T) {
	run := func(n int, add, busy float64) scaleOutRun {
		return scaleOutRun{replicas: n, addRates: []float64{add}, delRates: []float64{add / 2}, busy: busy, machineCores: 2,
			add: phase{took: ms(5, 10, 20)}, cpu: map[string]float64{"r0": 0.25, "kube-apiserver": 0.8}}
	}
	verdict := func(runs ...scaleOutRun) string {
		cfg := Config{Profile: Profiles["smoke"], OutDir: t.TempDir()}
		res := &results{scaleOut: &scaleOutResult{cgroup: "test", quotas: []scaleOutQuota{{cpus: 0.25, runs: runs}}}}
		for _, s := range buildDoc(cfg, res, func(f string) string { return cfg.OutDir + "/" + f }).Sections {
			for _, tb := range s.Tables {
				for _, r := range tb.Rows {
					if strings.HasPrefix(r[0], "9. scale-out") {
						return strings.Join(r[1:], "|")
					}
				}
			}
		}
		return ""
	}
	if got, want := verdict(run(1, 100, 0.5), run(2, 190, 1.0), run(3, 200, 1.9)),
		"≥ 0.8× until saturation|N=2: 0.95×, N=3: 0.67× (saturated: 1.9 of 2 cores busy)|met"; got != want {
		t.Errorf("saturated at 3:\n got %s\nwant %s", got, want)
	}
	if got, want := verdict(run(1, 100, 0.5), run(2, 150, 1.0)), "≥ 0.8× until saturation|N=2: 0.75×|missed at N=2 by 0.05×"; got != want {
		t.Errorf("short of the target at 2:\n got %s\nwant %s", got, want)
	}
	if got := verdict(run(1, 100, 1.5), run(2, 110, 1.95)); !strings.HasSuffix(got, "not measured below saturation: the machine was saturated from N=2") {
		t.Errorf("saturated from 2: %s", got)
	}
	if got := verdict(run(1, 100, 1.9), run(2, 110, 1.95)); !strings.HasSuffix(got, "not measured below saturation: the machine was saturated with 1 replica") {
		t.Errorf("saturated at 1: %s", got)
	}
}

func TestScaleOutRun_ReplicaCPUPerPair(t *testing.T) {
	// Two replicas at 0.5 CPU each for 2 s of waves, 1,000 pairs: 2 ms a
	// pair; the API server's CPU is not the replicas'.
	r := scaleOutRun{pairs: 1000, waveSecs: 2, cpu: map[string]float64{"r0": 0.5, "r3": 0.5, "kube-apiserver": 1.5}}
	if got := r.replicaCPUPerPair(); math.Abs(got-2) > 1e-9 {
		t.Errorf("replicaCPUPerPair = %v, want 2 ms", got)
	}
	if got := (scaleOutRun{}).replicaCPUPerPair(); !math.IsNaN(got) {
		t.Errorf("no pairs: %v, want NaN", got)
	}
}
