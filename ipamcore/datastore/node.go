package datastore

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// ipRecord is one recorded non-primary address.
type ipRecord struct {
	addr        netip.Addr
	eni         *eniState
	state       IPState
	owner       Owner
	hold        HoldReason
	crossSubnet bool
	addedAt     time.Time
	idleSince   time.Time
	readyAt     time.Time
	seq         uint64 // heap tie-break: order of entering the idle pool
	heapIndex   int    // position in eni.idle, -1 when not idle
}

type eniState struct {
	info      ENI
	ips       map[netip.Addr]*ipRecord
	idle      idleHeap
	nIdle     int
	nAssigned int
	nHeld     int
}

// nodeState is the pure, unsynchronised state of one node. The Store wraps
// each nodeState in its own mutex; nothing here knows about other nodes
// (cross-node uniqueness is the Store's index).
type nodeState struct {
	name      string
	cooldown  time.Duration
	enis      map[string]*eniState
	ips       map[netip.Addr]*ipRecord
	primaries map[netip.Addr]string // primary IP -> ENI ID
	pods      map[PodKey]*ipRecord  // assigned records by pod
	nIdle     int
	nAssigned int
	nHeld     int
	seq       uint64
}

func newNodeState(name string, cooldown time.Duration) *nodeState {
	return &nodeState{
		name:      name,
		cooldown:  cooldown,
		enis:      make(map[string]*eniState),
		ips:       make(map[netip.Addr]*ipRecord),
		primaries: make(map[netip.Addr]string),
		pods:      make(map[PodKey]*ipRecord),
	}
}

// --- state transitions: every counter change goes through leave/enter* ---

func (n *nodeState) leave(r *ipRecord) {
	switch r.state {
	case StateIdle:
		r.eni.idle.remove(r)
		r.eni.nIdle--
		n.nIdle--
	case StateAssigned:
		delete(n.pods, r.owner.Pod())
		r.eni.nAssigned--
		n.nAssigned--
	case StateHeld:
		r.eni.nHeld--
		n.nHeld--
	}
	r.state = 0
	r.owner = Owner{}
	r.hold = HoldNone
	r.idleSince = time.Time{}
	r.readyAt = time.Time{}
}

// enterIdle puts r into the pool; readyAt = now + cool.
func (n *nodeState) enterIdle(r *ipRecord, now time.Time, cool time.Duration) {
	r.state = StateIdle
	r.idleSince = now
	r.readyAt = now.Add(cool)
	n.seq++
	r.seq = n.seq
	r.eni.idle.push(r)
	r.eni.nIdle++
	n.nIdle++
}

func (n *nodeState) enterAssigned(r *ipRecord, o Owner) {
	r.state = StateAssigned
	r.owner = o
	n.pods[o.Pod()] = r
	r.eni.nAssigned++
	n.nAssigned++
}

func (n *nodeState) enterHeld(r *ipRecord, why HoldReason) {
	r.state = StateHeld
	r.hold = why
	r.eni.nHeld++
	n.nHeld++
}

func (n *nodeState) forget(r *ipRecord) {
	n.leave(r)
	delete(r.eni.ips, r.addr)
	delete(n.ips, r.addr)
}

func (n *nodeState) info(r *ipRecord) IPInfo {
	return IPInfo{
		Node:        n.name,
		ENIID:       r.eni.info.ID,
		SubnetID:    r.eni.info.SubnetID,
		MAC:         r.eni.info.MAC,
		Addr:        r.addr,
		State:       r.state,
		Owner:       r.owner,
		HoldReason:  r.hold,
		CrossSubnet: r.crossSubnet,
		AddedAt:     r.addedAt,
		IdleSince:   r.idleSince,
		ReadyAt:     r.readyAt,
	}
}

// --- ENIs ---

