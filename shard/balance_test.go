package shard

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// memberSet is the s-th of many random-looking member sets of size n.
func memberSet(s, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("cce-ipam-%d-%08x", i, s*7919+i*104729)
	}
	return out
}

// Balanced keeps every member within NodeLoad of the mean share of nodes,
// where the ring alone gave one member of 3 up to 1.31× the mean (300
// nodes) and left one of 4 with no node of 12.
func TestRing_BalancedBoundsNodeShares(t *testing.T) {
	for _, tc := range []struct{ members, nodes int }{{3, 1000}, {3, 300}, {4, 12}, {3, 12}, {5, 3000}, {10, 1000}} {
		ringMax, balMax, balMin := 0.0, 0.0, math.Inf(1)
		for s := range 100 {
			ms := memberSet(s, tc.members)
			r, err := NewRing(DefaultRingConfig(), ms)
			if err != nil {
				t.Fatal(err)
			}
			counts := partitionCounts(r.cfg.Partitions, nodes(tc.nodes))
			bt, err := r.Balanced(counts)
			if err != nil {
				t.Fatal(err)
			}
			mean := float64(tc.nodes) / float64(tc.members)
			lo, hi := int(math.Floor(mean/r.cfg.NodeLoad)), int(math.Ceil(mean*r.cfg.NodeLoad))
			before, after := loads(r, r.Table(), counts), loads(r, bt, counts)
			total := 0
			for _, m := range ms {
				total += after[m]
				ringMax = max(ringMax, float64(before[m])/mean)
				balMax, balMin = max(balMax, float64(after[m])/mean), min(balMin, float64(after[m])/mean)
				if after[m] < lo || after[m] > hi {
					t.Errorf("%d members, %d nodes, set %d: %s serves %d nodes, want %d to %d", tc.members, tc.nodes, s, m, after[m], lo, hi)
				}
			}
			if total != tc.nodes || len(after) != tc.members {
				t.Fatalf("balanced table serves %d nodes by %d owners, want %d by %d", total, len(after), tc.nodes, tc.members)
			}
		}
		t.Logf("%d members, %d nodes over 100 member sets: the ring's busiest member %.2f× the mean; balanced %.2f–%.2f×",
			tc.members, tc.nodes, ringMax, balMin, balMax)
	}
}

func TestRing_BalancedWithoutNodesIsTheRing(t *testing.T) {
	r, _ := NewRing(DefaultRingConfig(), names(3))
	bt, err := r.Balanced(make([]int, r.cfg.Partitions))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(bt.Owners, r.Table().Owners) {
		t.Fatal("balancing no nodes changed the table")
	}
	// Nodes already even: nothing moves.
	one := make([]int, r.cfg.Partitions)
	one[0] = 1
	bt, _ = r.Balanced(one)
	if !slices.Equal(bt.Owners, r.Table().Owners) {
		t.Fatal("balancing a single node moved partitions")
	}
}

func TestRing_BalancedBadInput(t *testing.T) {
	r, _ := NewRing(DefaultRingConfig(), names(3))
	if _, err := r.Balanced(make([]int, 5)); err == nil {
		t.Error("accepted 5 counts for 271 partitions")
	}
	neg := make([]int, r.cfg.Partitions)
	neg[3] = -1
	if _, err := r.Balanced(neg); err == nil {
		t.Error("accepted a negative count")
	}
	one := DefaultRingConfig()
	one.NodeLoad = 1
	if err := one.Validate(); err == nil {
		t.Error("accepted node load 1")
	}
}

func TestPartitionNodes_RoundTrip(t *testing.T) {
	counts := partitionCounts(271, nodes(1000))
	got, err := DecodePartitionNodes(EncodePartitionNodes(counts), 271)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, counts) {
		t.Fatal("round trip changed the counts")
	}
}

func TestDecodePartitionNodes_Refuses(t *testing.T) {
	ok := strings.TrimSuffix(strings.Repeat("1,", 5), ",")
	if _, err := DecodePartitionNodes(ok, 5); err != nil {
		t.Fatalf("refused %q: %v", ok, err)
	}
	for _, bad := range []string{"", "1,1,1,1", "1,1,1,1,1,1", "1,1,-1,1,1", "1,1,01,1,1", "1,1,+1,1,1",
		"1,1, 1,1,1", "1,1,,1,1", "1,1,x,1,1", "1,1,99999999999999999999,1,1", "1,1,2000000,1,1"} {
		if c, err := DecodePartitionNodes(bad, 5); err == nil {
			t.Errorf("accepted %q as %v", bad, c)
		}
	}
}

