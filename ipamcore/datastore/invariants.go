package datastore

import (
	"errors"
	"fmt"
	"net/netip"
)

// Verify checks the whole store and returns every violation found:
// counters match the records, each ENI's idle heap holds exactly its idle records in heap order, the
// pod index holds exactly the assigned records, cross-subnet records are
// never idle, no address is a primary, and the cross-node indexes agree
// with the nodes (so no address is on two ENIs or two nodes). Tests call it
// after every step; a replica may call it from a debug endpoint or an e2e
// invariant check. It locks every node at once to see one consistent
// state, so it stalls all allocations while it runs: not for a hot path.
func (s *Store) Verify() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	// No other path holds two node locks, so taking them all cannot
	// deadlock; index writers hold a node lock, so the index is quiet too.
	for _, sl := range s.nodes {
		sl.mu.Lock()
		defer sl.mu.Unlock()
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	seenIP := make(map[netip.Addr]string)
	ips, enis := 0, 0
	for name, sl := range s.nodes {
		n := sl.n
		if n.name != name {
			bad("node %s stored under %s", n.name, name)
		}
		if sl.gone {
			bad("node %s: removed slot still in map", name)
		}
		var idle, assigned, held, total int
		for id, e := range n.enis {
			if e.info.ID != id {
				bad("node %s: eni %s stored under %s", name, e.info.ID, id)
			}
			if n.primaries[e.info.PrimaryIP] != id {
				bad("node %s eni %s: primary %s not indexed", name, id, e.info.PrimaryIP)
			}
			var ei, ea, eh int
			for a, r := range e.ips {
				if r.addr != a || r.eni != e || n.ips[a] != r {
					bad("node %s eni %s: record %s misfiled", name, id, a)
				}
				if _, ok := n.primaries[a]; ok {
					bad("node %s: %s is both primary and secondary", name, a)
				}
				if prev, ok := seenIP[a]; ok {
					bad("ip %s on %s and on %s/%s", a, prev, name, id)
				}
				seenIP[a] = name + "/" + id
				switch r.state {
				case StateIdle:
					ei++
					if r.heapIndex < 0 || r.heapIndex >= len(e.idle) || e.idle[r.heapIndex] != r {
						bad("node %s: idle %s not in its heap", name, a)
					}
					if r.crossSubnet {
						bad("node %s: cross-subnet %s is idle", name, a)
					}
					if r.owner != (Owner{}) || r.hold != HoldNone {
						bad("node %s: idle %s has owner or hold", name, a)
					}
				case StateAssigned:
					ea++
					if r.heapIndex != -1 {
						bad("node %s: assigned %s in heap", name, a)
					}
					if n.pods[r.owner.Pod()] != r {
						bad("node %s: assigned %s not indexed under pod %s", name, a, r.owner.Pod())
					}
					if r.owner.validate() != nil {
						bad("node %s: assigned %s has bad owner %q", name, a, r.owner)
					}
				case StateHeld:
					eh++
					if r.heapIndex != -1 || r.hold == HoldNone {
						bad("node %s: held %s in heap or without reason", name, a)
					}
				default:
					bad("node %s: %s in state %d", name, a, r.state)
				}
				if isCross(e, a) != r.crossSubnet {
					bad("node %s: %s cross-subnet flag wrong", name, a)
				}
				if s.ipOwner[a] != sl {
					bad("node %s: %s missing from ip index", name, a)
				}
			}
			if ei != e.nIdle || ea != e.nAssigned || eh != e.nHeld || len(e.idle) != ei {
				bad("node %s eni %s: counters idle=%d/%d(heap %d) assigned=%d/%d held=%d/%d",
					name, id, e.nIdle, ei, len(e.idle), e.nAssigned, ea, e.nHeld, eh)
			}
			for i := 1; i < len(e.idle); i++ {
				if less(e.idle[i], e.idle[(i-1)/2]) {
					bad("node %s eni %s: heap order broken at %d", name, id, i)
				}
			}
			idle, assigned, held, total = idle+ei, assigned+ea, held+eh, total+len(e.ips)
			if s.eniOwner[id] != sl {
				bad("node %s: eni %s missing from eni index", name, id)
			}
		}
		if total != len(n.ips) || idle != n.nIdle || assigned != n.nAssigned || held != n.nHeld {
			bad("node %s: counters total=%d/%d idle=%d/%d assigned=%d/%d held=%d/%d", name,
				len(n.ips), total, n.nIdle, idle, n.nAssigned, assigned, n.nHeld, held)
		}
		if len(n.pods) != n.nAssigned {
			bad("node %s: %d pods indexed, %d assigned", name, len(n.pods), n.nAssigned)
		}
		if len(n.primaries) != len(n.enis) {
			bad("node %s: %d primaries for %d enis", name, len(n.primaries), len(n.enis))
		}
		ips += len(n.ips)
		enis += len(n.enis)
	}
	s.idxMu.Lock()
	if len(s.ipOwner) != ips {
		bad("ip index has %d entries, nodes have %d ips", len(s.ipOwner), ips)
	}
	if len(s.eniOwner) != enis {
		bad("eni index has %d entries, nodes have %d enis", len(s.eniOwner), enis)
	}
	s.idxMu.Unlock()
	return errors.Join(errs...)
}
