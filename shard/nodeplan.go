package shard

import (
	"sort"
	"time"
)

// nodeInputs is what the node plan is decided from.
type nodeInputs struct {
	now        time.Time
	partitions int
	// state is a partition's Ownership state.
	state func(p int) PartitionState
	// served are the BCC nodes that exist (servedNodes).
	served  []string
	serving nodeServing
	// claims in flight, and since when the oldest has been.
	claimsInFlight int
	claimsSince    time.Time
}

// nodePlan is what to do to the nodes now.
type nodePlan struct {
	// start is one batch to serve (sorted); empty while a batch is being
	// served, or while claims in flight may still join it.
	start []string
	// stop are nodes up that are no longer to be served.
	stop []string
}

// planNodes decides which nodes to start and stop so that exactly the BCC
// nodes of Serving partitions are served: a node that failed waits for its
// backoff; claims won together are served together, one ENI list and one
// wep read for all (the cloud allows ListENIs about once a second for the
// whole cluster), so a batch waits for the claims in flight, up to
// claimSettle (DESIGN.md, "Serving in batches"). It is pure.
func planNodes(in nodeInputs) nodePlan {
	var plan nodePlan
	exists := make(map[string]bool, len(in.served))
	var start []string
	for _, name := range in.served {
		exists[name] = true
		if in.state(PartitionOf(in.partitions, name)) == Serving && in.serving.state[name] == nodeAbsent &&
			!in.now.Before(in.serving.retryAt[name]) {
			start = append(start, name)
		}
	}
	for name, st := range in.serving.state {
		if st == nodeUp && (in.state(PartitionOf(in.partitions, name)) != Serving || !exists[name]) {
			plan.stop = append(plan.stop, name)
		}
	}
	sort.Strings(plan.stop)
	settling := in.claimsInFlight > 0 && in.now.Sub(in.claimsSince) < claimSettle
	if len(start) > 0 && !in.serving.starting && !settling {
		sort.Strings(start)
		plan.start = start
	}
	return plan
}

// claimSettle bounds how long nodes already won wait for the claims still
// in flight before they are served: about the time a cold start's claims
// take at the default API rate.
const claimSettle = 4 * time.Second

// busy reports the partitions with nodes not yet stopped (View.Busy): a
// draining partition is released only once all its nodes have stopped.
func (s nodeServing) busy(partitions int) func(p int) bool {
	b := map[int]bool{}
	for name, st := range s.state {
		if st != nodeAbsent {
			b[PartitionOf(partitions, name)] = true
		}
	}
	return func(p int) bool { return b[p] }
}

// begin records that plan is being carried out: its nodes to stop are
// stopping, its batch is starting; nodes that have stopped are forgotten.
func (s *nodeServing) begin(plan nodePlan) {
	for _, name := range plan.stop {
		s.state[name] = nodeStopping
	}
	for name, st := range s.state {
		if st == nodeAbsent {
			delete(s.state, name)
		}
	}
	if len(plan.start) > 0 {
		s.starting = true
		for _, name := range plan.start {
			s.state[name] = nodeStarting
		}
	}
}

// up records that a node of the batch is served.
func (s *nodeServing) up(name string) {
	s.state[name] = nodeUp
	delete(s.retryAt, name)
	delete(s.retryDelay, name)
}

// failed records that a node of the batch could not be served at now: it
// waits for its backoff, spread by jitter, before it is tried again.
func (s *nodeServing) failed(name string, now time.Time, jitter func(time.Duration) time.Duration) (wait, delay time.Duration) {
	s.state[name] = nodeAbsent
	delay = serveBackoff(s.retryDelay[name])
	s.retryDelay[name] = delay
	wait = jitter(delay)
	s.retryAt[name] = now.Add(wait)
	return wait, delay
}
