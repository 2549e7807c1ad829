package bcesim

import (
	"sort"
	"sync"
	"time"

	"github.com/juju/ratelimit"
)

// RateLimit is one operation's token bucket. QPS 0 means unlimited.
type RateLimit struct {
	QPS   float64 `json:"qps"`
	Burst int64   `json:"burst"`
}

// DefaultRateLimits returns the per-operation limits of the upstream's flow
// control table (spec §5); operations it does not list get 5 QPS, burst 10.
func DefaultRateLimits() map[Op]RateLimit {
	m := map[Op]RateLimit{}
	for _, op := range AllOps {
		m[op] = RateLimit{QPS: 5, Burst: 10}
	}
	m[OpCreateENI] = RateLimit{QPS: 5, Burst: 5}
	m[OpAttachENI] = RateLimit{QPS: 5, Burst: 5}
	m[OpDetachENI] = RateLimit{QPS: 5, Burst: 5}
	m[OpDeleteENI] = RateLimit{QPS: 1, Burst: 1}
	m[OpListENIs] = RateLimit{QPS: 1, Burst: 1}
	m[OpListSubnets] = RateLimit{QPS: 1, Burst: 1}
	return m
}

// limiter holds one bucket per operation; operations without one are unlimited.
type limiter struct {
	mu      sync.Mutex
	limits  map[Op]RateLimit
	buckets map[Op]*ratelimit.Bucket
}

func newLimiter(limits map[Op]RateLimit) *limiter {
	l := &limiter{limits: map[Op]RateLimit{}, buckets: map[Op]*ratelimit.Bucket{}}
	for op, rl := range limits {
		l.setLocked(op, rl)
	}
	return l
}

func (l *limiter) setLocked(op Op, rl RateLimit) {
	if rl.QPS <= 0 {
		delete(l.limits, op)
		delete(l.buckets, op)
		return
	}
	if rl.Burst < 1 {
		rl.Burst = 1
	}
	l.limits[op] = rl
	l.buckets[op] = ratelimit.NewBucketWithRate(rl.QPS, rl.Burst)
}

func (l *limiter) set(limits map[Op]RateLimit) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for op, rl := range limits {
		l.setLocked(op, rl)
	}
}

func (l *limiter) get() map[Op]RateLimit {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[Op]RateLimit, len(l.limits))
	for op, rl := range l.limits {
		out[op] = rl
	}
	return out
}

// allow takes a token without waiting; false means answer 429.
func (l *limiter) allow(op Op) bool {
	l.mu.Lock()
	b := l.buckets[op]
	l.mu.Unlock()
	return b == nil || b.TakeAvailable(1) == 1
}

// counterWindow is how many seconds of per-second counts are kept.
const counterWindow = 600

type secondCount struct {
	sec             int64
	calls, throttle int64
}

// counters keeps per-second call counts per operation for the admin API, so
// tests can prove a cluster-wide budget held in every one-second window.
type counters struct {
	mu     sync.Mutex
	rings  map[Op]*[counterWindow]secondCount
	totals map[Op]*[2]int64
}

func newCounters() *counters {
	return &counters{rings: map[Op]*[counterWindow]secondCount{}, totals: map[Op]*[2]int64{}}
}

func (c *counters) add(op Op, now time.Time, throttled bool) {
	sec := now.Unix()
	c.mu.Lock()
	defer c.mu.Unlock()
	ring := c.rings[op]
	if ring == nil {
		ring = new([counterWindow]secondCount)
		c.rings[op] = ring
		c.totals[op] = new([2]int64)
	}
	slot := &ring[sec%counterWindow]
	if slot.sec != sec {
		*slot = secondCount{sec: sec}
	}
	slot.calls++
	c.totals[op][0]++
	if throttled {
		slot.throttle++
		c.totals[op][1]++
	}
}

// SecondStats is the number of calls received in one wall-clock second.
type SecondStats struct {
	Unix      int64 `json:"unix"`
	Calls     int64 `json:"calls"`
	Throttled int64 `json:"throttled"`
}

// OpStats is the call history of one operation.
type OpStats struct {
	Calls     int64         `json:"calls"`
	Throttled int64         `json:"throttled"`
	PerSecond []SecondStats `json:"perSecond"`
}

// Stats is what GET /admin/stats returns. "All" sums every operation; Calls
// counts every authenticated request, throttled ones included, because a
// throttled call still spends the cloud's budget.
type Stats struct {
	Ops map[Op]OpStats `json:"ops"`
	All OpStats        `json:"all"`
}

func (c *counters) snapshot(now time.Time) Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	oldest := now.Unix() - counterWindow + 1
	st := Stats{Ops: map[Op]OpStats{}}
	all := map[int64]*SecondStats{}
	for op, ring := range c.rings {
		os := OpStats{Calls: c.totals[op][0], Throttled: c.totals[op][1], PerSecond: []SecondStats{}}
		for _, s := range ring {
			if s.calls == 0 || s.sec < oldest {
				continue
			}
			os.PerSecond = append(os.PerSecond, SecondStats{Unix: s.sec, Calls: s.calls, Throttled: s.throttle})
			a := all[s.sec]
			if a == nil {
				a = &SecondStats{Unix: s.sec}
				all[s.sec] = a
			}
			a.Calls += s.calls
			a.Throttled += s.throttle
		}
		sort.Slice(os.PerSecond, func(i, j int) bool { return os.PerSecond[i].Unix < os.PerSecond[j].Unix })
		st.Ops[op] = os
		st.All.Calls += os.Calls
		st.All.Throttled += os.Throttled
	}
	st.All.PerSecond = []SecondStats{}
	for _, a := range all {
		st.All.PerSecond = append(st.All.PerSecond, *a)
	}
	sort.Slice(st.All.PerSecond, func(i, j int) bool { return st.All.PerSecond[i].Unix < st.All.PerSecond[j].Unix })
	return st
}

// MaxPerSecond returns the most calls received in any one second of the
// window: what a budget test compares with rate + burst.
func (s OpStats) MaxPerSecond() int64 {
	var m int64
	for _, p := range s.PerSecond {
		m = max(m, p.Calls)
	}
	return m
}
