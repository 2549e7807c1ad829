package datastore

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// model is the simple reference the property and fuzz tests compare the
// Store against: flat maps, linear scans, no heap, no index. It encodes the
// documented behaviour directly, in the same order of checks.
type model struct {
	cooldown time.Duration
	nodes    map[string]int // node -> idle seq counter
	enis     map[string]mENI
	ips      map[netip.Addr]*mIP
}

type mENI struct {
	node string
	info ENI
}

type mIP struct {
	node, eni string
	state     IPState
	owner     Owner
	hold      HoldReason
	cross     bool
	addedAt   time.Time
	idleSince time.Time
	readyAt   time.Time
	seq       int
}

func newModel(cooldown time.Duration) *model {
	return &model{cooldown: cooldown, nodes: map[string]int{}, enis: map[string]mENI{}, ips: map[netip.Addr]*mIP{}}
}

func (m *model) idle(r *mIP, now time.Time, cool time.Duration) {
	m.nodes[r.node]++
	*r = mIP{node: r.node, eni: r.eni, cross: r.cross, addedAt: r.addedAt,
		state: StateIdle, idleSince: now, readyAt: now.Add(cool), seq: m.nodes[r.node]}
}

func (m *model) assign(r *mIP, o Owner) {
	*r = mIP{node: r.node, eni: r.eni, cross: r.cross, addedAt: r.addedAt, state: StateAssigned, owner: o}
}

func (m *model) holdIP(r *mIP, why HoldReason) {
	*r = mIP{node: r.node, eni: r.eni, cross: r.cross, addedAt: r.addedAt, state: StateHeld, hold: why}
}

func (m *model) cross(eniID string, a netip.Addr) bool {
	p := m.enis[eniID].info.SubnetCIDR
	return p.IsValid() && !p.Contains(a)
}

func (m *model) isPrimaryOn(node string, a netip.Addr) bool {
	for _, e := range m.enis {
		if e.node == node && e.info.PrimaryIP == a {
			return true
		}
	}
	return false
}

func (m *model) podIP(node string, p PodKey) *mIP {
	for _, r := range m.ips {
		if r.node == node && r.state == StateAssigned && r.owner.Pod() == p {
			return r
		}
	}
	return nil
}

func (m *model) addNode(n string) error {
	if _, ok := m.nodes[n]; ok {
		return ErrNodeExists
	}
	m.nodes[n] = 0
	return nil
}

func (m *model) removeNode(n string) error {
	if _, ok := m.nodes[n]; !ok {
		return ErrNodeNotFound
	}
	m.dropNodeState(n)
	delete(m.nodes, n)
	return nil
}

func (m *model) dropNodeState(n string) {
	for a, r := range m.ips {
		if r.node == n {
			delete(m.ips, a)
		}
	}
	for id, e := range m.enis {
		if e.node == n {
			delete(m.enis, id)
		}
	}
}

func (m *model) addENI(n string, e ENI) error {
	if _, ok := m.nodes[n]; !ok {
		return ErrNodeNotFound
	}
	if cur, ok := m.enis[e.ID]; ok && cur.node != n {
		return ErrENIExists
	}
	if r, ok := m.ips[e.PrimaryIP]; ok && r.node != n {
		return ErrIPExists
	}
	if _, ok := m.enis[e.ID]; ok {
		return ErrENIExists
	}
	if _, ok := m.ips[e.PrimaryIP]; ok || m.isPrimaryOn(n, e.PrimaryIP) {
		return ErrIPExists
	}
	m.enis[e.ID] = mENI{node: n, info: e}
	return nil
}

func (m *model) removeENI(n, id string) error {
	if _, ok := m.nodes[n]; !ok {
		return ErrNodeNotFound
	}
	if e, ok := m.enis[id]; !ok || e.node != n {
		return ErrENINotFound
	}
	for a, r := range m.ips {
		if r.eni == id {
			delete(m.ips, a)
		}
	}
	delete(m.enis, id)
	return nil
}

