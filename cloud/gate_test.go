package cloud_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
)

// A closed gate sends nothing: the call fails with class Canceled and the
// simulator sees no request. Reopened, calls go through again.
func TestGate_ClosedSendsNothing(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	before := e.srv.Stats().Ops[bcesim.OpListENIs].Calls
	fenced := errors.New("lease at risk")
	e.setGate(func() error { return fenced })
	_, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{VPCID: testVPC})
	if cloud.ClassOf(err) != cloud.ClassCanceled || !errors.Is(err, fenced) {
		t.Fatalf("gated call: %v (class %v), want Canceled wrapping the gate's reason", err, cloud.ClassOf(err))
	}
	if got := e.srv.Stats().Ops[bcesim.OpListENIs].Calls; got != before {
		t.Fatalf("a gated call reached the cloud: %d calls, want %d", got, before)
	}
	e.setGate(nil)
	if _, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{VPCID: testVPC}); err != nil {
		t.Fatal(err)
	}
}

// Per-operation limits hold on top of the shared bucket and scale to the
// replica's share of the cluster's operations.
func TestOpLimits_ScaleWithShare(t *testing.T) {
	e := newEnv(t, envOpts{client: cloud.Config{Rate: 100, Burst: 50,
		OpLimits: map[string]cloud.OpLimit{"ListENIs": {
			Rate:  0.1,
			Burst: 2,
		}}}})
	ctx := context.Background()
	// Two tokens of burst, then one per ten seconds: the third call waits
	// (here, past its deadline) although the shared bucket is full.
	for range 2 {
		if _, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{VPCID: testVPC}); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := e.client.ListENIs(short, cloud.ListENIsOptions{VPCID: testVPC}); cloud.ClassOf(err) != cloud.ClassCanceled {
		t.Fatalf("third ListENIs: %v, want it cut short waiting for its operation's token", err)
	}
	if _, err := e.client.GetENI(ctx, "eni-none"); cloud.ClassOf(err) == cloud.ClassCanceled {
		t.Fatalf("another operation waited on ListENIs' bucket: %v", err)
	}
	// A quarter of the cluster's operations: the limit is quartered.
	if err := e.client.SetOpShare(0.25); err != nil {
		t.Fatal(err)
	}
	if r, b := e.client.OpRate("ListENIs"); r != 0.025 || b != 1 {
		t.Fatalf("ListENIs share = %v/%v, want 0.025/s burst 1 (a quarter; never below one token)", r, b)
	}
}

