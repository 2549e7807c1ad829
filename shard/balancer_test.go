package shard

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// balanceFixture is a ring of 3 members over 300 nodes whose counts are
// published, and node sets that drift from them a little and a lot.
type balanceFixture struct {
	ring      *Ring
	members   []string
	base      []string // the nodes whose counts are published
	published string   // their counts, encoded
	slight    []string // base and 3 more nodes: within NodeLoad² of the mean
	heavy     []string // base and 150 more in one member's partitions: past it
	oneHot    []string // 20 nodes, all in partition 0
}

func newBalanceFixture(t *testing.T) balanceFixture {
	t.Helper()
	ring, err := NewRing(DefaultRingConfig(), names(3))
	if err != nil {
		t.Fatal(err)
	}
	f := balanceFixture{
		ring:    ring,
		members: ring.Members(),
		base:    nodes(300),
	}
	counts := partitionCounts(ring.cfg.Partitions, f.base)
	f.published = EncodePartitionNodes(counts)
	inUse, err := ring.Balanced(counts)
	if err != nil {
		t.Fatal(err)
	}
	f.slight = append(slices.Clone(f.base), "extra-a", "extra-b", "extra-c")
	f.heavy = slices.Clone(f.base)
	for i := 0; len(f.heavy) < 450 || len(f.oneHot) < 20; i++ {
		n := fmt.Sprintf("10.1.%d.%d", i/250, i%250)
		p := PartitionOf(ring.cfg.Partitions, n)
		if len(f.heavy) < 450 && inUse.Owners[p] == f.members[1] {
			f.heavy = append(f.heavy, n)
		}
		if len(f.oneHot) < 20 && p == 0 {
			f.oneHot = append(f.oneHot, n)
		}
	}
	return f
}

// The publication decision: only the first live member, while it may
// write, with nothing in flight and nothing tried within the interval,
// publishes; and only when no counts are published or the shares drifted
// past NodeLoad² of the mean where a new table would narrow them.
func TestBalancer_Step(t *testing.T) {
	f := newBalanceFixture(t)
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	oneHotHalf := EncodePartitionNodes(partitionCounts(f.ring.cfg.Partitions, f.oneHot[:10]))
	view := func(at time.Duration, nodes []string) BalanceView {
		return BalanceView{
			Now:    t0.Add(at),
			Ring:   f.ring,
			Live:   f.members,
			Active: true,
			Nodes:  nodes,
		}
	}
	// step runs b once at at and reports whether it asked to publish.
	step := func(t *testing.T, b *Balancer, v BalanceView) *PublishBalance {
		t.Helper()
		pub, err := b.Step(v)
		if err != nil {
			t.Fatal(err)
		}
		return pub
	}
	for _, tc := range []struct {
		name      string
		self      string // default: the first member
		published string // the Lease's counts ("" no Lease)
		// before runs steps at earlier times.
		before func(t *testing.T, b *Balancer)
		view   BalanceView
		want   string // a word of the reason; "" nothing published
	}{
		{name: "nothing published: the first member publishes", view: view(0, f.base), want: "no node counts published"},
		{name: "not the first member", self: "x-last", view: view(0, f.base)},
		{name: "no ring", view: func() BalanceView { v := view(0, f.base); v.Ring = nil; return v }()},
		{name: "lease not valid or leaving", view: func() BalanceView { v := view(0, f.base); v.Active = false; return v }()},
		{name: "no nodes", view: view(0, nil)},
		{name: "drift below the threshold", published: f.published, view: view(0, f.slight)},
		{name: "drift past the threshold", published: f.published, view: view(0, f.heavy), want: "members serve"},
		{name: "a new table would not narrow the shares", published: oneHotHalf, view: view(0, f.oneHot)},
		{
			name:      "looked within a second",
			published: f.published,
			before: func(t *testing.T, b *Balancer) {
				if pub := step(t, b, view(0, f.slight)); pub != nil {
					t.Fatalf("published below the threshold: %s", pub.Reason)
				}
			},
			view: view(999*time.Millisecond, f.heavy),
		},
		{
			name:      "looked a second ago",
			published: f.published,
			before: func(t *testing.T, b *Balancer) {
				step(t, b, view(0, f.slight))
			},
			view: view(time.Second, f.heavy),
			want: "members serve",
		},
		{
			name:      "a publication in flight",
			published: f.published,
			before: func(t *testing.T, b *Balancer) {
				if step(t, b, view(0, f.heavy)) == nil {
					t.Fatal("did not publish past the threshold")
				}
			},
			view: view(time.Minute, f.heavy),
		},
		{
			name:      "within the interval of the last publication",
			published: f.published,
			before: func(t *testing.T, b *Balancer) {
				step(t, b, view(0, f.heavy))
				b.Published()
			},
			view: view(balanceInterval-time.Millisecond, f.heavy),
		},
		{
			name:      "the interval after the last publication",
			published: f.published,
			before: func(t *testing.T, b *Balancer) {
				step(t, b, view(0, f.heavy))
				b.Published() // failed, say: the Lease still has the old counts
			},
			view: view(balanceInterval, f.heavy),
			want: "members serve",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			self := tc.self
			if self == "" {
				self = f.members[0]
			}
			b := NewBalancer(BalancerConfig{
				Self:       self,
				Partitions: f.ring.cfg.Partitions,
				Interval:   balanceInterval,
			})
			if err := b.Observe(tc.published != "", tc.published); err != nil {
				t.Fatal(err)
			}
			if tc.before != nil {
				tc.before(t, b)
			}
			pub := step(t, b, tc.view)
			switch {
			case tc.want == "" && pub != nil:
				t.Fatalf("published %v: %s", pub.Counts, pub.Reason)
			case tc.want == "":
				return
			case pub == nil:
				t.Fatalf("published nothing, want a publication (%s)", tc.want)
			case !strings.Contains(pub.Reason, tc.want):
				t.Fatalf("published because %q, want %q", pub.Reason, tc.want)
			}
			if want := partitionCounts(f.ring.cfg.Partitions, tc.view.Nodes); !slices.Equal(pub.Counts, want) {
				t.Fatalf("published %v, want the counts of the nodes seen %v", pub.Counts, want)
			}
			if !b.Publishing() {
				t.Fatal("a publication was asked for but is not in flight")
			}
		})
	}
}

