package cloud_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
)

// I5 under a 5xx storm: every HTTP request that reaches BCE, retries
// included, takes its own token of the client-side bucket. So BCE never sees
// more requests than tokens were taken, and never more than rate + burst in
// one second. (The SDK's own retries re-sent a failed call up to three times
// on one token: replicas together sent 22–26 requests in a second against a
// budget of 15.)
func TestServerRetry_EveryRequestTakesAToken(t *testing.T) {
	const rate, burst = 5, 2
	e := newEnv(t, envOpts{
		// Per-second counts on the wall clock, which the limiter runs on.
		sim:    bcesim.Config{Now: time.Now},
		client: cloud.Config{Rate: rate, Burst: burst, SDKRetries: 3, SDKRetryBase: time.Millisecond},
	})
	if err := e.srv.SetFaults(bcesim.Faults{ErrorRate: map[bcesim.Op]float64{"*": 0.7}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	logical, failed := 0, 0
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				var err error
				if i%2 == 0 {
					_, err = e.client.ListENIs(ctx, cloud.ListENIsOptions{VPCID: testVPC})
				} else {
					_, err = e.client.DescribeSubnet(ctx, e.subnet)
				}
				if cloud.ClassOf(err) == cloud.ClassCanceled {
					return
				}
				mu.Lock()
				logical++
				if cloud.ClassOf(err) == cloud.ClassServer {
					failed++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	st := e.srv.Stats()
	taken, _ := e.client.Usage()
	t.Logf("%d calls (%d failed 5xx), %d HTTP requests, %d tokens, at most %d requests in a second",
		logical, failed, st.All.Calls, taken, st.All.MaxPerSecond())
	if st.All.Calls <= int64(logical) {
		t.Fatalf("%d requests for %d calls under a 5xx storm: nothing was retried, the test proves nothing", st.All.Calls, logical)
	}
	if st.All.Calls > taken {
		t.Errorf("BCE saw %d requests but only %d tokens were taken: retries went out without a token", st.All.Calls, taken)
	}
	if m := st.All.MaxPerSecond(); m > rate+burst {
		t.Errorf("BCE saw %d requests in one second, limit is rate + burst = %d (per second: %+v)", m, rate+burst, st.All.PerSecond)
	}
}

// A retry after a 5xx is a new attempt: the gate is checked again before it,
// so a replica whose lease became at risk between attempts sends nothing
// more. The retries of a call are SDKRetries, no more.
func TestServerRetry_RechecksGateAndHonoursRetries(t *testing.T) {
	e := newEnv(t, envOpts{client: cloud.Config{SDKRetries: 2, SDKRetryBase: time.Millisecond}})
	ctx := context.Background()
	if err := e.srv.SetFaults(bcesim.Faults{ErrorRate: map[bcesim.Op]float64{bcesim.OpListENIs: 1}}); err != nil {
		t.Fatal(err)
	}
	calls := func() int64 { return e.srv.Stats().Ops[bcesim.OpListENIs].Calls }

	before := calls()
	if _, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{VPCID: testVPC}); cloud.ClassOf(err) != cloud.ClassServer {
		t.Fatalf("ListENIs under a 5xx storm: %v, want class Server", err)
	}
	if n := calls() - before; n != 3 {
		t.Fatalf("a call failing with 5xx was sent %d times, want 3 (the call and SDKRetries=2 retries)", n)
	}

	before = calls()
	fenced := errors.New("lease at risk")
	e.setGate(func() error {
		if calls() > before {
			return fenced // closes once the first attempt reached BCE
		}
		return nil
	})
	_, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{VPCID: testVPC})
	if n := calls() - before; n != 1 {
		t.Fatalf("the gate closed after the first attempt, yet BCE saw %d requests (err %v)", n, err)
	}
	if !errors.Is(err, fenced) || cloud.ClassOf(err) != cloud.ClassCanceled {
		t.Fatalf("retry behind a closed gate: %v, want Canceled wrapping the gate's reason", err)
	}
}

// A transport failure (here: the connection is closed before any answer)
// is retried like a 5xx, each attempt with its own token.
func TestServerRetry_TransportFailureTakesATokenPerAttempt(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			c.Close()
		}
	}()
	cfg := testClientConfig(cloud.Config{Rate: 100, Burst: 100, SDKRetries: 2})
	cfg.Endpoint = "http://" + ln.Addr().String()
	c, err := cloud.New(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.GetENI(context.Background(), "eni-x"); cloud.ClassOf(err) != cloud.ClassTransport {
		t.Fatalf("GetENI against a server that hangs up: %v, want class Transport", err)
	}
	taken, _ := c.Usage()
	if n := conns.Load(); n != 3 || taken != 3 {
		t.Fatalf("%d connections and %d tokens, want 3 of each (the call and SDKRetries=2 retries)", n, taken)
	}
}