func (n *nodeState) addENI(e ENI) error {
	if _, ok := n.enis[e.ID]; ok {
		return fmt.Errorf("node %s: eni %s: %w", n.name, e.ID, ErrENIExists)
	}
	if _, ok := n.ips[e.PrimaryIP]; ok {
		return fmt.Errorf("node %s: primary ip %s of eni %s is recorded as a secondary ip: %w",
			n.name, e.PrimaryIP, e.ID, ErrIPExists)
	}
	if other, ok := n.primaries[e.PrimaryIP]; ok {
		return fmt.Errorf("node %s: primary ip %s of eni %s is also primary of eni %s: %w",
			n.name, e.PrimaryIP, e.ID, other, ErrIPExists)
	}
	n.enis[e.ID] = &eniState{
		info: e,
		ips:  make(map[netip.Addr]*ipRecord),
	}
	n.primaries[e.PrimaryIP] = e.ID
	return nil
}

// removeENI forgets the ENI and every address on it, returning the records
// as they were so the caller can see which pods lost their address.
func (n *nodeState) removeENI(id string) ([]IPInfo, error) {
	e, ok := n.enis[id]
	if !ok {
		return nil, fmt.Errorf("node %s: eni %s: %w", n.name, id, ErrENINotFound)
	}
	out := make([]IPInfo, 0, len(e.ips))
	for _, r := range e.ips {
		out = append(out, n.info(r))
	}
	for _, r := range e.ips {
		n.forget(r)
	}
	delete(n.primaries, e.info.PrimaryIP)
	delete(n.enis, id)
	slices.SortFunc(out, func(a, b IPInfo) int { return a.Addr.Compare(b.Addr) })
	return out, nil
}

// --- adding and removing addresses ---

// checkNewAddr validates an address about to be recorded on eni e.
func (n *nodeState) checkNewAddr(a netip.Addr) error {
	if r, ok := n.ips[a]; ok {
		return fmt.Errorf("node %s: ip %s already on eni %s: %w", n.name, a, r.eni.info.ID, ErrIPExists)
	}
	if id, ok := n.primaries[a]; ok {
		return fmt.Errorf("node %s: ip %s is the primary ip of eni %s: %w", n.name, a, id, ErrIPExists)
	}
	return nil
}

func isCross(e *eniState, a netip.Addr) bool {
	p := e.info.SubnetCIDR
	return p.IsValid() && !p.Contains(a)
}

// addIdle records cloud-confirmed addresses as idle, all or nothing.
// Fresh addresses are ready at once: no pod ever used them.
func (n *nodeState) addIdle(eniID string, addrs []netip.Addr, now time.Time) error {
	e, ok := n.enis[eniID]
	if !ok {
		return fmt.Errorf("node %s: eni %s: %w", n.name, eniID, ErrENINotFound)
	}
	for i, a := range addrs {
		if err := n.checkNewAddr(a); err != nil {
			return err
		}
		if slices.Contains(addrs[:i], a) {
			return invalidf("node %s: ip %s listed twice", n.name, a)
		}
		if isCross(e, a) {
			return invalidf("node %s: ip %s is outside subnet %s of eni %s; cross-subnet ips must be added assigned",
				n.name, a, e.info.SubnetCIDR, eniID)
		}
	}
	for _, a := range addrs {
		r := &ipRecord{
			addr:      a,
			eni:       e,
			addedAt:   now,
			heapIndex: -1,
		}
		e.ips[a] = r
		n.ips[a] = r
		n.enterIdle(r, now, 0)
	}
	return nil
}

// addAssigned records a cloud-confirmed address that already belongs to a
// pod (a fixed-IP StatefulSet address re-added, a cross-subnet address),
// in one step so no Allocate can grab it in between.
func (n *nodeState) addAssigned(eniID string, a netip.Addr, o Owner, now time.Time) (IPInfo, error) {
	e, ok := n.enis[eniID]
	if !ok {
		return IPInfo{}, fmt.Errorf("node %s: eni %s: %w", n.name, eniID, ErrENINotFound)
	}
	if err := n.checkNewAddr(a); err != nil {
		return IPInfo{}, err
	}
	if r, ok := n.pods[o.Pod()]; ok {
		return IPInfo{}, fmt.Errorf("node %s: pod %s holds %s: %w", n.name, o.Pod(), r.addr, ErrPodHasIP)
	}
	r := &ipRecord{
		addr:        a,
		eni:         e,
		addedAt:     now,
		heapIndex:   -1,
		crossSubnet: isCross(e, a),
	}
	e.ips[a] = r
	n.ips[a] = r
	n.enterAssigned(r, o)
	return n.info(r), nil
}