// The table follows the counts observed: the ring's own without readable
// counts, the ring balanced with them otherwise; unreadable counts are
// reported once and ignored.
func TestBalancer_ObserveAndTable(t *testing.T) {
	f := newBalanceFixture(t)
	b := NewBalancer(BalancerConfig{
		Self:       f.members[0],
		Partitions: f.ring.cfg.Partitions,
		Interval:   balanceInterval,
	})
	table := func() []string {
		t.Helper()
		tb, err := b.Table(f.ring)
		if err != nil {
			t.Fatal(err)
		}
		return tb.Owners
	}
	if !slices.Equal(table(), f.ring.Table().Owners) {
		t.Fatal("without a balance Lease the table is not the ring's own")
	}
	if err := b.Observe(true, f.published); err != nil {
		t.Fatal(err)
	}
	counts := partitionCounts(f.ring.cfg.Partitions, f.base)
	balanced, _ := f.ring.Balanced(counts)
	if !slices.Equal(b.Counts(), counts) || !slices.Equal(table(), balanced.Owners) {
		t.Fatal("the table does not follow the published counts")
	}
	if slices.Equal(balanced.Owners, f.ring.Table().Owners) {
		t.Fatal("the fixture's counts balance to the ring's own table: the case shows nothing")
	}
	other, _ := NewRing(DefaultRingConfig(), f.members[1:])
	ob, _ := other.Balanced(counts)
	if tb, _ := b.Table(other); !slices.Equal(tb.Owners, ob.Owners) {
		t.Fatal("a new ring kept the old ring's table")
	}
	if err := b.Observe(true, "1,2,three"); err == nil {
		t.Fatal("unreadable counts were not reported")
	}
	if err := b.Observe(true, "1,2,three"); err != nil {
		t.Fatalf("the same unreadable counts were reported again: %v", err)
	}
	if b.Counts() != nil || !slices.Equal(table(), f.ring.Table().Owners) {
		t.Fatal("unreadable counts were used")
	}
	if err := b.Observe(true, f.published); err != nil || !slices.Equal(table(), balanced.Owners) {
		t.Fatalf("the counts published again were not used (%v)", err)
	}
	if err := b.Observe(false, ""); err != nil || b.Counts() != nil || !slices.Equal(table(), f.ring.Table().Owners) {
		t.Fatalf("the counts of a deleted Lease are still used (%v)", err)
	}
}

// Pending is what the status reports while the table is about to change:
// counts to publish that wait for the interval, or a publication in flight;
// never on a replica that is not the publisher.
func TestBalancer_Pending(t *testing.T) {
	f := newBalanceFixture(t)
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	b := NewBalancer(BalancerConfig{Self: f.members[0], Partitions: f.ring.cfg.Partitions, Interval: balanceInterval})
	step := func(at time.Duration, nodes []string) *PublishBalance {
		t.Helper()
		pub, err := b.Step(BalanceView{Now: t0.Add(at), Ring: f.ring, Live: f.members, Active: true, Nodes: nodes})
		if err != nil {
			t.Fatal(err)
		}
		return pub
	}
	observe := func(nodes []string) {
		t.Helper()
		b.Published()
		if err := b.Observe(true, EncodePartitionNodes(partitionCounts(f.ring.cfg.Partitions, nodes))); err != nil {
			t.Fatal(err)
		}
	}
	if b.Pending() {
		t.Fatal("pending before any look")
	}
	if step(0, f.base) == nil || !b.Pending() {
		t.Fatal("no counts published: want a publication, pending")
	}
	observe(f.base)
	if step(time.Second, f.base) != nil || b.Pending() {
		t.Fatal("the published counts are current: want nothing pending")
	}
	if step(2*time.Second, f.heavy) != nil {
		t.Fatal("published within the interval")
	}
	if !b.Pending() {
		t.Fatal("drift past the threshold, waiting for the interval: not pending")
	}
	if step(balanceInterval, f.heavy) == nil || !b.Pending() {
		t.Fatal("the interval passed: want a publication, pending")
	}
	observe(f.heavy)
	if step(balanceInterval+time.Second, f.heavy) != nil || b.Pending() {
		t.Fatal("the new counts are current: want nothing pending")
	}
	other := NewBalancer(BalancerConfig{Self: f.members[1], Partitions: f.ring.cfg.Partitions, Interval: balanceInterval})
	if pub, _ := other.Step(BalanceView{Now: t0, Ring: f.ring, Live: f.members, Active: true, Nodes: f.heavy}); pub != nil || other.Pending() {
		t.Fatal("a replica that does not publish reports pending")
	}
}
