package shard

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// The nodes in the simulation: each replica runs planNodes after its
// Ownership step and carries the plan out as the driver does (a batch is
// served after a few ticks and may fail some of its nodes, which back off;
// a node takes a few ticks to stop). Checked:
//   - at every step, a replica starts only nodes of partitions it serves,
//     and keeps up only existing nodes of partitions it serves;
//   - at every tick, no node is up at two replicas whose leases are both
//     valid;
//   - a partition is released only once the replica's nodes of it have all
//     stopped;
//   - after settling, every node of a served partition is up at its owner,
//     and nowhere else.

// simBatch is a batch of nodes being served, done at due.
type simBatch struct {
	names []string
	due   time.Time
}

// addNodes creates n BCC nodes.
func (s *sim) addNodes(n int) {
	for range n {
		s.nextNode++
		s.nodes = append(s.nodes, fmt.Sprintf("node-%d", s.nextNode))
	}
	s.logf("%d nodes added: %d", n, len(s.nodes))
}

// deleteNodes deletes up to n random nodes.
func (s *sim) deleteNodes(n int) {
	for range min(n, len(s.nodes)) {
		i := s.rng.IntN(len(s.nodes))
		s.nodes = slices.Delete(s.nodes, i, i+1)
	}
	s.logf("%d nodes deleted: %d", n, len(s.nodes))
}

// jitter spreads a backoff as serveJitter does, from the simulation's
// random source so that a seed replays the same run.
func (s *sim) jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*s.rng.Float64()))
}

// finishIO applies r's I/O outcomes that are due, as the driver's loop does
// before a step: nodes stopped, a batch served, a publication written.
func (s *sim) finishIO(r *simReplica) {
	for _, n := range slices.Sorted(maps.Keys(r.stops)) {
		if !s.now.Before(r.stops[n]) {
			r.nodes.state[n] = nodeAbsent
			delete(r.stops, n)
		}
	}
	if b := r.batch; b != nil && !s.now.Before(b.due) {
		r.nodes.starting = false
		for _, n := range b.names {
			if s.failing && s.rng.IntN(10) == 0 {
				r.nodes.failed(n, s.now, s.jitter)
				continue
			}
			r.nodes.up(n)
		}
		r.batch = nil
	}
	s.finishPublication(r)
}

// serveNodes runs planNodes for r and starts what it says, checking that
// the plan follows r's Ownership.
func (s *sim) serveNodes(r *simReplica) {
	plan := planNodes(nodeInputs{
		now:        s.now,
		partitions: simPartitions,
		state:      r.own.State,
		served:     s.nodes,
		serving:    r.nodes,
	})
	for _, n := range plan.start {
		if p := PartitionOf(simPartitions, n); r.own.State(p) != Serving {
			s.t.Fatalf("%s starts node %s of partition %d at %s, which it does not serve (%s)\n%s",
				r.name, n, p, s.now.Format("15:04:05.0"), r.own.State(p), s.tail(30))
		}
	}
	r.nodes.begin(plan)
	for _, n := range plan.stop {
		r.stops[n] = s.now.Add(time.Duration(s.rng.IntN(5)) * simTick)
	}
	if len(plan.start) > 0 {
		r.batch = &simBatch{
			names: plan.start,
			due:   s.now.Add(time.Duration(1+s.rng.IntN(5)) * simTick),
		}
	}
	for _, n := range slices.Sorted(maps.Keys(r.nodes.state)) {
		p := PartitionOf(simPartitions, n)
		if r.nodes.state[n] == nodeUp && (r.own.State(p) != Serving || !slices.Contains(s.nodes, n)) {
			s.t.Fatalf("%s keeps node %s up at %s: partition %d is %s, the node exists: %v\n%s",
				r.name, n, s.now.Format("15:04:05.0"), p, r.own.State(p), slices.Contains(s.nodes, n), s.tail(30))
		}
	}
}

// nodesIdle: r serves no node, stops none and serves no batch.
func (r *simReplica) nodesIdle() bool {
	for _, st := range r.nodes.state {
		if st != nodeAbsent {
			return false
		}
	}
	return r.batch == nil
}

// checkNodes: no node is up at two replicas whose leases are both valid. A
// paused or cut-off replica counts while its lease is valid by its own
// clock: it could resume and write for its nodes at any moment. (A node
// still starting may belong to a partition fenced since its batch began:
// the IPAM's fence refuses its writes, and the step after the batch stops
// it.)
func (s *sim) checkNodes() {
	if s.naive {
		return
	}
	up := map[string][]string{}
	for _, r := range s.replicas {
		if r.crashed || !s.now.Before(r.own.LeaseValidUntil()) {
			continue
		}
		for n, st := range r.nodes.state {
			if st == nodeUp {
				up[n] = append(up[n], r.name)
			}
		}
	}
	for _, n := range slices.Sorted(maps.Keys(up)) {
		if len(up[n]) > 1 {
			s.t.Fatalf("node %s (partition %d) up at %v at %s, whose leases are all valid\n%s",
				n, PartitionOf(simPartitions, n), up[n], s.now.Format("15:04:05.0"), s.tail(30))
		}
	}
}

// checkRelease: r releases a partition only once its nodes have stopped.
func (s *sim) checkRelease(r *simReplica, a Action) {
	for _, n := range slices.Sorted(maps.Keys(r.nodes.state)) {
		if st := r.nodes.state[n]; st != nodeAbsent && PartitionOf(simPartitions, n) == a.Partition {
			s.t.Fatalf("%s releases partition %d (%s) at %s while its node %s is %s\n%s",
				r.name, a.Partition, a.Kind, s.now.Format("15:04:05.0"), n, st, s.tail(30))
		}
	}
}

// settledNodes: after settling, every node of a partition a live replica
// serves is up there, and no node is up anywhere else.
func (s *sim) settledNodes() {
	for _, r := range s.live() {
		for _, n := range s.nodes {
			p := PartitionOf(simPartitions, n)
			if serving, up := r.own.State(p) == Serving, r.nodes.state[n] == nodeUp; serving != up {
				s.t.Fatalf("after settling, %s serves partition %d: %v, but its node %s is up: %v\n%s",
					r.name, p, serving, n, up, s.tail(40))
			}
		}
		for n, st := range r.nodes.state {
			if st != nodeAbsent && !slices.Contains(s.nodes, n) {
				s.t.Fatalf("after settling, %s still serves the deleted node %s (%s)", r.name, n, st)
			}
		}
	}
}
