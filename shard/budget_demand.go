package shard

import (
	"math"
	"slices"
	"time"
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

// demandIdleAfter is how long a replica's use must stay quiet before it
// counts as idle and lends its share. Cloud calls come in bursts (a pool
// refill, a trim, a sync) with quiet seconds between them even under load:
// judged over a second and a half (three adjustments), a busy replica went
// idle and back every few seconds, and each return waited at a quarter of an
// even share for the others' headroom (bench item 5b, 12-07).
const demandIdleAfter = 5 * time.Second

// demandStarvedWaits is how many calls must have waited for a token since
// the last adjustment for a replica to count as starved (busy). One call that
// found the bucket empty is what an idle replica's lone sync meets at a
// quarter share; counting it made idle replicas flap to busy and back.
const demandStarvedWaits = 2

// demand reads the limiter's usage since the last adjustment: busy when
// calls waited for tokens or used most of the share for two adjustments in a
// row; idle once every adjustment for demandIdleAfter found it well below its
// share. need is what an idle replica keeps.
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
	window := float64(taken-b.lastTaken) / dt
	b.usage = 0.5*b.usage + 0.5*window
	starved := waited-b.lastWaited >= demandStarvedWaits
	// Use near the share counts when it lasts two adjustments: one
	// window's blip (a sync's few calls at an idle replica's small share)
	// is not demand.
	if window >= 0.8*cur.Rate {
		b.hot++
	} else {
		b.hot = 0
	}
	b.lastTaken, b.lastWaited, b.lastAt = taken, waited, now
	switch {
	case starved || b.hot >= 2:
		b.quietSince = time.Time{}
	case b.usage < 0.5*cur.Rate:
		if b.quietSince.IsZero() {
			b.quietSince = now
		}
	case !b.idleAt(now):
		// Between half and most of the share: a busy replica stays busy
		// (the quiet must be unbroken), an idle one stays idle.
		b.quietSince = time.Time{}
	}
	return !b.idleAt(now), 2 * b.usage
}

// idleAt reports whether the quiet has lasted demandIdleAfter at now.
func (b *budget) idleAt(now time.Time) bool {
	return !b.quietSince.IsZero() && now.Sub(b.quietSince) >= demandIdleAfter
}