// removeIP forgets a cloud-deleted address in any state and returns the
// record as it was.
func (n *nodeState) removeIP(a netip.Addr) (IPInfo, error) {
	r, ok := n.ips[a]
	if !ok {
		return IPInfo{}, fmt.Errorf("node %s: ip %s: %w", n.name, a, ErrUnknownIP)
	}
	info := n.info(r)
	n.forget(r)
	return info, nil
}

// --- allocation and release ---

// allocate hands out an idle address. Policy (the reference's, kept
// because spreading load over ENIs is what users see): among ENIs whose
// oldest idle address is ready, take the ENI with the most idle addresses
// (ties: smallest ENI ID, for determinism), and from it the address that
// has been usable longest. Cooling addresses are never handed out, even if
// nothing else is idle: see doc.go.
func (n *nodeState) allocate(req Request, now time.Time) (IPInfo, error) {
	o := req.Owner
	if r, ok := n.pods[o.Pod()]; ok {
		// A new sandbox of the same pod takes over the pod's address, so
		// nothing leaks and the old sandbox's late DEL is refused by the
		// container guard.
		r.owner.ContainerID = o.ContainerID
		return n.info(r), nil
	}
	var best *eniState
	var earliest time.Time
	cooling, candidates := 0, 0
	for _, e := range n.enis {
		if req.SubnetID != "" && e.info.SubnetID != req.SubnetID {
			continue
		}
		candidates++
		if e.nIdle == 0 {
			continue
		}
		if e.idle.readyHead(now) == nil {
			cooling += e.nIdle
			if h := e.idle.peek(); earliest.IsZero() || h.readyAt.Before(earliest) {
				earliest = h.readyAt
			}
			continue
		}
		if best == nil || e.nIdle > best.nIdle || (e.nIdle == best.nIdle && e.info.ID < best.info.ID) {
			best = e
		}
	}
	if best == nil {
		if cooling > 0 {
			return IPInfo{}, &CoolingError{
				Node:    n.name,
				Cooling: cooling,
				ReadyAt: earliest,
			}
		}
		where := ""
		if req.SubnetID != "" {
			where = " in subnet " + req.SubnetID
		}
		return IPInfo{}, fmt.Errorf("node %s: %d eni(s)%s: %w", n.name, candidates, where, ErrNoIdleIP)
	}
	r := best.idle.peek()
	n.leave(r)
	n.enterAssigned(r, o)
	return n.info(r), nil
}

// allocateSpecific assigns a given address. Cooling is ignored: the caller
// names the address (a fixed-IP StatefulSet pod getting its own IP back),
// so it is not a stranger inheriting someone else's traffic.
func (n *nodeState) allocateSpecific(a netip.Addr, o Owner) (IPInfo, error) {
	r, ok := n.ips[a]
	if !ok {
		return IPInfo{}, fmt.Errorf("node %s: ip %s: %w", n.name, a, ErrUnknownIP)
	}
	switch r.state {
	case StateAssigned:
		if r.owner.Pod() != o.Pod() {
			return IPInfo{}, fmt.Errorf("node %s: ip %s owned by %s: %w", n.name, a, r.owner, ErrIPInUse)
		}
		r.owner.ContainerID = o.ContainerID
		return n.info(r), nil
	case StateHeld:
		return IPInfo{}, fmt.Errorf("node %s: ip %s (%s): %w", n.name, a, r.hold, ErrHeld)
	}
	if other, ok := n.pods[o.Pod()]; ok {
		return IPInfo{}, fmt.Errorf("node %s: pod %s holds %s: %w", n.name, o.Pod(), other.addr, ErrPodHasIP)
	}
	n.leave(r)
	n.enterAssigned(r, o)
	return n.info(r), nil
}