// Two replicas list ENIs at once (a failover's survivors do): BCE takes one
// and answers the other RateLimit. The throttled call is retried once BCE's
// bucket for the operation can have refilled, without first waiting for a
// second token of this replica's share of the operation (here 20 s away), so
// it completes within its deadline.
func TestThrottledRetry_TakesNoSecondOpToken(t *testing.T) {
	e := newEnv(t, envOpts{
		sim: bcesim.Config{RateLimits: map[bcesim.Op]bcesim.RateLimit{bcesim.OpListENIs: {
			QPS:   5,
			Burst: 1,
		}}},
		client: cloud.Config{ThrottleRetries: 3,
			OpLimits: map[string]cloud.OpLimit{"ListENIs": {
				Rate:  5,
				Burst: 1,
			}}},
	})
	ctx := context.Background()
	if err := e.client.SetOpShare(0.01); err != nil { // one token per 20 s for this replica
		t.Fatal(err)
	}
	otherCfg := testClientConfig(cloud.Config{Rate: 100, Burst: 100})
	otherCfg.Endpoint = e.srv.URL()
	other, err := cloud.New(otherCfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.ListENIs(ctx, cloud.ListENIsOptions{VPCID: testVPC}); err != nil {
		t.Fatal(err)
	}
	// bce-sim's bucket runs on the test's clock: refill it once our first
	// attempt has been turned away (the retry comes ≥ 200 ms later).
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	refilled := make(chan struct{})
	go func() {
		defer close(refilled)
		for e.srv.Stats().Ops[bcesim.OpListENIs].Throttled == 0 {
			if short.Err() != nil {
				return // never turned away: the check below fails the test
			}
			time.Sleep(time.Millisecond)
		}
		e.clock.Step(time.Second)
	}()
	if _, err := e.client.ListENIs(short, cloud.ListENIsOptions{VPCID: testVPC}); err != nil {
		t.Fatalf("throttled ListENIs: %v, want it retried and served", err)
	}
	<-refilled
	if n := metricValue(t, e.reg, "cce_ipam_cloud_api_throttled_total", "operation", "ListENIs"); n < 1 {
		t.Fatalf("throttled_total = %v: the first attempt was not turned away, the test proves nothing", n)
	}
}

// A takeover's list does not queue behind this replica's share of the
// operation's limit: it spends the share's token when there is one (the
// periodic sync then yields) and goes without when there is none.
func TestUrgent_GoesAheadOfTheOpShare(t *testing.T) {
	e := newEnv(t, envOpts{client: cloud.Config{Rate: 100, Burst: 50,
		OpLimits: map[string]cloud.OpLimit{"ListENIs": {
			Rate:  100,
			Burst: 1,
		}}}})
	// This replica's share: one token per 100 s (the whole limit, which
	// every call's pace follows, stays 100/s).
	if err := e.client.SetOpShare(1e-4); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := e.client.ListENIs(cloud.Urgent(ctx), cloud.ListENIsOptions{VPCID: testVPC}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.ListENIs(cloud.NoWait(ctx), cloud.ListENIsOptions{VPCID: testVPC}); !errors.Is(err, cloud.ErrWouldWait) {
		t.Fatalf("housekeeping after an urgent call: %v, want ErrWouldWait (the urgent call spent the token)", err)
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := e.client.ListENIs(cloud.Urgent(short), cloud.ListENIsOptions{VPCID: testVPC}); err != nil {
		t.Fatalf("urgent call with the share's bucket empty: %v, want it sent at once", err)
	}
	shorter, cancel2 := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel2()
	if _, err := e.client.ListENIs(shorter, cloud.ListENIsOptions{VPCID: testVPC}); cloud.ClassOf(err) != cloud.ClassCanceled {
		t.Fatalf("ordinary call with the bucket empty: %v, want it to wait for its token (cut short)", err)
	}
}

// An urgent list's pages are paced at the operation's whole limit, not sent
// back to back: BCE turns away a page sent while this replica's own pages
// have emptied its bucket, and the retry waits 1-1.5 intervals. (Without
// the pace every page after the first was refused at least once.)
func TestUrgent_PagesPacedAtTheOperationsLimit(t *testing.T) {
	const qps = 2 // BCE's and the client's limit: a page every 500 ms
	e := newEnv(t, envOpts{
		sim: bcesim.Config{PageSize: 2, RateLimits: map[bcesim.Op]bcesim.RateLimit{bcesim.OpListENIs: {QPS: qps, Burst: 1}}},
		client: cloud.Config{ThrottleBackoff: 5 * time.Millisecond,
			OpLimits: map[string]cloud.OpLimit{"ListENIs": {Rate: qps, Burst: 1}}},
	})
	for i := range 7 {
		createENI(t, e, fmt.Sprintf("c-1/i-x/node%d/00000%d", i, i), e.subnet)
	}
	// A replica's share, as with 3 replicas: the urgent list goes without it.
	if err := e.client.SetOpShare(1.0 / 3); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second / qps) // BCE's bucket full again after the creates' setup
	ops := func() bcesim.OpStats { return e.srv.Stats().Ops[bcesim.OpListENIs] }
	before := ops()
	got, err := e.client.ListENIs(cloud.Urgent(context.Background()), cloud.ListENIsOptions{VPCID: testVPC})
	if err != nil || len(got) != 7 {
		t.Fatalf("urgent list: %d ENIs, %v; want 7", len(got), err)
	}
	after := ops()
	pages, refused := after.Calls-before.Calls-(after.Throttled-before.Throttled), after.Throttled-before.Throttled
	if pages < 4 {
		t.Fatalf("the list took %d pages: the test proves nothing", pages)
	}
	// One refusal is forgiven: a page's request can reach BCE late enough
	// after its token that the next one arrives early (the pace's margin).
	if refused > 1 {
		t.Fatalf("BCE turned away %d of the urgent list's %d pages' attempts; want them paced (at most 1)", refused, pages)
	}
}

// Replicas taking over at once collide at BCE's ListENIs limit, and a page
// may be turned away more often than ThrottleRetries allows. An urgent call
// keeps retrying (twenty times as often) rather than throwing away the pages
// it read; an ordinary call still gives up after ThrottleRetries.
func TestUrgent_OutlastsContendedThrottling(t *testing.T) {
	// bce-sim's bucket refills on the wall clock: at this rate, not within
	// the test; the test lifts the limit itself.
	starved := map[bcesim.Op]bcesim.RateLimit{bcesim.OpListENIs: {
		QPS:   0.001,
		Burst: 1,
	}}
	e := newEnv(t, envOpts{
		sim: bcesim.Config{RateLimits: starved},
		client: cloud.Config{
			ThrottleRetries: 1,
			ThrottleBackoff: 5 * time.Millisecond,
			OpLimits:        map[string]cloud.OpLimit{},
		},
	})
	ctx := context.Background()
	if _, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{VPCID: testVPC}); err != nil { // empties the bucket
		t.Fatal(err)
	}
	throttled := func() int64 { return e.srv.Stats().Ops[bcesim.OpListENIs].Throttled }

	before := throttled()
	if _, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{VPCID: testVPC}); cloud.ClassOf(err) != cloud.ClassRateLimit {
		t.Fatalf("ordinary call with BCE's bucket empty: %v, want RateLimit after its retry", err)
	}
	if n := throttled() - before; n != 2 {
		t.Fatalf("ordinary call was turned away %d times, want 2 (the call and ThrottleRetries=1 retry)", n)
	}

	// The urgent call: BCE lets it through only after turning it away
	// twelve times, more than an ordinary call bears and more than four
	// times as many (5 replicas on 5,000 nodes: lists gave up at that).
	const refusals = 12
	before = throttled()
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lifted := make(chan error, 1)
	go func() {
		for throttled()-before < refusals {
			if short.Err() != nil {
				lifted <- nil
				return
			}
			time.Sleep(100 * time.Microsecond)
		}
		lifted <- e.srv.SetRateLimits(map[bcesim.Op]bcesim.RateLimit{bcesim.OpListENIs: {
			QPS:   1000,
			Burst: 1000,
		}})
	}()
	if _, err := e.client.ListENIs(cloud.Urgent(short), cloud.ListENIsOptions{VPCID: testVPC}); err != nil {
		t.Fatalf("urgent call turned away %d times: %v, want it retried until served", throttled()-before, err)
	}
	if err := <-lifted; err != nil {
		t.Fatal(err)
	}
	if n := throttled() - before; n < refusals {
		t.Fatalf("urgent call was turned away %d times: the test proves nothing", n)
	}
}

