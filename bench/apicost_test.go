package bench

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func ms(xs ...int) []time.Duration {
	out := make([]time.Duration, len(xs))
	for i, x := range xs {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

// A phase whose calls slow down after the first ones (a client-side
// limiter's burst running out) shows as last/first below 1.
func TestPhase_RatesOfFirstAndLastCalls(t *testing.T) {
	// 4 calls in the first 100 ms, then one every 100 ms.
	p := phase{ends: ms(25, 50, 75, 100, 200, 300, 400, 500)}
	if got := p.rateFirst(4); math.Abs(got-40) > 1e-9 {
		t.Errorf("rateFirst(4) = %v, want 40/s", got)
	}
	if got := p.rateLast(4); math.Abs(got-10) > 1e-9 {
		t.Errorf("rateLast(4) = %v, want 10/s", got)
	}
	if got := p.rateLast(8); math.Abs(got-16) > 1e-9 {
		t.Errorf("rateLast(all) = %v, want 16/s (from the start)", got)
	}
	if p.rateFirst(9) != 0 || p.rateLast(0) != 0 {
		t.Error("a rate over more calls than ended, or none, is not 0")
	}
}

// A closed loop served at one rate throughout reads 1× from its starts,
// however slow its last calls are to drain (which the ends count), and a
// loop whose service slows down reads below 1×.
func TestPhase_SteadyRatesFromStarts(t *testing.T) {
	const conc = 4
	// The fill: 4 calls begin at once; then a call ends, and the next
	// begins, every 10 ms. The last 4 calls drain slowly: the last ends
	// 200 ms after it began.
	var flat phase
	flat.starts = ms(0, 0, 0, 0)
	for i := range 20 {
		flat.starts = append(flat.starts, time.Duration(10*(i+1))*time.Millisecond)
	}
	flat.ends = append(ms(), flat.starts[conc:]...)
	flat.ends = append(flat.ends, ms(210, 250, 300, 400)...)
	first, last := flat.steadyRates(5, conc)
	if math.Abs(first-100) > 1e-9 || math.Abs(last-100) > 1e-9 {
		t.Errorf("flat run: steadyRates = %v, %v /s, want 100, 100", first, last)
	}
	if r := flat.rateLast(5) / flat.rateFirst(5); r > 0.5 {
		t.Errorf("the ends' ratio = %v: the test's drain should read as a knee there", r)
	}

	// The same loop serving a call every 40 ms from the 15th start on.
	var slowing phase
	slowing.starts = ms(0, 0, 0, 0)
	at := time.Duration(0)
	for i := range 20 {
		step := 10 * time.Millisecond
		if conc+i >= 15 {
			step = 40 * time.Millisecond
		}
		at += step
		slowing.starts = append(slowing.starts, at)
	}
	first, last = slowing.steadyRates(5, conc)
	if math.Abs(first-100) > 1e-9 || math.Abs(last-25) > 1e-9 {
		t.Errorf("slowing run: steadyRates = %v, %v /s, want 100, 25", first, last)
	}

	if f, l := flat.steadyRates(10, conc); f != 0 || l != 0 {
		t.Errorf("overlapping windows: steadyRates = %v, %v, want 0, 0", f, l)
	}
}

func TestFilterChartArgs_KeepsOnlyWhatTheFleetDoesNotSet(t *testing.T) {
	got := filterChartArgs([]string{"--cluster-id=c", "--bce-rate=10", "--grpc-listen=:9997", "--namespace=$(POD_NAMESPACE)",
		"--idle-ip-pool-min-size=2", "--memberlist-bind-port=7946", "--kube-api-qps=0", "--shard-fencing-policy=x-wep-fencing",
		"--memberlist-advertise-addr=$(POD_IP)", "--gc-period=2m", "--webhook-enabled=true", "--log-level=info"})
	want := "--idle-ip-pool-min-size=2 --kube-api-qps=0 --gc-period=2m"
	if strings.Join(got, " ") != want {
		t.Errorf("got %q, want %q", strings.Join(got, " "), want)
	}
}

// Item 8's section: the per-call requests against their floors, the knee
// ratios (worst concurrency in the summary), before/after CPU, and the
// noisy neighbour's rise; a missing flow-control template is said, not
// passed.
func TestReport_APICostSection(t *testing.T) {
	cfg := Config{Profile: Profiles["smoke"], OutDir: t.TempDir()}
	steady := phase{took: ms(10, 10, 10, 10), ends: ms(10, 20, 30, 40), elapsed: 40 * time.Millisecond}
	knee := phase{took: ms(10, 10, 10, 40), ends: ms(10, 20, 30, 130), elapsed: 130 * time.Millisecond}
	k := func(c, repeat int, add phase) kneeRun {
		r := kneeRun{conc: c, repeat: repeat, add: add, del: steady, floorAdd: steady, floorDel: steady, firstLastK: 1, replicas: 1}
		r.addPerSecFirst, r.addPerSecLast = add.rateFirst(1), add.rateLast(1)
		r.delPerSecFirst, r.delPerSecLast = steady.rateFirst(1), steady.rateLast(1)
		return r
	}
	res := &results{apicost: &apicostResult{nodes: 6, chartArgs: []string{"--gc-period=2m"},
		requests: &requestsResult{replicas: 1, background: reqCounts{{verb: "PUT", resource: "leases"}: 1}, rows: []reqRow{
			{kind: "warm ADD", calls: 10, floor: 1, floorText: "1", perCall: reqCounts{{verb: "POST", resource: "workloadendpoints"}: 1,
				{verb: "PUT", resource: "leases"}: 0.3}},
			{kind: "DEL", calls: 10, floor: 2, floorText: "2", perCall: reqCounts{{verb: "GET", resource: "workloadendpoints"}: 2,
				{verb: "PUT", resource: "workloadendpoints"}: 1, {verb: "DELETE", resource: "workloadendpoints"}: 1}},
		}},
		// One knee in three repeats at each concurrency: the median (not
		// the worst repeat) is the verdict.
		knee1: []kneeRun{k(1, 1, steady), k(1, 2, knee), k(1, 3, steady), k(8, 1, steady), k(8, 2, steady), k(8, 3, knee)},
		cpu: &cpuResult{conc: 8, before: cpuRun{label: "before", pairs: 1000, wall: 10 * time.Second, cpu: 4, idle: 0.1, mallocs: 2e6},
			after: cpuRun{label: "after", pairs: 1000, wall: 10 * time.Second, cpu: 2, idle: 0.1, mallocs: 1e6}},
		noisy: &noisyResult{quiet: phase{took: ms(10, 10, 20)}, flood: phase{took: ms(30, 30, 60)}, fcMissing: "no template"},
	}}
	var b strings.Builder
	for _, s := range buildDoc(cfg, res, func(f string) string { return f }).Sections {
		b.WriteString(strings.Join(s.Paragraphs, "\n") + "\n" + strings.Join(s.Notes, "\n") + "\n")
		for _, tb := range s.Tables {
			for _, r := range tb.Rows {
				b.WriteString(strings.Join(r, "|") + "\n")
			}
		}
	}
	got := b.String()
	for _, want := range []string{
		"8a. API requests per warm ADD|≤ 1|1|met", // leases are not a CNI resource
		"8a. API requests per DEL|≤ 2|4|missed by 2 requests per call",
		"get workloadendpoints 2, put workloadendpoints 1", // the breakdown
		"8b. last 100 / first 100 calls per second, 1 replica(s), worst of c=1, 8, median of 3 repeat(s) each|≥ 0.9×|1×|met",
		"8b. ADD p99 / bare create p99, 1 replica(s), worst of c=1, 8, median of 3 repeat(s) each|≤ 2×|1×|met",
		"1|8|3|100|10|0.1×|", // a row per repeat: this one's knee
		"8c. CPU-s per 1,000 ADD+DEL pairs, after / before|(reported)|1 / 3 s = 0.33×",
		"8d. ADD p99 rise under a LIST flood, without flow-control objects|(reported)|3×",
		"8d. ADD p99 rise under a LIST flood, the chart's flow-control objects|≤ 1.5×|not measured|not measured: no template",
		"The flow-control half was not measured:** no template",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
}

// A call with nothing to time (a floor wep the GC deleted first) is
// counted as skipped: not a sample, not an error to retry for minutes.
func TestTimedPhase_SkippedCallsAreNeitherSamplesNorErrors(t *testing.T) {
	p, err := timedPhase(t.Context(), 4, 2, func(_ context.Context, i int) (time.Duration, error) {
		if i%2 == 0 {
			return 0, errSkip
		}
		return time.Millisecond, nil
	})
	if err != nil || p.skipped != 2 || len(p.took) != 2 || p.errors != 0 {
		t.Fatalf("err %v, skipped %d, samples %d, errors %d; want nil, 2, 2, 0", err, p.skipped, len(p.took), p.errors)
	}
}

func TestAPIServerSeats_Args(t *testing.T) {
	if got := (APIServerSeats{}).args(); len(got) != 0 {
		t.Errorf("zero seats: args %q, want none (the API server's defaults)", got)
	}
	got := APIServerSeats{ReadOnly: 40, Mutating: 20}.args()
	want := []string{"--max-requests-inflight=40", "--max-mutating-requests-inflight=20"}
	if !slices.Equal(got, want) {
		t.Errorf("args %q, want %q", got, want)
	}
	if s := (APIServerSeats{Mutating: 20}).String(); !strings.Contains(s, "400 (default)") || !strings.Contains(s, "inflight` 20") {
		t.Errorf("String() = %q: want the default read-only seats and 20 mutating", s)
	}
}

// Windows of k calls served at full concurrency, in order: a slowdown that
// builds up shows as falling windows.
func TestPhase_WindowRates(t *testing.T) {
	const conc = 2
	p := phase{starts: ms(0, 0, 10, 20, 30, 40, 60, 80, 100, 140, 180)}
	// Gaps from starts[2]: 10 10 10 | 20 20 20 | 40 40 (the last window is
	// not whole).
	got := p.windowRates(3, conc)
	want := []float64{100, 50}
	if len(got) != len(want) {
		t.Fatalf("windowRates = %v, want %v", got, want)
	}
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-9 {
			t.Errorf("window %d: %v/s, want %v/s", i, got[i], want[i])
		}
	}
	if p.windowRates(0, conc) != nil {
		t.Error("k=0: windows")
	}
}

// A baseline older than a chart flag runs without it (and without the
// value that follows it as its own argument); everything it knows stays.
func TestArgsKnownTo_LeavesOutWhatTheBinaryDoesNotKnow(t *testing.T) {
	known := map[string]bool{"gc-period": true, "kube-api-qps": true}
	kept, left := argsKnownTo([]string{"--gc-period=2m", "--eni-create-with-ips=true", "--kube-api-qps", "0", "--new-flag", "x"}, known)
	if got, want := strings.Join(kept, " "), "--gc-period=2m --kube-api-qps 0"; got != want {
		t.Fatalf("kept %q, want %q", got, want)
	}
	if got, want := strings.Join(left, " "), "--eni-create-with-ips=true --new-flag x"; got != want {
		t.Fatalf("left out %q, want %q", got, want)
	}
}