func (n *nodeState) release(a netip.Addr, containerID string, now time.Time) (Released, error) {
	r, ok := n.ips[a]
	if !ok {
		return Released{}, fmt.Errorf("node %s: ip %s: %w", n.name, a, ErrUnknownIP)
	}
	switch r.state {
	case StateIdle:
		return Released{}, fmt.Errorf("node %s: ip %s: %w", n.name, a, ErrNotAssigned)
	case StateHeld:
		return Released{}, fmt.Errorf("node %s: ip %s (%s): %w", n.name, a, r.hold, ErrHeld)
	}
	if r.owner.ContainerID != containerID {
		return Released{}, fmt.Errorf("node %s: ip %s belongs to %s, not container %s: %w",
			n.name, a, r.owner, containerID, ErrContainerMismatch)
	}
	out := Released{Info: n.info(r)}
	if r.crossSubnet {
		n.forget(r)
		out.Removed = true
		return out, nil
	}
	n.leave(r)
	n.enterIdle(r, now, n.cooldown)
	return out, nil
}

// hold takes idle addresses out of the pool; addresses that are not idle
// (allocated since the caller planned) are skipped and not returned.
func (n *nodeState) hold(addrs []netip.Addr, why HoldReason) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		r, ok := n.ips[a]
		if !ok || r.state != StateIdle {
			continue
		}
		n.leave(r)
		n.enterHeld(r, why)
		out = append(out, a)
	}
	return out
}

// unhold returns a held address to the pool (owner nil; it cools as if
// just released, because a conflicting claimant may still use it) or
// assigns it to owner.
func (n *nodeState) unhold(a netip.Addr, o *Owner, now time.Time) (IPInfo, error) {
	r, ok := n.ips[a]
	if !ok {
		return IPInfo{}, fmt.Errorf("node %s: ip %s: %w", n.name, a, ErrUnknownIP)
	}
	if r.state != StateHeld {
		return IPInfo{}, fmt.Errorf("node %s: ip %s is %s: %w", n.name, a, r.state, ErrNotHeld)
	}
	if o == nil {
		if r.crossSubnet {
			return IPInfo{}, invalidf("node %s: cross-subnet ip %s cannot become idle; assign or remove it", n.name, a)
		}
		n.leave(r)
		n.enterIdle(r, now, n.cooldown)
		return n.info(r), nil
	}
	if other, ok := n.pods[o.Pod()]; ok {
		return IPInfo{}, fmt.Errorf("node %s: pod %s holds %s: %w", n.name, o.Pod(), other.addr, ErrPodHasIP)
	}
	n.leave(r)
	n.enterAssigned(r, *o)
	return n.info(r), nil
}

// --- reads ---

func (n *nodeState) stats(now time.Time) NodeStats {
	s := NodeStats{
		Node:     n.name,
		Total:    len(n.ips),
		Idle:     n.nIdle,
		Assigned: n.nAssigned,
		Held:     n.nHeld,
	}
	s.ENIs = make([]ENIStats, 0, len(n.enis))
	for _, e := range n.enis {
		es := ENIStats{
			ID: e.info.ID, SubnetID: e.info.SubnetID, Capacity: e.info.Capacity,
			Total: len(e.ips), Idle: e.nIdle, Assigned: e.nAssigned, Held: e.nHeld,
		}
		for _, r := range e.idle {
			if r.readyAt.After(now) {
				es.Cooling++
			}
		}
		s.Cooling += es.Cooling
		s.ENIs = append(s.ENIs, es)
	}
	slices.SortFunc(s.ENIs, func(a, b ENIStats) int { return strings.Compare(a.ID, b.ID) })
	return s
}

func (n *nodeState) snapshot() NodeSnapshot {
	s := NodeSnapshot{
		Node: n.name,
		ENIs: make([]ENISnapshot, 0, len(n.enis)),
	}
	for _, e := range n.enis {
		es := ENISnapshot{
			ENI: e.info,
			IPs: make([]IPInfo, 0, len(e.ips)),
		}
		for _, r := range e.ips {
			es.IPs = append(es.IPs, n.info(r))
		}
		slices.SortFunc(es.IPs, func(a, b IPInfo) int { return a.Addr.Compare(b.Addr) })
		s.ENIs = append(s.ENIs, es)
	}
	slices.SortFunc(s.ENIs, func(a, b ENISnapshot) int { return strings.Compare(a.ENI.ID, b.ENI.ID) })
	return s
}
