package cloud

import (
	"testing"
	"time"
)

// A refused call's retry spreads wider with each refusal, up to as many
// intervals as there are replicas sharing the operation's limit: with the
// spread fixed at half an interval, 5 replicas' lists kept colliding.
func TestThrottleBackoff_SpreadGrowsWithRefusalsUpToTheRivals(t *testing.T) {
	newClient := func(share float64) *Client {
		c := &Client{cfg: Config{ThrottleBackoff: time.Millisecond, OpLimits: map[string]OpLimit{"ListENIs": {Rate: 1, Burst: 1}}},
			opLimits: map[string]*Limiter{}}
		l, err := NewLimiter(share, 1)
		if err != nil {
			t.Fatal(err)
		}
		c.opLimits["ListENIs"] = l
		return c
	}
	// longest of many draws, in intervals (1 s here)
	longest := func(c *Client, n int) float64 {
		var m time.Duration
		for range 2000 {
			d := c.throttleBackoff("ListENIs", n)
			if d < time.Second {
				t.Fatalf("backoff %v after %d refusals: shorter than the operation's interval", d, n)
			}
			m = max(m, d)
		}
		return m.Seconds()
	}
	five := newClient(0.2) // one of 5 replicas
	for _, c := range []struct {
		n        int
		min, max float64 // bounds of the longest draw, in intervals
	}{
		{1, 1.4, 1.5}, // the first retry as before: within half an interval
		{2, 1.9, 2},
		{3, 2.8, 3},
		{4, 4.5, 5},
		{9, 5.5, 6}, // capped at 5 rivals
	} {
		if got := longest(five, c.n); got < c.min || got > c.max {
			t.Errorf("5 replicas, refusal %d: longest backoff %.2f intervals, want in [%v, %v]", c.n, got, c.min, c.max)
		}
	}
	if got := longest(newClient(1), 9); got > 2 {
		t.Errorf("a lone replica after 9 refusals: longest backoff %.2f intervals, want at most 2", got)
	}
	// Without a limit of its own (no table entry) only ThrottleBackoff applies.
	if d := newClient(1).throttleBackoff("GetENI", 5); d >= 6*time.Millisecond {
		t.Errorf("an operation without a cluster-wide limit backed off %v, want ThrottleBackoff × [1, 6)", d)
	}
}
