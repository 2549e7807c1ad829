package shard

import (
	"context"
	"slices"
	"testing"
	"time"
)

// prefetchingNodes records the reads ahead.
type prefetchingNodes struct {
	noNodes
	calls chan prefetchCall
}

type prefetchCall struct {
	names    []string
	validFor time.Duration
}

func (p prefetchingNodes) PrefetchENIs(_ context.Context, names []string, validFor time.Duration) {
	p.calls <- prefetchCall{names: names, validFor: validFor}
}

// The driver reads a stale replica's nodes' ENIs ahead of the takeover:
// once its Lease has been silent past the renew deadline, once per silence,
// not for a leaving replica, and not while this replica's own lease is not
// valid.
func TestCoordinator_ReadsAheadForAStaleReplica(t *testing.T) {
	c, clk := newTestCoordinator(t)
	rec := prefetchingNodes{calls: make(chan prefetchCall, 4)}
	c.nodes = rec
	ctx := context.Background()
	renew(t, c)

	// node-a in a partition r1 holds, node-b in one r2 (leaving) holds.
	nodes := []string{"node-a", "node-b", "node-c"}
	pa, pb := PartitionOf(c.cfg.Ring.Partitions, "node-a"), PartitionOf(c.cfg.Ring.Partitions, "node-b")
	if pa == pb {
		t.Fatal("the test needs node-a and node-b in different partitions")
	}
	claims := make([]Claim, c.cfg.Ring.Partitions)
	claims[pa], claims[pb] = Claim{Holder: "r1"}, Claim{Holder: "r2"}
	c.seen["r1"] = observed{version: "1", since: clk.Now()}
	c.seen["r2"] = observed{version: "5", since: clk.Now(), leaving: true}

	step := func() { c.prefetchForStale(ctx, clk.Now(), claims, nodes) }
	finish := func() {
		t.Helper()
		select {
		case f := <-c.results:
			f()
		case <-time.After(5 * time.Second):
			t.Fatal("the read ahead did not report back")
		}
	}
	got := func() prefetchCall {
		t.Helper()
		select {
		case call := <-rec.calls:
			return call
		case <-time.After(5 * time.Second):
			t.Fatal("no read ahead")
			return prefetchCall{}
		}
	}

	step()
	if c.prefetch.inFlight {
		t.Fatal("read ahead for a replica whose Lease is fresh")
	}
	clk.Step(c.cfg.RenewDeadline + 100*time.Millisecond)
	renew(t, c)
	step()
	if !c.prefetch.inFlight {
		t.Fatal("no read ahead for a replica silent past the renew deadline")
	}
	if call := got(); !slices.Equal(call.names, []string{"node-a"}) || call.validFor != c.cfg.LeaseDuration {
		t.Fatalf("read ahead %v for %v, want [node-a] (not the leaving r2's node-b) for a lease duration (%v)",
			call.names, call.validFor, c.cfg.LeaseDuration)
	}
	finish()
	step()
	if c.prefetch.inFlight {
		t.Fatal("read ahead again for the same silence")
	}

	// r1 renews, then goes silent again: a new silence, a new read.
	c.seen["r1"] = observed{version: "2", since: clk.Now()}
	clk.Step(c.cfg.RenewDeadline + 100*time.Millisecond)
	renew(t, c)
	step()
	if !c.prefetch.inFlight {
		t.Fatal("no read ahead for a second silence")
	}
	got()
	finish()

	// This replica's own lease lapsed: it cannot take over, so no read.
	c.seen["r1"] = observed{version: "3", since: clk.Now()}
	clk.Step(c.cfg.LeaseDuration + time.Second)
	step()
	if c.prefetch.inFlight {
		t.Fatal("read ahead while this replica's own lease is not valid")
	}
}
