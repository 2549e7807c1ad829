package shard

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// A renewal slower than the renew period is followed by the next at once:
// periods count from sends, so a slow reply does not also cost a whole
// period (two 1.5 s renewals then lapsed a 4 s deadline).
func TestCoordinator_RenewalsStartAPeriodAfterTheLastSend(t *testing.T) {
	c, clk := newTestCoordinator(t)
	writes := make(chan time.Time, 16)
	n := 0
	c.kube.(*fake.Clientset).PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() != "create" && a.GetVerb() != "update" {
			return false, nil, nil
		}
		n++
		writes <- clk.Now()
		if n == 2 {
			clk.Step(c.cfg.RenewPeriod + c.cfg.RenewPeriod/2) // this renewal takes 1.5 periods
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.renewLoop(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	next := func(what string) time.Time {
		t.Helper()
		select {
		case at := <-writes:
			return at
		case <-time.After(5 * time.Second):
			t.Fatalf("no %s", what)
			return time.Time{}
		}
	}
	first := next("first renewal")
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	clk.Step(c.cfg.RenewPeriod)
	second := next("second renewal")
	if d := second.Sub(first); d != c.cfg.RenewPeriod {
		t.Fatalf("second renewal %v after the first, want one period (%v)", d, c.cfg.RenewPeriod)
	}
	// The second took 1.5 periods: the third goes out at once, with no
	// further step of the clock.
	third := next("renewal right after a slow one")
	if d := third.Sub(second); d != c.cfg.RenewPeriod+c.cfg.RenewPeriod/2 {
		t.Fatalf("third renewal %v after the second's send, want right after its 1.5-period reply", d)
	}
}
