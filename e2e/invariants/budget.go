package invariants

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/cce-ipam/sharded/cloud/bcesim"
)

// CallLog accumulates a cloud's per-second call counts over a run longer
// than the window one read returns (bce-sim keeps the last 600 seconds):
// Add every read of GET /admin/stats (or of another counter), at least
// every few minutes, and Budget checks I5 over every second of the run.
// A second read more than once keeps its largest count (a read taken
// during a second sees it partly). It is safe for concurrent use.
type CallLog struct {
	mu    sync.Mutex
	secs  map[int64]int64 // unix second → calls
	reads []int64         // unix seconds of the reads, in order
	// Window is how many seconds one read covers; a gap between reads
	// longer than that loses seconds and is reported. Zero means bce-sim's
	// 600.
	Window int64
}

// Add merges one read of per-second counts taken at now.
func (l *CallLog) Add(now time.Time, perSecond []bcesim.SecondStats) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.secs == nil {
		l.secs = map[int64]int64{}
	}
	for _, s := range perSecond {
		l.secs[s.Unix] = max(l.secs[s.Unix], s.Calls)
	}
	l.reads = append(l.reads, now.Unix())
}

// Busiest returns the busiest second in [from, to] and its calls.
func (l *CallLog) Busiest(from, to time.Time) (unix, calls int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s, n := range l.secs {
		if s >= from.Unix() && s <= to.Unix() && (n > calls || (n == calls && s < unix)) {
			unix, calls = s, n
		}
	}
	return unix, calls
}

// Seconds counts the seconds in [from, to] and the calls in them.
func (l *CallLog) Seconds(from, to time.Time) (seconds, calls int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s, n := range l.secs {
		if s >= from.Unix() && s <= to.Unix() {
			calls += n
		}
	}
	return to.Unix() - from.Unix() + 1, calls
}

// Budget checks I5 for every one-second window in [from, to]: no second
// saw more than budget calls (the replicas' global rate + burst; a token
// bucket lets through at most burst + rate in any one second). It also
// reports a stretch of the run no read covered, since its seconds are
// unknown.
func (l *CallLog) Budget(from, to time.Time, budget int64) Violations {
	l.mu.Lock()
	defer l.mu.Unlock()
	window := l.Window
	if window == 0 {
		window = 600
	}
	var out Violations
	var over []int64
	for s, n := range l.secs {
		if s >= from.Unix() && s <= to.Unix() && n > budget {
			over = append(over, s)
		}
	}
	sort.Slice(over, func(i, j int) bool { return over[i] < over[j] })
	for _, s := range over {
		out = append(out, Violation{Kind: KindBudgetExceeded,
			Detail: fmt.Sprintf("%d BCE calls reached the cloud in the second %s, above the global rate + burst %d",
				l.secs[s], time.Unix(s, 0).UTC().Format(time.TimeOnly), budget)})
	}
	// Coverage: every second of [from, to] lies within window seconds
	// before some read.
	reads := append([]int64(nil), l.reads...)
	sort.Slice(reads, func(i, j int) bool { return reads[i] < reads[j] })
	covered := from.Unix() - 1 // the last second known to be covered
	for _, r := range reads {
		if r-window+1 > covered+1 && covered < to.Unix() {
			break
		}
		covered = max(covered, r)
	}
	if covered < to.Unix() {
		out = append(out, Violation{Kind: KindCheckFailed,
			Detail: fmt.Sprintf("I5: the call counters were not read often enough: seconds from %s on are unknown",
				time.Unix(covered+1, 0).UTC().Format(time.TimeOnly))})
	}
	return out
}
