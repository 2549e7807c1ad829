package shard

import (
	"context"
	"errors"
	"testing"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

// Every claim CAS moves the claim's epoch (spec.leaseTransitions) on: a
// claim, a takeover, a reclaim and a release. The fencing token of a
// partition names the epoch this replica wrote, and only while it serves.
func TestCoordinator_ClaimEpochMovesOnEveryCAS(t *testing.T) {
	c, _ := newTestCoordinator(t)
	ctx := context.Background()
	const node = "node-a"
	p := PartitionOf(c.cfg.Ring.Partitions, node)
	leases := c.kube.CoordinationV1().Leases("ns")
	read := func() *coordv1.Lease {
		t.Helper()
		l, err := leases.Get(ctx, PartitionLeaseName(p), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	won, cl, _ := c.claimIO(ctx, p, Claim{})
	if !won || cl.Epoch != 1 || ptr.Deref(read().Spec.LeaseTransitions, 0) != 1 {
		t.Fatalf("first claim: won=%v claim=%+v lease transitions %v, want epoch 1", won, cl, read().Spec.LeaseTransitions)
	}
	// Another replica's claim, taken over (r1 has never been seen: expired).
	l := read()
	l.Spec.HolderIdentity, l.Spec.LeaseTransitions = ptr.To("r1"), ptr.To(int32(7))
	l.ResourceVersion = "5" // the fake clientset keeps versions as written
	l, err := leases.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	won, cl, reason := c.claimIO(ctx, p, Claim{Holder: "r1", Version: l.ResourceVersion, Epoch: 7})
	if !won || reason != "takeover" || cl.Epoch != 8 || ptr.Deref(read().Spec.LeaseTransitions, 0) != 8 {
		t.Fatalf("takeover: won=%v reason=%s claim=%+v, want epoch 8", won, reason, cl)
	}

	// Serving: the token names the claim as written.
	c.writeLease(ctx)
	c.mu.Lock()
	_ = c.own.set(p, Claiming)
	_ = c.own.set(p, Serving)
	c.written[p] = writtenClaim{claim: cl, replaced: l.ResourceVersion}
	c.mu.Unlock()
	tok, _, err := c.FenceToken(node)
	if err != nil || tok != (ipam.FenceToken{Partition: p, Holder: "r0", Epoch: 8}) {
		t.Fatalf("FenceToken = %+v, %v; want partition %d, r0, epoch 8", tok, err, p)
	}

	// The watch shows someone else's claim: no token.
	c.mu.Lock()
	delete(c.written, p)
	c.claims = make([]Claim, c.cfg.Ring.Partitions)
	c.claims[p] = Claim{Holder: "r2", Version: "x", Epoch: 9}
	c.mu.Unlock()
	if _, _, err := c.FenceToken(node); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("FenceToken on a claim naming another replica: %v, want ErrNotOwner", err)
	}

	// The release moves it on too.
	c.mu.Lock()
	c.claims[p] = Claim{Holder: "r0", Version: read().ResourceVersion, Epoch: 8}
	c.mu.Unlock()
	c.release(ctx, p, read().ResourceVersion)
	if got := read(); ptr.Deref(got.Spec.HolderIdentity, "x") != "" || ptr.Deref(got.Spec.LeaseTransitions, 0) != 9 {
		t.Fatalf("after the release: holder %v transitions %v, want \"\" and 9", got.Spec.HolderIdentity, got.Spec.LeaseTransitions)
	}
	<-c.results
}