func FuzzDecodePartitionNodes(f *testing.F) {
	f.Add("0,1,2", 3)
	f.Add("", 1)
	f.Add("1,,2", 3)
	f.Fuzz(func(t *testing.T, s string, partitions int) {
		if partitions < 1 || partitions > 1000 {
			return
		}
		c, err := DecodePartitionNodes(s, partitions)
		if err != nil {
			return
		}
		if len(c) != partitions {
			t.Fatalf("%d counts for %d partitions", len(c), partitions)
		}
		if EncodePartitionNodes(c) != s {
			t.Fatalf("accepted %q, which does not encode back", s)
		}
	})
}

// Nodes join one at a time. Balancing each replica's own node counts moves
// a partition every few joins; balancing published counts, republished only
// when the shares drift past NodeLoad², moves far fewer, and the shares stay
// within the wider bounds.
func TestRebalance_PublishedCountsMoveLittle(t *testing.T) {
	for _, tc := range []struct{ members, nodes, added int }{{3, 1000, 200}, {3, 300, 100}, {3, 100, 900}, {5, 30, 300}} {
		var liveMoves, pubMoves, publications int
		const sets = 20
		for s := range sets {
			r, _ := NewRing(DefaultRingConfig(), memberSet(s, tc.members))
			all := nodes(tc.nodes + tc.added)
			actual := partitionCounts(r.cfg.Partitions, all[:tc.nodes])
			liveT, _ := r.Balanced(actual)
			pubT := liveT
			for i := tc.nodes; i < len(all); i++ {
				actual[PartitionOf(r.cfg.Partitions, all[i])]++
				next, _ := r.Balanced(actual)
				d, _ := Diff(liveT, next)
				liveMoves += len(d)
				liveT = next
				reason, err := RebalanceReason(r, pubT, actual)
				if err != nil {
					t.Fatal(err)
				}
				if reason != "" {
					publications++
					next, _ = r.Balanced(actual)
					d, _ = Diff(pubT, next)
					pubMoves += len(d)
					pubT = next
				}
				lo, hi := shareBounds(r.cfg, i+1, tc.members)
				for m, n := range loads(r, pubT, actual) {
					if n < lo || n > hi {
						t.Fatalf("%d nodes: %s serves %d, outside %d–%d, and nothing was published", i+1, m, n, lo, hi)
					}
				}
			}
		}
		adds := float64(sets * tc.added)
		t.Logf("%d members, %d → %d nodes: partition moves per node added %.3f balancing live counts, %.3f balancing published counts (%d publications in %d sets)",
			tc.members, tc.nodes, tc.nodes+tc.added, float64(liveMoves)/adds, float64(pubMoves)/adds, publications, sets)
		if liveMoves == 0 {
			t.Fatalf("balancing live counts moved nothing: the case shows nothing")
		}
		if float64(pubMoves) > float64(liveMoves)/3 {
			t.Errorf("published counts moved %d partitions, live counts %d: want far fewer", pubMoves, liveMoves)
		}
	}
}

