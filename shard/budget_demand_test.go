package shard

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// usageScript is a limiter whose usage the test sets.
type usageScript struct{ taken, waited int64 }

func (*usageScript) SetRate(float64, int64) error { return nil }
func (u *usageScript) Usage() (int64, int64)      { return u.taken, u.waited }

// The demand signal (--shard-budget-follow-demand) does not flap: a replica
// whose calls come in bursts with quiet seconds between them stays busy, a
// lone call that waited at an idle replica's small share does not make it
// busy, and only use well below the share for demandIdleAfter makes it idle.
// Before: idle after three quiet adjustments (1.5 s), busy after any wait;
// in bench item 5b (12-07) the busy replica's share swung between 5/s and
// 2.75/s every few seconds, and it served 7.8 ADDs/s against 21.5 with the
// even split.
func TestBudget_DemandDoesNotFlap(t *testing.T) {
	const period = 500 * time.Millisecond
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	u := &usageScript{}
	b := newBudget(budgetDeps{setter: u, clock: clk, period: period})
	share := Share{Rate: 2, Burst: 2, Busy: true}
	step := func(calls, waits int64) bool {
		clk.Step(period)
		u.taken += calls
		u.waited += waits
		busy, _ := b.demand(share)
		return busy
	}
	step(0, 0) // the first reading only sets the baseline

	// Busy in bursts: 4 calls (2 of them waiting) every 2 s, nothing
	// between; for 20 s.
	for k := range 40 {
		calls, waits := int64(0), int64(0)
		if k%4 == 0 {
			calls, waits = 4, 2
		}
		if !step(calls, waits) {
			t.Fatalf("a replica bursting every 2 s was judged idle after %v", time.Duration(k+1)*period)
		}
	}
	// Use about half the share (one call a second at 2/s; smoothed, it
	// swings across half the share): a busy replica stays busy however
	// long it lasts, since its quiet is broken every other second.
	for k := range 30 {
		calls := int64(0)
		if k%2 == 0 {
			calls = 1
		}
		if !step(calls, 0) {
			t.Fatalf("a replica using about half its share was judged idle after %v", time.Duration(k+1)*period)
		}
	}
	// Quiet: idle only once demandIdleAfter has passed.
	var idleAfter time.Duration
	for k := range 20 {
		if !step(0, 0) {
			idleAfter = time.Duration(k+1) * period
			break
		}
	}
	if idleAfter < demandIdleAfter || idleAfter > demandIdleAfter+2*period {
		t.Fatalf("a quiet replica turned idle after %v, want about %v", idleAfter, demandIdleAfter)
	}
	// Idle at a small share: a sync's two calls, one of them waiting,
	// keep it idle.
	share = Share{Rate: 0.5, Burst: 1}
	for k := range 20 {
		calls, waits := int64(0), int64(0)
		if k%10 == 0 {
			calls, waits = 2, 1
		}
		if step(calls, waits) {
			t.Fatalf("an idle replica's lone waiting call (round %d) made it busy", k)
		}
	}
	// Real demand again: calls that wait make it busy at once, and so
	// does use at the share for two adjustments.
	if !step(3, 2) {
		t.Fatal("two calls that waited did not make the replica busy")
	}
	for range 16 { // the smoothed use decays below half the share, then 5 s
		step(0, 0)
	}
	if step(0, 0) {
		t.Fatal("not idle again after a quiet spell")
	}
	if step(1, 0) {
		t.Fatal("one window at the share made the replica busy")
	}
	if !step(1, 0) {
		t.Fatal("two windows in a row at the share did not make the replica busy")
	}
}