func (m *model) onENI(n, id string) bool {
	e, ok := m.enis[id]
	return ok && e.node == n
}

func (m *model) addIPs(n, id string, addrs []netip.Addr, now time.Time) error {
	if _, ok := m.nodes[n]; !ok {
		return ErrNodeNotFound
	}
	for _, a := range addrs {
		if r, ok := m.ips[a]; ok && r.node != n {
			return ErrIPExists
		}
	}
	if !m.onENI(n, id) {
		return ErrENINotFound
	}
	for i, a := range addrs {
		if _, ok := m.ips[a]; ok || m.isPrimaryOn(n, a) {
			return ErrIPExists
		}
		if slices.Contains(addrs[:i], a) || m.cross(id, a) {
			return ErrInvalidArgument
		}
	}
	for _, a := range addrs {
		r := &mIP{node: n, eni: id, addedAt: now}
		m.ips[a] = r
		m.idle(r, now, 0)
	}
	return nil
}

func (m *model) addAssigned(n, id string, a netip.Addr, o Owner, now time.Time) error {
	if _, ok := m.nodes[n]; !ok {
		return ErrNodeNotFound
	}
	if r, ok := m.ips[a]; ok && r.node != n {
		return ErrIPExists
	}
	if !m.onENI(n, id) {
		return ErrENINotFound
	}
	if _, ok := m.ips[a]; ok || m.isPrimaryOn(n, a) {
		return ErrIPExists
	}
	if m.podIP(n, o.Pod()) != nil {
		return ErrPodHasIP
	}
	r := &mIP{node: n, eni: id, addedAt: now, cross: m.cross(id, a)}
	m.ips[a] = r
	m.assign(r, o)
	return nil
}

func (m *model) removeIP(n string, a netip.Addr) error {
	if _, ok := m.nodes[n]; !ok {
		return ErrNodeNotFound
	}
	if r, ok := m.ips[a]; !ok || r.node != n {
		return ErrUnknownIP
	}
	delete(m.ips, a)
	return nil
}

// allocate returns the expected address, or the expected error and, for
// cooling, the expected ReadyAt and count.
func (m *model) allocate(n string, req Request, now time.Time) (netip.Addr, time.Time, int, error) {
	if _, ok := m.nodes[n]; !ok {
		return netip.Addr{}, time.Time{}, 0, ErrNodeNotFound
	}
	if r := m.podIP(n, req.Owner.Pod()); r != nil {
		r.owner.ContainerID = req.Owner.ContainerID
		return m.addrOf(r), time.Time{}, 0, nil
	}
	type cand struct {
		id          string
		idle, ready int
		first       *mIP
		firstAddr   netip.Addr
	}
	var cands []cand
	var earliest time.Time
	cooling := 0
	for id, e := range m.enis {
		if e.node != n || (req.SubnetID != "" && e.info.SubnetID != req.SubnetID) {
			continue
		}
		c := cand{id: id}
		for a, r := range m.ips {
			if r.eni != id || r.state != StateIdle {
				continue
			}
			c.idle++
			if !r.readyAt.After(now) {
				c.ready++
			}
			if c.first == nil || r.readyAt.Before(c.first.readyAt) || (r.readyAt.Equal(c.first.readyAt) && r.seq < c.first.seq) {
				c.first, c.firstAddr = r, a
			}
		}
		if c.idle > 0 && c.ready == 0 {
			cooling += c.idle
			if earliest.IsZero() || c.first.readyAt.Before(earliest) {
				earliest = c.first.readyAt
			}
		}
		if c.ready > 0 {
			cands = append(cands, c)
		}
	}
	if len(cands) == 0 {
		if cooling > 0 {
			return netip.Addr{}, earliest, cooling, ErrIPCooling
		}
		return netip.Addr{}, time.Time{}, 0, ErrNoIdleIP
	}
	best := slices.MinFunc(cands, func(a, b cand) int { return cmp.Or(cmp.Compare(b.idle, a.idle), strings.Compare(a.id, b.id)) })
	m.assign(best.first, req.Owner)
	return best.firstAddr, time.Time{}, 0, nil
}

