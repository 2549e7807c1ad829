package pool

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// Add is one BatchAddPrivateIP call: Count new addresses on ENI ENIID.
type Add struct {
	ENIID string
	Count int // 1..MaxIPsPerCall
}

// Skip says why an ENI got no add.
type Skip struct {
	ENIID  string
	Reason SkipReason
	Until  time.Time // for SkipBackoff
}

// SkipReason classifies a skipped ENI.
type SkipReason string

const (
	SkipSubnetExhausted SkipReason = "subnet-exhausted"
	SkipBackoff         SkipReason = "backoff"
	SkipENIFull         SkipReason = "eni-full"
)

// GrowPlan says how to grow one node's pool. Carry out Adds in order (each
// is one cloud call); on a capacity error record it with
// Config.Backoff.Fail and plan again. If NewENI is set, create and attach
// one ENI.
type GrowPlan struct {
	Need  int   // addresses wanted now (0: the pool is warm enough)
	Adds  []Add // how to get them, fewest-address ENI first
	Short int   // addresses no attached ENI can take now
	// WaitingShort is how many of the allocations waiting now the attached
	// ENIs cannot serve even once full (their idle addresses and all the
	// room of those that can grow): they wait for a new ENI whatever else
	// is added first.
	WaitingShort int
	// BeyondRoom is how many of the addresses wanted (Need) the attached
	// ENIs cannot take even once full: what a new ENI is created holding.
	BeyondRoom int
	Skips      []Skip // ENIs passed over, and why
	// NewENI asks for another ENI; ENIReason says why, or why not.
	NewENI    bool
	ENIReason string
}

// PlanGrow computes how to bring the node's idle pool back to its bounds.
//
// Need: when idle < MinIdle+Waiting, at least the shortfall and at least
// one Batch, but never more than MaxIdle+Waiting-idle, so that growing can
// never trigger a trim. The addresses go to the ENIs with the fewest
// addresses first (as the reference grows), skipping ENIs whose subnet is
// exhausted, whose backoff is active, or that are full, with at most
// MaxIPsPerCall (and the backoff's MaxBatch) per call.
func PlanGrow(cfg Config, capc Capacity, st NodeState, backoff map[string]Backoff, now time.Time) GrowPlan {
	var p GrowPlan
	idle := st.Idle()
	deficit := cfg.MinIdle + st.Waiting - idle
	if deficit > 0 {
		p.Need = min(max(deficit, cfg.Batch), cfg.MaxIdle+st.Waiting-idle)
	}

	enis := slices.Clone(st.ENIs)
	slices.SortFunc(enis, func(a, b ENIState) int {
		return cmp.Or(cmp.Compare(a.Total, b.Total), strings.Compare(a.ID, b.ID))
	})
	left := p.Need
	room := 0 // of the ENIs that can grow now
	for _, e := range enis {
		if b := backoff[e.ID]; !e.SubnetExhausted && !b.Active(now) {
			room += max(eniRoom(e, capc), 0)
		}
	}
	p.WaitingShort = max(0, st.Waiting-idle-room)
	p.BeyondRoom = max(0, p.Need-room)
	for _, e := range enis {
		if left == 0 {
			break
		}
		b := backoff[e.ID]
		switch {
		case e.SubnetExhausted:
			p.Skips = append(p.Skips, Skip{
				ENIID:  e.ID,
				Reason: SkipSubnetExhausted,
			})
			continue
		case b.Active(now):
			p.Skips = append(p.Skips, Skip{
				ENIID:  e.ID,
				Reason: SkipBackoff,
				Until:  b.Until,
			})
			continue
		}
		room := eniRoom(e, capc)
		if room <= 0 {
			p.Skips = append(p.Skips, Skip{
				ENIID:  e.ID,
				Reason: SkipENIFull,
			})
			continue
		}
		n := min(room, left, MaxIPsPerCall)
		if b.MaxBatch > 0 {
			n = min(n, b.MaxBatch)
		}
		p.Adds = append(p.Adds, Add{
			ENIID: e.ID,
			Count: n,
		})
		left -= n
	}
	p.Short = left
	p.NewENI, p.ENIReason = NeedENI(capc, st, backoff, p.Short, now)
	return p
}

// eniRoom is how many more pod addresses the ENI can take.
func eniRoom(e ENIState, capc Capacity) int {
	c := e.Capacity
	if c <= 0 {
		c = capc.MaxIPsPerENI
	}
	return c - 1 - e.Total
}

// NeedENI decides whether the node wants another ENI, following the
// reference's rule (§7.2): yes below PreAttachedENIs, no at MaxENIs,
// otherwise yes when the spare room on attached ENIs is below WarmIPTarget.
// Spare counts free room plus idle addresses, but only idle addresses on an
// ENI that cannot grow now (exhausted subnet or active backoff). It also
// says yes when short addresses could not be placed on any attached ENI.
// Never while an ENI is already being created.
func NeedENI(capc Capacity, st NodeState, backoff map[string]Backoff, short int, now time.Time) (bool, string) {
	attached := len(st.ENIs)
	switch {
	case st.ENIPending:
		return false, "an eni is already being created"
	case attached >= capc.MaxENIs:
		return false, "node has its maximum number of enis"
	case attached < capc.PreAttachedENIs:
		return true, "fewer enis than pre-attached count"
	}
	spare := 0
	for _, e := range st.ENIs {
		if e.SubnetExhausted || backoff[e.ID].Active(now) {
			spare += e.Idle
			continue
		}
		spare += max(eniRoom(e, capc), 0) + e.Idle
	}
	switch {
	case spare < capc.WarmIPTarget:
		return true, "spare addresses below warm ip target"
	case short > 0:
		return true, "attached enis cannot take the addresses needed"
	}
	return false, "attached enis have enough room"
}
