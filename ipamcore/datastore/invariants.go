package datastore

import (
	"errors"
	"fmt"
	"net/netip"
)

// Verify checks the whole store and returns every violation found:
// counters match the records, each ENI's idle heap holds exactly its idle
// records in heap order, the pod index holds exactly the assigned records,
// cross-subnet records are never idle, no address is a primary, and the
// cross-node indexes agree with the nodes (so no address is on two ENIs or
// two nodes). Tests call it after every step; a replica may call it from a
// debug endpoint or an e2e invariant check. It locks every node at once to
// see one consistent state, so it stalls all allocations while it runs: not
// for a hot path.
func (s *Store) Verify() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	// No other path holds two node locks, so taking them all cannot
	// deadlock; index writers hold a node lock, so the index is quiet too.
	for _, sl := range s.nodes {
		sl.mu.Lock()
		defer sl.mu.Unlock()
	}
	v := &verifier{
		s:      s,
		seenIP: make(map[netip.Addr]string),
	}
	ips, enis := 0, 0
	for name, sl := range s.nodes {
		v.node(name, sl)
		ips += len(sl.n.ips)
		enis += len(sl.n.enis)
	}
	s.idxMu.Lock()
	if len(s.ipOwner) != ips {
		v.bad("ip index has %d entries, nodes have %d ips", len(s.ipOwner), ips)
	}
	if len(s.eniOwner) != enis {
		v.bad("eni index has %d entries, nodes have %d enis", len(s.eniOwner), enis)
	}
	s.idxMu.Unlock()
	return errors.Join(v.errs...)
}

// verifier collects Verify's violations; the caller holds every lock.
type verifier struct {
	s      *Store
	errs   []error
	seenIP map[netip.Addr]string // address → node/eni it was first seen on
}

func (v *verifier) bad(format string, args ...any) {
	v.errs = append(v.errs, fmt.Errorf(format, args...))
}

// recordCounts counts records by state.
type recordCounts struct{ idle, assigned, held, total int }

// node checks one node: its ENIs, and its counters and indexes against them.
func (v *verifier) node(name string, sl *slot) {
	n := sl.n
	if n.name != name {
		v.bad("node %s stored under %s", n.name, name)
	}
	if sl.gone {
		v.bad("node %s: removed slot still in map", name)
	}
	var sum recordCounts
	for id, e := range n.enis {
		c := v.eni(name, sl, id, e)
		sum = recordCounts{sum.idle + c.idle, sum.assigned + c.assigned, sum.held + c.held, sum.total + c.total}
	}
	if sum.total != len(n.ips) || sum.idle != n.nIdle || sum.assigned != n.nAssigned || sum.held != n.nHeld {
		v.bad("node %s: counters total=%d/%d idle=%d/%d assigned=%d/%d held=%d/%d", name,
			len(n.ips), sum.total, n.nIdle, sum.idle, n.nAssigned, sum.assigned, n.nHeld, sum.held)
	}
	if len(n.pods) != n.nAssigned {
		v.bad("node %s: %d pods indexed, %d assigned", name, len(n.pods), n.nAssigned)
	}
	if len(n.primaries) != len(n.enis) {
		v.bad("node %s: %d primaries for %d enis", name, len(n.primaries), len(n.enis))
	}
}

// eni checks one ENI of a node: its records, counters, idle heap and index
// entry. It returns what it counted.
func (v *verifier) eni(name string, sl *slot, id string, e *eniState) recordCounts {
	n := sl.n
	if e.info.ID != id {
		v.bad("node %s: eni %s stored under %s", name, e.info.ID, id)
	}
	if n.primaries[e.info.PrimaryIP] != id {
		v.bad("node %s eni %s: primary %s not indexed", name, id, e.info.PrimaryIP)
	}
	var c recordCounts
	for a, r := range e.ips {
		switch v.record(name, sl, id, e, a, r) {
		case StateIdle:
			c.idle++
		case StateAssigned:
			c.assigned++
		case StateHeld:
			c.held++
		}
	}
	c.total = len(e.ips)
	if c.idle != e.nIdle || c.assigned != e.nAssigned || c.held != e.nHeld || len(e.idle) != c.idle {
		v.bad("node %s eni %s: counters idle=%d/%d(heap %d) assigned=%d/%d held=%d/%d",
			name, id, e.nIdle, c.idle, len(e.idle), e.nAssigned, c.assigned, e.nHeld, c.held)
	}
	for i := 1; i < len(e.idle); i++ {
		if less(e.idle[i], e.idle[(i-1)/2]) {
			v.bad("node %s eni %s: heap order broken at %d", name, id, i)
		}
	}
	if v.s.eniOwner[id] != sl {
		v.bad("node %s: eni %s missing from eni index", name, id)
	}
	return c
}

// record checks one address of an ENI and returns its state.
func (v *verifier) record(name string, sl *slot, id string, e *eniState, a netip.Addr, r *ipRecord) IPState {
	n := sl.n
	if r.addr != a || r.eni != e || n.ips[a] != r {
		v.bad("node %s eni %s: record %s misfiled", name, id, a)
	}
	if _, ok := n.primaries[a]; ok {
		v.bad("node %s: %s is both primary and secondary", name, a)
	}
	if prev, ok := v.seenIP[a]; ok {
		v.bad("ip %s on %s and on %s/%s", a, prev, name, id)
	}
	v.seenIP[a] = name + "/" + id
	switch r.state {
	case StateIdle:
		if r.heapIndex < 0 || r.heapIndex >= len(e.idle) || e.idle[r.heapIndex] != r {
			v.bad("node %s: idle %s not in its heap", name, a)
		}
		if r.crossSubnet {
			v.bad("node %s: cross-subnet %s is idle", name, a)
		}
		if r.owner != (Owner{}) || r.hold != HoldNone {
			v.bad("node %s: idle %s has owner or hold", name, a)
		}
	case StateAssigned:
		if r.heapIndex != -1 {
			v.bad("node %s: assigned %s in heap", name, a)
		}
		if n.pods[r.owner.Pod()] != r {
			v.bad("node %s: assigned %s not indexed under pod %s", name, a, r.owner.Pod())
		}
		if r.owner.validate() != nil {
			v.bad("node %s: assigned %s has bad owner %q", name, a, r.owner)
		}
	case StateHeld:
		if r.heapIndex != -1 || r.hold == HoldNone {
			v.bad("node %s: held %s in heap or without reason", name, a)
		}
	default:
		v.bad("node %s: %s in state %d", name, a, r.state)
	}
	if isCross(e, a) != r.crossSubnet {
		v.bad("node %s: %s cross-subnet flag wrong", name, a)
	}
	if v.s.ipOwner[a] != sl {
		v.bad("node %s: %s missing from ip index", name, a)
	}
	return r.state
}