func (m *model) addrOf(r *mIP) netip.Addr {
	for a, x := range m.ips {
		if x == r {
			return a
		}
	}
	panic("record not in model")
}

func (m *model) allocateSpecific(n string, a netip.Addr, o Owner) error {
	if _, ok := m.nodes[n]; !ok {
		return ErrNodeNotFound
	}
	r, ok := m.ips[a]
	if !ok || r.node != n {
		return ErrUnknownIP
	}
	switch r.state {
	case StateAssigned:
		if r.owner.Pod() != o.Pod() {
			return ErrIPInUse
		}
		r.owner.ContainerID = o.ContainerID
		return nil
	case StateHeld:
		return ErrHeld
	}
	if m.podIP(n, o.Pod()) != nil {
		return ErrPodHasIP
	}
	m.assign(r, o)
	return nil
}

func (m *model) release(n string, a netip.Addr, cid string, now time.Time) (bool, error) {
	if _, ok := m.nodes[n]; !ok {
		return false, ErrNodeNotFound
	}
	r, ok := m.ips[a]
	if !ok || r.node != n {
		return false, ErrUnknownIP
	}
	switch {
	case r.state == StateIdle:
		return false, ErrNotAssigned
	case r.state == StateHeld:
		return false, ErrHeld
	case r.owner.ContainerID != cid:
		return false, ErrContainerMismatch
	case r.cross:
		delete(m.ips, a)
		return true, nil
	}
	m.idle(r, now, m.cooldown)
	return false, nil
}

func (m *model) hold(n string, addrs []netip.Addr, why HoldReason) ([]netip.Addr, error) {
	if _, ok := m.nodes[n]; !ok {
		return nil, ErrNodeNotFound
	}
	var out []netip.Addr
	for _, a := range addrs {
		if r, ok := m.ips[a]; ok && r.node == n && r.state == StateIdle {
			m.holdIP(r, why)
			out = append(out, a)
		}
	}
	return out, nil
}

func (m *model) unhold(n string, a netip.Addr, o *Owner, now time.Time) error {
	if _, ok := m.nodes[n]; !ok {
		return ErrNodeNotFound
	}
	r, ok := m.ips[a]
	if !ok || r.node != n {
		return ErrUnknownIP
	}
	if r.state != StateHeld {
		return ErrNotHeld
	}
	if o == nil {
		if r.cross {
			return ErrInvalidArgument
		}
		m.idle(r, now, m.cooldown)
		return nil
	}
	if m.podIP(n, o.Pod()) != nil {
		return ErrPodHasIP
	}
	m.assign(r, *o)
	return nil
}

