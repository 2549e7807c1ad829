package shard

import (
	"slices"
	"strconv"
	"testing"
	"time"
)

// The balance in the simulation: each replica runs its Balancer before its
// Ownership step, against the balance Lease as its watch shows it, and
// balances the ring to the table the Balancer gives (the Ownership's
// Wanted). A publication is written a few ticks after it was decided.
// Checked:
//   - at every decision to publish, the replica is the first by name of the
//     replicas that may write (not crashed, not leaving, lease valid by
//     their own clocks): replicas that see each other never both publish;
//   - after settling, counts are published (when there are nodes), no
//     publication is due any more, and every live replica balances to the
//     ring over the live replicas balanced with the published counts.

// simBalance is the balance Lease: its counts annotation and who wrote it.
type simBalance struct {
	present bool
	raw     string
	by      string
}

// simPublication is a publication in flight, written at due.
type simPublication struct {
	counts []int
	due    time.Time
}

// stepBalance shows r's Balancer the balance Lease and what r sees, starts
// the publication it asks for, and returns the owners r balances to.
func (s *sim) stepBalance(r *simReplica, members []string) []string {
	ring := s.ring(members)
	if err := r.bal.Observe(r.balSeen.present, r.balSeen.raw); err != nil {
		s.t.Fatal(err) // the simulation writes only counts it can read
	}
	pub, err := r.bal.Step(BalanceView{
		Now:    s.now,
		Ring:   ring,
		Live:   members,
		Active: s.now.Before(r.own.LeaseValidUntil()) && !r.leaving,
		Nodes:  s.nodes,
	})
	if err != nil {
		s.t.Fatal(err)
	}
	if pub != nil {
		s.checkPublisher(r)
		s.logf("%s publishes the counts of %d nodes: %s", r.name, len(s.nodes), pub.Reason)
		r.pub = &simPublication{
			counts: pub.Counts,
			due:    s.now.Add(time.Duration(1+s.rng.IntN(5)) * simTick),
		}
	}
	t, err := r.bal.Table(ring)
	if err != nil {
		s.t.Fatal(err)
	}
	return t.Owners
}

// finishPublication writes r's publication when it is due, and reports it.
func (s *sim) finishPublication(r *simReplica) {
	if r.pub == nil || s.now.Before(r.pub.due) {
		return
	}
	s.balance = simBalance{
		present: true,
		raw:     EncodePartitionNodes(r.pub.counts),
		by:      r.name,
	}
	s.published++
	r.pub = nil
	r.bal.Published()
}

// checkPublisher: r, deciding to publish, is the first by name of the
// replicas that may write now.
func (s *sim) checkPublisher(r *simReplica) {
	for _, o := range s.replicas {
		if o.name < r.name && !o.crashed && !o.leaving && s.now.Before(o.own.LeaseValidUntil()) {
			s.t.Fatalf("%s publishes the node counts at %s while %s, first by name, holds a valid lease\n%s",
				r.name, s.now.Format("15:04:05.0"), o.name, s.tail(30))
		}
	}
}

// settledTable checks, after settling, that counts are published while
// there are nodes, that no publication is due, and that every live replica
// balances to one table, which it returns.
func (s *sim) settledTable(names []string) []string {
	ring := s.ring(names)
	want := ring.Table()
	if s.balance.present {
		counts, err := DecodePartitionNodes(s.balance.raw, simPartitions)
		if err != nil {
			s.t.Fatal(err)
		}
		if want, err = ring.Balanced(counts); err != nil {
			s.t.Fatal(err)
		}
		reason, err := RebalanceReason(ring, want, partitionCounts(simPartitions, s.nodes))
		if err != nil {
			s.t.Fatal(err)
		}
		if reason != "" {
			s.t.Fatalf("after settling, the published counts are still due to be replaced: %s\n%s", reason, s.tail(40))
		}
	} else if len(s.nodes) > 0 {
		s.t.Fatalf("after settling, no node counts are published for %d nodes\n%s", len(s.nodes), s.tail(40))
	}
	for _, r := range s.live() {
		t, err := r.bal.Table(ring)
		if err != nil {
			s.t.Fatal(err)
		}
		if !slices.Equal(t.Owners, want.Owners) {
			s.t.Fatalf("after settling, %s balances to another table than the published counts give\n%s", r.name, s.tail(40))
		}
	}
	return want.Owners
}

// Nodes added in bulk to one replica's partitions drift the shares past
// NodeLoad² of the mean: the first member publishes the new counts once,
// within the interval, and the replicas move to the new table; the others
// never publish (checked at every decision).
func TestOwnership_Simulation_BalanceFollowsNodes(t *testing.T) {
	s := newSim(t, 6, 3)
	s.settle()
	if s.published != 1 || s.balance.by != "r1" {
		t.Fatalf("a cold start published %d times (last by %q), want once by r1", s.published, s.balance.by)
	}
	before := s.settledTable([]string{"r1", "r2", "r3"})
	// 120 more nodes, all in r3's partitions.
	for s.nextNode < 10_000 && len(s.nodes) < simNodes+120 {
		s.nextNode++
		if n := "node-" + strconv.Itoa(s.nextNode); before[PartitionOf(simPartitions, n)] == "r3" {
			s.nodes = append(s.nodes, n)
		}
	}
	added := s.now
	for s.published == 1 && s.now.Sub(added) < balanceInterval+2*time.Second {
		s.tick()
	}
	if s.published != 2 || s.balance.by != "r1" {
		t.Fatalf("%s after the nodes were added: %d publications (last by %q), want a second one by r1",
			s.now.Sub(added), s.published, s.balance.by)
	}
	s.settle()
	after := s.settledTable([]string{"r1", "r2", "r3"})
	if s.published != 2 {
		t.Fatalf("the counts were published %d times, want twice", s.published)
	}
	if slices.Equal(before, after) {
		t.Fatal("the table did not move with the nodes")
	}
}
