package shard

import (
	"maps"
	"slices"
	"testing"
	"time"
)

// The node plan serves exactly the BCC nodes of Serving partitions: it
// starts them in one batch (not while one runs, nor while claims in flight
// may still join it, up to claimSettle), leaves failed ones to their
// backoff, and stops nodes up whose partition left Serving or that are gone.
func TestPlanNodes(t *testing.T) {
	const partitions = 7
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	// Nodes by partition: find names that hash into partitions 1 and 2.
	var in1, in2 []string
	for i := 0; len(in1) < 3 || len(in2) < 2; i++ {
		n := "node-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		switch PartitionOf(partitions, n) {
		case 1:
			in1 = append(in1, n)
		case 2:
			in2 = append(in2, n)
		}
	}
	in1, in2 = in1[:3], in2[:2]
	state := func(p int) PartitionState {
		if p == 1 {
			return Serving
		}
		return Unowned
	}
	base := func() nodeInputs {
		return nodeInputs{
			now:        now,
			partitions: partitions,
			state:      state,
			served:     append(slices.Clone(in1), in2...),
			serving: nodeServing{
				state:   map[string]nodeState{},
				retryAt: map[string]time.Time{},
			},
		}
	}
	sorted1 := slices.Sorted(slices.Values(in1))

	in := base()
	if p := planNodes(in); !slices.Equal(p.start, sorted1) || len(p.stop) != 0 {
		t.Fatalf("fresh: start %v stop %v, want start %v", p.start, p.stop, sorted1)
	}
	in.serving.retryAt[in1[0]] = now.Add(time.Second) // backing off
	if p := planNodes(in); len(p.start) != 2 || slices.Contains(p.start, in1[0]) {
		t.Fatalf("a node in its backoff was started: %v", p.start)
	}
	in = base()
	in.serving.starting = true
	if p := planNodes(in); len(p.start) != 0 {
		t.Fatalf("started %v while a batch is being served", p.start)
	}
	in = base()
	in.claimsInFlight, in.claimsSince = 1, now.Add(-2*time.Second)
	if p := planNodes(in); len(p.start) != 0 {
		t.Fatalf("started %v while a claim has been in flight for 2 s", p.start)
	}
	in.claimsSince = now.Add(-claimSettle)
	if p := planNodes(in); len(p.start) != 3 {
		t.Fatalf("the wait for claims in flight is not bounded: start %v", p.start)
	}
	in = base()
	in.served = append(slices.Clone(in1[1:]), in2...) // in1[0] is gone
	in.serving.state[in1[0]] = nodeUp
	in.serving.state[in1[1]] = nodeUp
	in.serving.state[in2[0]] = nodeUp // its partition is not Serving
	in.serving.state[in2[1]] = nodeStopping
	p := planNodes(in)
	if want := slices.Sorted(slices.Values([]string{in1[0], in2[0]})); !slices.Equal(p.stop, want) {
		t.Fatalf("stop %v, want %v", p.stop, want)
	}
	if !slices.Equal(p.start, []string{in1[2]}) {
		t.Fatalf("start %v, want [%s]", p.start, in1[2])
	}
}

// The driver's record of its nodes: a plan under way marks its nodes
// stopping and starting; a failed node backs off, doubling, until it is
// served; a partition is busy while any of its nodes is not absent.
func TestNodeServing_Bookkeeping(t *testing.T) {
	const partitions = 7
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	s := nodeServing{
		state: map[string]nodeState{
			"up":   nodeUp,
			"gone": nodeAbsent,
		},
		retryAt:    map[string]time.Time{},
		retryDelay: map[string]time.Duration{},
	}
	s.begin(nodePlan{
		start: []string{"new"},
		stop:  []string{"up"},
	})
	want := map[string]nodeState{
		"up":  nodeStopping,
		"new": nodeStarting,
	}
	if !maps.Equal(s.state, want) || !s.starting {
		t.Fatalf("after begin: %v (starting %v), want %v and a batch starting", s.state, s.starting, want)
	}
	if busy := s.busy(partitions); !busy(PartitionOf(partitions, "up")) || !busy(PartitionOf(partitions, "new")) {
		t.Fatal("a partition with a node stopping or starting is not busy")
	}
	same := func(d time.Duration) time.Duration { return d }
	for _, delay := range []time.Duration{serveRetryMin, 2 * serveRetryMin, 4 * serveRetryMin} {
		wait, got := s.failed("new", now, same)
		if got != delay || wait != delay || !s.retryAt["new"].Equal(now.Add(delay)) || s.state["new"] != nodeAbsent {
			t.Fatalf("failed: backoff %s, wait %s, retry at %s, state %s; want %s", got, wait, s.retryAt["new"], s.state["new"], delay)
		}
	}
	s.up("new")
	if s.state["new"] != nodeUp || len(s.retryAt) != 0 || len(s.retryDelay) != 0 {
		t.Fatalf("up: state %s, backoffs %v %v; want up and no backoff", s.state["new"], s.retryAt, s.retryDelay)
	}
	s.state["up"] = nodeAbsent // stopped
	s.state["new"] = nodeAbsent
	if busy := s.busy(partitions); busy(PartitionOf(partitions, "up")) || busy(PartitionOf(partitions, "new")) {
		t.Fatal("a partition whose nodes have all stopped is busy")
	}
}