// restore mirrors Store.Restore for valid ENI lists and returns the
// expected conflicts as "kind addr" strings, sorted like the report.
func (m *model) restore(n string, in RestoreInput, now time.Time) []string {
	if _, ok := m.nodes[n]; !ok {
		m.nodes[n] = 0
	}
	old := map[netip.Addr]mIP{}
	for a, r := range m.ips {
		if r.node == n {
			old[a] = *r
		}
	}
	m.dropNodeState(n)
	type conf struct {
		a netip.Addr
		k ConflictKind
	}
	var confs []conf
	enis := slices.Clone(in.ENIs)
	slices.SortFunc(enis, func(a, b RestoreENI) int { return strings.Compare(a.ENI.ID, b.ENI.ID) })
	where := map[netip.Addr][]string{}
	for _, re := range enis {
		if e, ok := m.enis[re.ENI.ID]; ok && e.node != n {
			confs = append(confs, conf{re.ENI.PrimaryIP, ConflictENIOnOtherNode})
			continue
		}
		m.enis[re.ENI.ID] = mENI{node: n, info: re.ENI}
		if r, ok := m.ips[re.ENI.PrimaryIP]; ok && r.node != n {
			confs = append(confs, conf{re.ENI.PrimaryIP, ConflictIPOnOtherNode})
		}
		for _, a := range re.IPs {
			if !slices.Contains(where[a], re.ENI.ID) {
				where[a] = append(where[a], re.ENI.ID)
			}
		}
	}
	owners := map[netip.Addr][]Owner{}
	pods := map[PodKey]int{}
	for _, c := range in.Claims {
		if slices.ContainsFunc(owners[c.Addr], func(o Owner) bool { return o.Pod() == c.Owner.Pod() }) {
			continue
		}
		owners[c.Addr] = append(owners[c.Addr], c.Owner)
		pods[c.Owner.Pod()]++
	}
	addrs := make([]netip.Addr, 0, len(where))
	for a := range where {
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	for _, a := range addrs {
		es, os := where[a], owners[a]
		if m.isPrimaryOn(n, a) {
			confs = append(confs, conf{a, ConflictPrimaryAsSecondary})
			continue
		}
		if r, ok := m.ips[a]; ok && r.node != n {
			confs = append(confs, conf{a, ConflictIPOnOtherNode})
			continue
		}
		r := &mIP{node: n, eni: es[0], addedAt: now, cross: m.cross(es[0], a)}
		prev, had := old[a]
		if had {
			r.addedAt = prev.addedAt
		}
		m.ips[a] = r
		held := false
		if len(es) > 1 {
			held = true
			confs = append(confs, conf{a, ConflictIPOnTwoENIs})
		}
		if len(os) > 1 {
			held = true
			confs = append(confs, conf{a, ConflictClaimedTwice})
		}
		if len(os) == 1 && pods[os[0].Pod()] > 1 {
			held = true
			confs = append(confs, conf{a, ConflictPodClaimsTwo})
		}
		if r.cross && len(os) == 0 {
			held = true
			confs = append(confs, conf{a, ConflictUnclaimedCrossSubnet})
		}
		switch {
		case held:
			m.holdIP(r, HoldConflict)
		case len(os) == 1:
			m.assign(r, os[0])
		case had && prev.state == StateIdle:
			m.idle(r, prev.idleSince, prev.readyAt.Sub(prev.idleSince))
		default:
			m.idle(r, now, 0)
		}
	}
	for a := range owners {
		if _, ok := where[a]; !ok {
			confs = append(confs, conf{a, ConflictClaimNotOnNode})
		}
	}
	slices.SortFunc(confs, func(x, y conf) int { return cmp.Or(x.a.Compare(y.a), cmp.Compare(x.k, y.k)) })
	out := make([]string, len(confs))
	for i, c := range confs {
		out[i] = fmt.Sprintf("%s %s", c.k, c.a)
	}
	return out
}

// snapshot renders the model's view of a node the way Store.Snapshot does.
func (m *model) snapshot(n string) NodeSnapshot {
	s := NodeSnapshot{Node: n, ENIs: []ENISnapshot{}}
	for id, e := range m.enis {
		if e.node != n {
			continue
		}
		es := ENISnapshot{ENI: e.info, IPs: []IPInfo{}}
		for a, r := range m.ips {
			if r.eni != id {
				continue
			}
			es.IPs = append(es.IPs, IPInfo{Node: n, ENIID: id, SubnetID: e.info.SubnetID, MAC: e.info.MAC,
				Addr: a, State: r.state, Owner: r.owner, HoldReason: r.hold, CrossSubnet: r.cross,
				AddedAt: r.addedAt, IdleSince: r.idleSince, ReadyAt: r.readyAt})
		}
		slices.SortFunc(es.IPs, func(a, b IPInfo) int { return a.Addr.Compare(b.Addr) })
		s.ENIs = append(s.ENIs, es)
	}
	slices.SortFunc(s.ENIs, func(a, b ENISnapshot) int { return strings.Compare(a.ENI.ID, b.ENI.ID) })
	return s
}