// The first live member publishes the node counts when none are, replaces
// unreadable ones, and the table every replica uses follows them.
func TestCoordinator_PublishesNodeCounts(t *testing.T) {
	c, clk := newTestCoordinator(t)
	ctx := context.Background()
	for _, n := range nodes(40) {
		if err := c.nodeInformer.GetStore().Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n},
			Spec: corev1.NodeSpec{ProviderID: "cce://i-" + n}}); err != nil {
			t.Fatal(err)
		}
	}
	// A node that is not a BCC node is not served and not counted.
	if err := c.nodeInformer.GetStore().Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "virtual"}}); err != nil {
		t.Fatal(err)
	}
	refusePartitionCreates(c)
	renew(t, c)
	stop := make(chan struct{})
	defer close(stop)
	c.leaseInformers.Start(stop)
	c.leaseInformers.WaitForCacheSync(stop)
	leases := c.kube.CoordinationV1().Leases("ns")

	// published applies I/O outcomes until the publication the step
	// started has finished.
	published := func() string {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for {
			done := !c.balance.Publishing()
			if done {
				break
			}
			select {
			case f := <-c.results:
				f()
			case <-deadline:
				t.Fatal("no publication finished")
			}
		}
		l, err := leases.Get(ctx, balanceLeaseName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.Annotations[annoPartitionNodes]
	}
	if err := c.step(ctx); err != nil {
		t.Fatal(err)
	}
	publishing := c.balance.Publishing()
	if !publishing {
		t.Fatal("the only live member did not publish the node counts")
	}
	want := EncodePartitionNodes(partitionCounts(c.cfg.Ring.Partitions, nodes(40)))
	if got := published(); got != want {
		t.Fatalf("published %q, want the counts of the 40 BCC nodes", got)
	}

	// Someone writes garbage: it is ignored (the ring's own table), then
	// replaced once the publication interval has passed.
	l, _ := leases.Get(ctx, balanceLeaseName, metav1.GetOptions{})
	l.Annotations[annoPartitionNodes] = "1,2,three"
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCounts(t, c, "1,2,three")
	if err := c.step(ctx); err != nil {
		t.Fatal(err)
	}
	counts, publishing := c.balance.Counts(), c.balance.Publishing()
	owners := slices.Clone(c.table().Owners)
	if counts != nil || publishing {
		t.Fatalf("garbage counts were used (%v) or replaced within the interval (%v)", counts, publishing)
	}
	if !slices.Equal(owners, c.ring.Table().Owners) {
		t.Fatal("with unreadable counts the table is not the ring's own")
	}
	for range int(balanceInterval / c.cfg.RenewPeriod) {
		clk.Step(c.cfg.RenewPeriod)
		renew(t, c)
	}
	if err := c.step(ctx); err != nil {
		t.Fatal(err)
	}
	if got := published(); got != want {
		t.Fatalf("after garbage: published %q, want the counts again", got)
	}

	// Another member that sorts first publishes; this one does not.
	c2, _ := newTestCoordinator(t)
	c2.ring, _ = NewRing(c2.cfg.Ring, []string{"a-first", "r0"})
	c2.own.Renewed(c2.clock.Now(), c2.clock.Now().Add(time.Minute))
	c2.stepBalance(ctx, c2.clock.Now(), nil, []string{"a-first", "r0"}, nodes(40))
	publishing = c2.balance.Publishing()
	if publishing {
		t.Fatal("a replica that is not the first live member published")
	}
}

// waitCounts waits until the coordinator's informer shows the balance
// Lease with the counts annotation raw (the fake sets no resourceVersion).
func waitCounts(t *testing.T, c *Coordinator, raw string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if got, err := c.leases.Get(balanceLeaseName); err == nil && got.Annotations[annoPartitionNodes] == raw {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the informer never showed the counts %q", raw)
}

// When a member leaves, its partitions move, and the balance moves a few of
// the survivors' as well; both stay a small part of the nodes.
func TestRing_BalancedMovesLittleOnLeave(t *testing.T) {
	for _, tc := range []struct{ members, nodes int }{{3, 1000}, {3, 300}, {4, 1000}, {5, 3000}} {
		var ringMoved, balMoved int
		const sets = 100
		for s := range sets {
			ms := memberSet(s, tc.members)
			counts := partitionCounts(271, nodes(tc.nodes))
			before, _ := NewRing(DefaultRingConfig(), ms)
			after, _ := NewRing(DefaultRingConfig(), ms[1:])
			bb, _ := before.Balanced(counts)
			ba, _ := after.Balanced(counts)
			for p := range counts {
				if before.owners[p] != ms[0] && before.owners[p] != after.owners[p] {
					ringMoved += counts[p]
				}
				if bb.Owners[p] != ms[0] && bb.Owners[p] != ba.Owners[p] {
					balMoved += counts[p]
				}
			}
		}
		ringShare := float64(ringMoved) / float64(sets*tc.nodes)
		balShare := float64(balMoved) / float64(sets*tc.nodes)
		t.Logf("%d members, %d nodes, one leaves: survivors' nodes moved %.1f %% (ring alone %.1f %%)", tc.members, tc.nodes, 100*balShare, 100*ringShare)
		if balShare > 0.05 {
			t.Errorf("a leave moved %.1f %% of the survivors' nodes, want under 5 %%", 100*balShare)
		}
	}
}
