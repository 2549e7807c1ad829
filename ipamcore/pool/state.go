package pool

import (
	"net/netip"
	"time"

	"github.com/cce-ipam/sharded/ipamcore/datastore"
)

// ENIState is what the planner needs to know about one attached ENI.
type ENIState struct {
	ID       string
	Total    int // non-primary addresses recorded (idle + assigned + held)
	Idle     int
	Assigned int
	// Capacity includes the primary; 0 means "use Capacity.MaxIPsPerENI".
	Capacity int
	// SubnetExhausted: the ENI's subnet has no free address (Subnet CR
	// hasNoMoreIP, or DescribeSubnet said so). No adds are planned on it.
	SubnetExhausted bool
}

// IdleIP is one idle address, a trimming candidate.
type IdleIP struct {
	Addr      netip.Addr
	ENIID     string
	AddedAt   time.Time
	IdleSince time.Time
	ReadyAt   time.Time // cooling until then
}

// NodeState is one node's pool as the planner sees it.
type NodeState struct {
	ENIs []ENIState
	// IdleIPs lists the idle addresses (for PlanTrim; PlanGrow uses the
	// per-ENI counts).
	IdleIPs []IdleIP
	// Waiting counts allocations that found no usable address and are
	// waiting (the reference's passive events); they add to the demand.
	Waiting int
	// ENIPending: an ENI is being created or attached for this node, so no
	// second one is planned.
	ENIPending bool
}

// Idle returns the number of idle addresses on the node.
func (s NodeState) Idle() int {
	n := 0
	for _, e := range s.ENIs {
		n += e.Idle
	}
	return n
}

// StateFromSnapshot converts a datastore snapshot. exhausted says which
// subnets have no free address (may be nil); Waiting and ENIPending are
// left for the caller.
func StateFromSnapshot(snap datastore.NodeSnapshot, exhausted map[string]bool) NodeState {
	st := NodeState{ENIs: make([]ENIState, 0, len(snap.ENIs))}
	for _, es := range snap.ENIs {
		e := ENIState{
			ID:              es.ENI.ID,
			Capacity:        es.ENI.Capacity,
			SubnetExhausted: exhausted[es.ENI.SubnetID],
		}
		for _, ip := range es.IPs {
			e.Total++
			switch ip.State {
			case datastore.StateIdle:
				e.Idle++
				st.IdleIPs = append(st.IdleIPs, IdleIP{Addr: ip.Addr, ENIID: es.ENI.ID,
					AddedAt: ip.AddedAt, IdleSince: ip.IdleSince, ReadyAt: ip.ReadyAt})
			case datastore.StateAssigned:
				e.Assigned++
			case datastore.StateHeld:
				// An unsettled address returns to the pool as soon as a
				// cloud read confirms it (almost always): growing the pool
				// to replace it would only be trimmed again.
				if ip.HoldReason == datastore.HoldUnsettled {
					e.Idle++
				}
			}
		}
		st.ENIs = append(st.ENIs, e)
	}
	return st
}

// UsableNow lowers each ENI's idle count to the addresses an allocation could
// take at now: neither cooling nor held unsettled. A node just taken over
// plans with it while allocations wait, so that they get fresh addresses
// (proved by the add's reply) instead of waiting for the takeover's settling
// read and cooling; the surplus is trimmed later like any other.
func UsableNow(st NodeState, snap datastore.NodeSnapshot, now time.Time) NodeState {
	usable := map[string]int{}
	for _, es := range snap.ENIs {
		for _, ip := range es.IPs {
			if ip.State == datastore.StateIdle && !ip.ReadyAt.After(now) {
				usable[es.ENI.ID]++
			}
		}
	}
	out := st
	out.ENIs = make([]ENIState, len(st.ENIs))
	for k, e := range st.ENIs {
		e.Idle = usable[e.ID]
		out.ENIs[k] = e
	}
	return out
}
