package shard

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// The fence and the routes are read without a lock while the loop changes
// its state. Every answer must come from one published snapshot: the loop
// here alternates between "serving p under an odd epoch" and "p fenced, its
// claim (still naming us) at the next, even epoch", so a token with an even
// epoch is an answer torn between two snapshots. Run with -race, it also checks that readers and the
// publishing loop share no memory unsynchronised.
func TestFence_ConcurrentReadsSeeWholeSnapshots(t *testing.T) {
	c, _ := newTestCoordinator(t)
	renew(t, c)
	const node = "node-a"
	p := PartitionOf(c.cfg.Ring.Partitions, node)
	c.claims = make([]Claim, c.cfg.Ring.Partitions)
	c.publish()

	var stop atomic.Bool
	var wg sync.WaitGroup
	var served, refused atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				tok, _, err := c.fence.FenceToken(node)
				switch {
				case errors.Is(err, ErrNotOwner):
					refused.Add(1)
				case err != nil:
					t.Errorf("FenceToken: %v", err)
					return
				case tok.Epoch%2 == 0:
					t.Errorf("a token under epoch %d, which the loop wrote only while the partition was fenced", tok.Epoch)
					return
				default:
					served.Add(1)
				}
				if rt := c.fence.RouteOf(node); rt.Partition != p {
					t.Errorf("RouteOf gave partition %d, want %d", rt.Partition, p)
					return
				}
				_ = c.fence.LeaseValid()
				_ = c.fence.ready()
			}
		}()
	}
	for epoch := int64(1); epoch < 4000 && !t.Failed(); epoch += 2 {
		c.written[p] = writtenClaim{claim: Claim{Holder: c.self, Version: "v", Epoch: epoch}}
		if err := c.own.set(p, Claiming); err != nil {
			t.Fatal(err)
		}
		if err := c.own.set(p, Serving); err != nil {
			t.Fatal(err)
		}
		c.publish()
		if err := c.own.set(p, Unowned); err != nil { // fenced
			t.Fatal(err)
		}
		c.written[p] = writtenClaim{claim: Claim{Holder: c.self, Version: "v", Epoch: epoch + 1}}
		c.publish()
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("readers saw %d served and %d refused answers", served.Load(), refused.Load())
}

// A lapse publishes the fenced partitions and the new lease validity in one
// snapshot: no reader sees the renewed lease with the old claims.
func TestFence_RelapseNeverRearmsOldClaims(t *testing.T) {
	c, clk := newTestCoordinator(t)
	renew(t, c)
	const node = "node-a"
	p := PartitionOf(c.cfg.Ring.Partitions, node)
	serveByHand(t, c, p)
	clk.Step(c.cfg.LeaseDuration) // lapsed
	renewed := c.writeLease(t.Context())
	if renewed == nil {
		t.Fatal("the renewal failed")
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			if _, err := c.fence.MayAct(node); err == nil {
				t.Error("MayAct allowed a write on a claim from before the lapse")
				return
			}
		}
	}()
	renewed()
	stop.Store(true)
	wg.Wait()
	if !c.fence.LeaseValid() {
		t.Fatal("the renewal after the lapse did not make the lease valid again")
	}
}
