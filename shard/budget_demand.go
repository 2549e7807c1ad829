package shard

import (
	"math"
	"slices"
)

// Following demand (--shard-budget-follow-demand): idle replicas lend their
// share of the cloud rate to busy ones. The CAS on the budget Lease keeps the
// sum within the budget whatever each replica computes (budget.go).

// UsageReporter is the limiter's usage (cloud.Client implements it). Without
// it every replica counts as busy and the split stays even.
type UsageReporter interface {
	Usage() (taken, waited int64)
}

// demandTarget follows demand: a replica that is idle keeps what it uses
// (twice its recent rate, at least a quarter of an even share, at most an
// even share); the busy ones split the rest evenly. Replicas that have not
// published yet count as busy. With everyone busy this is the even split.
// Every replica computes only its own target; the CAS on the budget Lease
// keeps the sum within the budget while views differ.
func demandTarget(global Share, live []string, self string, published map[string]Share, busy bool, need float64) Share {
	if slices.Index(live, self) < 0 || global.Rate <= 0 {
		return Share{}
	}
	fair := global.Rate / float64(len(live))
	floor := fair / 4
	var rate float64
	if !busy {
		rate = math.Min(fair, math.Max(floor, need))
	} else {
		idle, busyN := 0.0, 1
		for _, m := range live {
			if m == self {
				continue
			}
			if s, ok := published[m]; ok && !s.Busy {
				idle += s.Rate
			} else {
				busyN++
			}
		}
		rate = math.Max(floor, (global.Rate-idle)/float64(busyN))
	}
	burst := max(1, int64(float64(global.Burst)*rate/global.Rate))
	return Share{
		Rate:  rate,
		Burst: burst,
		Busy:  busy,
	}
}

// demand reads the limiter's usage since the last adjustment: busy when
// calls waited for tokens or used most of the share; idle after a few quiet
// rounds well below it. need is what an idle replica keeps.
func (b *budget) demand(cur Share) (busy bool, need float64) {
	u, ok := b.setter.(UsageReporter)
	if !ok {
		return true, 0
	}
	taken, waited := u.Usage()
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.lastAt.IsZero() {
		b.lastTaken, b.lastWaited, b.lastAt = taken, waited, now
		return true, 0
	}
	dt := now.Sub(b.lastAt).Seconds()
	if dt <= 0 {
		return cur.Busy, 2 * b.usage
	}
	b.usage = 0.5*b.usage + 0.5*float64(taken-b.lastTaken)/dt
	starved := waited > b.lastWaited
	b.lastTaken, b.lastWaited, b.lastAt = taken, waited, now
	switch {
	case starved || b.usage >= 0.8*cur.Rate:
		b.quiet = 0
	case b.usage < 0.5*cur.Rate:
		b.quiet++
	}
	return b.quiet < 3, 2 * b.usage
}