// Housekeeping yields to a takeover's list: while an Urgent call of an
// operation is in flight, and for 5 s after it, a NoWait call of the same
// operation fails with ErrWouldWait without reaching the cloud (here no
// per-operation limit is set, so only the Urgent call makes it yield).
// Calls of other operations and calls that may wait are not affected.
func TestNoWait_YieldsToAnUrgentCallOfTheOperation(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	list := func(ctx context.Context) error {
		_, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{VPCID: testVPC})
		return err
	}
	calls := func() int64 { return e.srv.Stats().Ops[bcesim.OpListENIs].Calls }
	yields := func(when string) {
		t.Helper()
		before := calls()
		if err := list(cloud.NoWait(ctx)); !errors.Is(err, cloud.ErrWouldWait) || cloud.ClassOf(err) != cloud.ClassCanceled {
			t.Fatalf("NoWait ListENIs %s: %v, want ErrWouldWait (class Canceled)", when, err)
		}
		if got := calls(); got != before {
			t.Fatalf("NoWait ListENIs %s reached the cloud: %d calls, want %d", when, got, before)
		}
	}
	if err := list(cloud.NoWait(ctx)); err != nil {
		t.Fatalf("NoWait ListENIs with no urgent call about: %v", err)
	}

	if err := e.srv.SetFaults(bcesim.Faults{LatencyMs: map[bcesim.Op]int{bcesim.OpListENIs: 1500}}); err != nil {
		t.Fatal(err)
	}
	before := calls()
	urgent := make(chan error, 1)
	go func() { urgent <- list(cloud.Urgent(ctx)) }()
	for calls() == before { // the urgent list reached the cloud and is held there
		time.Sleep(10 * time.Millisecond)
	}
	yields("while an urgent one is in flight")
	if _, err := e.client.GetENI(cloud.NoWait(ctx), "eni-none"); errors.Is(err, cloud.ErrWouldWait) {
		t.Fatalf("NoWait GetENI yielded to an urgent ListENIs: %v", err)
	}
	if err := <-urgent; err != nil {
		t.Fatal(err)
	}
	ended := time.Now()
	if err := e.srv.SetFaults(bcesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	yields("just after an urgent one ended")
	if err := list(ctx); err != nil {
		t.Fatalf("a ListENIs that may wait, just after an urgent one: %v", err)
	}
	time.Sleep(time.Until(ended.Add(5*time.Second + 100*time.Millisecond)))
	if err := list(cloud.NoWait(ctx)); err != nil {
		t.Fatalf("NoWait ListENIs 5 s after the urgent one ended: %v", err)
	}
}
