package bcesim

import (
	"testing"
	"time"
)

func TestCounters_PerSecondWindows(t *testing.T) {
	c := newCounters()
	base := time.Unix(1_800_000_000, 0)
	for range 5 {
		c.add(OpGetENI, base.Add(300*time.Millisecond), false)
	}
	c.add(OpGetENI, base.Add(1500*time.Millisecond), true)
	c.add(OpListENIs, base.Add(1500*time.Millisecond), false)
	st := c.snapshot(base.Add(2 * time.Second))
	if m := st.Ops[OpGetENI].MaxPerSecond(); m != 5 {
		t.Fatalf("max per second = %d, want 5", m)
	}
	if m := st.All.MaxPerSecond(); m != 5 || st.All.Calls != 7 {
		t.Fatalf("all: max %d total %d", m, st.All.Calls)
	}
	// A second one window later reuses the ring slot and must not inherit counts.
	c.add(OpGetENI, base.Add(counterWindow*time.Second), false)

	st = c.snapshot(base.Add(counterWindow * time.Second))
	g := st.Ops[OpGetENI]
	if g.Calls != 7 || g.Throttled != 1 {
		t.Fatalf("totals %+v", g)
	}
	if len(g.PerSecond) != 2 || g.PerSecond[0].Calls != 1 || g.PerSecond[1].Calls != 1 {
		t.Fatalf("per second %+v: the slot reused after a full window must restart at 1", g.PerSecond)
	}
}
