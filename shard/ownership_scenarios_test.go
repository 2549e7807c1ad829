package shard

import (
	"testing"
	"time"
)

// Scripted runs on the simulation's harness (ownership_sim_test.go), one per
// decision the Ownership makes besides I1: the cold start's hold and its
// cap, joins and leaves that do not wait, the budget hold, and the release
// of claims a fenced stop left behind. Each fails when its decision is
// mutated (DESIGN.md lists the mutations tried).

// Replicas started a little apart, each within the settle time of the
// previous one, claim nothing until the replicas in view have settled, and
// then split the partitions once: every partition is claimed exactly once.
func TestOwnership_Simulation_ColdStartSplitsOnce(t *testing.T) {
	s := newSim(t, 1, 1)
	for i := range 40 { // a join every 1.5 s, below the 2 s settle
		if i == 15 || i == 30 {
			s.join()
		}
		s.tick()
	}
	s.settle()
	if s.won != simPartitions {
		t.Fatalf("a cold start of 3 replicas won %d claims for %d partitions: partitions were handed over\n%s",
			s.won, simPartitions, s.tail(20))
	}
}

// A view that never settles (a replica whose Lease keeps appearing and
// vanishing, never a ring member) holds a cold start back only up to the
// cap.
func TestOwnership_Simulation_ColdStartHoldIsCapped(t *testing.T) {
	s := newSim(t, 2, 2)
	s.phantom = true
	s.settle()
	for _, r := range s.live() {
		if took := r.firstClaim.Sub(time.Unix(1_000_000, 0)); r.firstClaim.IsZero() || took > simSettle+simLeaseDuration+simTick {
			t.Fatalf("%s first claimed after %s, want within the cap %s", r.name, took, simSettle+simLeaseDuration)
		}
	}
}

// A replica joining a running cluster takes its part at once, and a replica
// without a share of the budget claims nothing (checked at every step).
func TestOwnership_Simulation_JoinRunningClusterAtOnce(t *testing.T) {
	s := newSim(t, 3, 2)
	s.settle()
	r := s.join()
	r.noBudget = s.now.Add(time.Second)
	joined := s.now
	s.settle()
	if took := r.firstClaim.Sub(joined); took > time.Second+simSettle/4 {
		t.Fatalf("%s joined a running cluster and first claimed after %s (its budget came after 1 s): it waited for a settle", r.name, took)
	}
}

// A replica whose lease lapsed, without the others seeing it expire, is
// fenced and keeps its claims; if the ring meanwhile gave some of its
// partitions to a new replica, nobody could take them while its lease is
// fresh: it releases them.
func TestOwnership_Simulation_ReleasesOrphanedClaims(t *testing.T) {
	s := newSim(t, 4, 2)
	s.settle()
	r := s.replicas[0]
	r.pausedTo = s.now.Add(6 * time.Second) // past the renew deadline, within the lease
	r.staleTo = r.pausedTo
	for range 10 {
		s.tick()
	}
	s.join() // the ring moves some of r's partitions to the new replica
	s.settle()
}

// When one of two replicas leaves gracefully soon after a cold start (the
// settle's cap has not passed), the other takes the released partitions at
// once: a replica that already serves is past its cold start and does not
// wait for its view to settle.
func TestOwnership_Simulation_LeaveTakenOverAtOnce(t *testing.T) {
	s := newSim(t, 5, 2)
	for range 40 { // the cold start's claims are won after the 2 s settle
		s.tick()
	}
	stay, leave := s.replicas[0], s.replicas[1]
	if len(stay.own.Serving()) == 0 || len(leave.own.Serving()) == 0 {
		t.Fatalf("4 s into a cold start %s serves %d and %s %d partitions, want both a share",
			stay.name, len(stay.own.Serving()), leave.name, len(leave.own.Serving()))
	}
	leave.leaving = true
	s.logf("%s leaving", leave.name)
	start := s.now
	for len(stay.own.Serving()) < simPartitions {
		if s.now.Sub(start) > 5*time.Second {
			t.Fatalf("%s serves %d of %d partitions 5 s after %s started leaving\n%s",
				stay.name, len(stay.own.Serving()), simPartitions, leave.name, s.tail(20))
		}
		s.tick()
	}
	if took := s.now.Sub(start); took > simSettle*3/4 {
		t.Fatalf("%s took %s to serve the partitions %s handed over: it waited for a settle", stay.name, took, leave.name)
	}
}
