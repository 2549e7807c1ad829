package datastore

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// Store holds the IPAM state of the nodes a replica owns. It is safe for
// concurrent use; see doc.go for the locking contract.
type Store struct {
	cooldown time.Duration

	// mu guards only the nodes map. It is held for a map read or write,
	// never while a node is being changed, so nodes do not wait on each
	// other.
	mu    sync.RWMutex
	nodes map[string]*slot

	// idxMu guards the cross-node indexes. Lock order: mu, then a slot,
	// then idxMu; the hot path (Allocate, Release) never takes idxMu.
	idxMu    sync.Mutex
	ipOwner  map[netip.Addr]*slot
	eniOwner map[string]*slot
}

type slot struct {
	mu   sync.Mutex
	gone bool // set by RemoveNode; a caller that raced it looks again
	n    *nodeState
}

// New returns an empty Store.
func New(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Store{
		cooldown: cfg.Cooldown,
		nodes:    make(map[string]*slot),
		ipOwner:  make(map[netip.Addr]*slot),
		eniOwner: make(map[string]*slot),
	}, nil
}

// Cooldown returns the cooling period.
func (s *Store) Cooldown() time.Duration { return s.cooldown }

// lock returns the node's slot, locked. The caller must unlock it.
func (s *Store) lock(node string) (*slot, error) {
	if node == "" {
		return nil, invalidf("node name is empty")
	}
	for {
		s.mu.RLock()
		sl := s.nodes[node]
		s.mu.RUnlock()
		if sl == nil {
			return nil, fmt.Errorf("node %s: %w", node, ErrNodeNotFound)
		}
		sl.mu.Lock()
		if !sl.gone {
			return sl, nil
		}
		sl.mu.Unlock() // removed meanwhile; it may have been re-added
	}
}

// AddNode adds an empty node. The sharding layer calls it when the replica
// takes a node over (usually followed by Restore, which also adds).
func (s *Store) AddNode(node string) error {
	if node == "" {
		return invalidf("node name is empty")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.nodes[node]; ok {
		return fmt.Errorf("node %s: %w", node, ErrNodeExists)
	}
	s.nodes[node] = &slot{n: newNodeState(node, s.cooldown)}
	return nil
}

// RemoveNode drops one node and everything recorded on it, leaving every
// other node untouched, and returns what was dropped. Used when the shard
// hands the node to another replica or the node is deleted.
func (s *Store) RemoveNode(node string) (NodeSnapshot, error) {
	if node == "" {
		return NodeSnapshot{}, invalidf("node name is empty")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sl, ok := s.nodes[node]
	if !ok {
		return NodeSnapshot{}, fmt.Errorf("node %s: %w", node, ErrNodeNotFound)
	}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	snap := sl.n.snapshot()
	s.idxMu.Lock()
	s.unindexLocked(sl)
	s.idxMu.Unlock()
	sl.gone = true
	delete(s.nodes, node)
	return snap, nil
}

// unindexLocked drops every index entry of sl. Needs sl.mu and idxMu.
func (s *Store) unindexLocked(sl *slot) {
	for a := range sl.n.ips {
		if s.ipOwner[a] == sl {
			delete(s.ipOwner, a)
		}
	}
	for id := range sl.n.enis {
		if s.eniOwner[id] == sl {
			delete(s.eniOwner, id)
		}
	}
}

// HasNode reports whether the node is stored.
func (s *Store) HasNode(node string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, ok := s.nodes[node]
	return ok
}

// Nodes returns the stored node names, sorted.
func (s *Store) Nodes() []string {
	s.mu.RLock()
	out := make([]string, 0, len(s.nodes))
	for name := range s.nodes {
		out = append(out, name)
	}
	s.mu.RUnlock()
	slices.Sort(out)
	return out
}

// AddENI records an ENI attached to the node. An ENI ID is unique across
// all stored nodes.
func (s *Store) AddENI(node string, e ENI) error {
	e, err := e.validate()
	if err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	sl, err := s.lock(node)
	if err != nil {
		return err
	}
	defer sl.mu.Unlock()
	s.idxMu.Lock()
	defer s.idxMu.Unlock()
	if other, ok := s.eniOwner[e.ID]; ok && other != sl {
		return fmt.Errorf("node %s: eni %s is on node %s: %w", node, e.ID, other.n.name, ErrENIExists)
	}
	if other, ok := s.ipOwner[e.PrimaryIP]; ok && other != sl {
		return fmt.Errorf("node %s: primary ip %s of eni %s is a secondary ip of node %s: %w",
			node, e.PrimaryIP, e.ID, other.n.name, ErrIPExists)
	}
	if err := sl.n.addENI(e); err != nil {
		return err
	}
	s.eniOwner[e.ID] = sl
	return nil
}

// RemoveENI forgets a detached ENI and all its addresses, returning the
// records as they were (assigned ones tell the caller which pods lost their
// address).
func (s *Store) RemoveENI(node, eniID string) ([]IPInfo, error) {
	if eniID == "" {
		return nil, invalidf("node %s: eni id is empty", node)
	}
	sl, err := s.lock(node)
	if err != nil {
		return nil, err
	}
	defer sl.mu.Unlock()
	gone, err := sl.n.removeENI(eniID)
	if err != nil {
		return nil, err
	}
	s.idxMu.Lock()
	for _, ip := range gone {
		if s.ipOwner[ip.Addr] == sl {
			delete(s.ipOwner, ip.Addr)
		}
	}
	if s.eniOwner[eniID] == sl {
		delete(s.eniOwner, eniID)
	}
	s.idxMu.Unlock()
	return gone, nil
}

// checkFreeLocked fails if any address is recorded on another node.
// Needs idxMu.
func (s *Store) checkFreeLocked(sl *slot, addrs []netip.Addr) error {
	for _, a := range addrs {
		if other, ok := s.ipOwner[a]; ok && other != sl {
			return fmt.Errorf("node %s: ip %s is recorded on node %s: %w", sl.n.name, a, other.n.name, ErrIPExists)
		}
	}
	return nil
}

// AddIPs records addresses the cloud confirmed on the ENI (a batch add) as
// idle. All or nothing: one bad or duplicate address rejects the batch.
func (s *Store) AddIPs(node, eniID string, addrs []netip.Addr, now time.Time) error {
	if eniID == "" {
		return invalidf("node %s: eni id is empty", node)
	}
	norm := make([]netip.Addr, len(addrs))
	for i, a := range addrs {
		na, err := checkAddr(a)
		if err != nil {
			return fmt.Errorf("node %s eni %s: %w", node, eniID, err)
		}
		norm[i] = na
	}
	sl, err := s.lock(node)
	if err != nil {
		return err
	}
	defer sl.mu.Unlock()
	s.idxMu.Lock()
	defer s.idxMu.Unlock()
	if err := s.checkFreeLocked(sl, norm); err != nil {
		return err
	}
	if err := sl.n.addIdle(eniID, norm, now); err != nil {
		return err
	}
	for _, a := range norm {
		s.ipOwner[a] = sl
	}
	return nil
}

// AddAssignedIP records a cloud-confirmed address that belongs to a pod
// from the start: a fixed-IP StatefulSet address re-added on this node, or
// a cross-subnet (PSTS) address.
func (s *Store) AddAssignedIP(node, eniID string, addr netip.Addr, o Owner, now time.Time) (IPInfo, error) {
	if eniID == "" {
		return IPInfo{}, invalidf("node %s: eni id is empty", node)
	}
	a, err := checkAddr(addr)
	if err != nil {
		return IPInfo{}, fmt.Errorf("node %s eni %s: %w", node, eniID, err)
	}
	if err := o.validate(); err != nil {
		return IPInfo{}, err
	}
	sl, err := s.lock(node)
	if err != nil {
		return IPInfo{}, err
	}
	defer sl.mu.Unlock()
	s.idxMu.Lock()
	defer s.idxMu.Unlock()
	if err := s.checkFreeLocked(sl, []netip.Addr{a}); err != nil {
		return IPInfo{}, err
	}
	info, err := sl.n.addAssigned(eniID, a, o, now)
	if err != nil {
		return IPInfo{}, err
	}
	s.ipOwner[a] = sl
	return info, nil
}

// RemoveIP forgets an address the cloud deleted, whatever its state, and
// returns the record as it was.
func (s *Store) RemoveIP(node string, addr netip.Addr) (IPInfo, error) {
	a, err := checkAddr(addr)
	if err != nil {
		return IPInfo{}, fmt.Errorf("node %s: %w", node, err)
	}
	sl, err := s.lock(node)
	if err != nil {
		return IPInfo{}, err
	}
	defer sl.mu.Unlock()
	return s.removeLocked(sl, a)
}

// removeLocked forgets an address of the locked slot, index included.
func (s *Store) removeLocked(sl *slot, a netip.Addr) (IPInfo, error) {
	info, err := sl.n.removeIP(a)
	if err != nil {
		return IPInfo{}, err
	}
	s.idxMu.Lock()
	if s.ipOwner[a] == sl {
		delete(s.ipOwner, a)
	}
	s.idxMu.Unlock()
	return info, nil
}

// Allocate hands an idle address of the node to req.Owner. If the pod
// already holds an address on the node, that address is returned and its
// container ID updated (a new sandbox of the same pod). Errors:
// ErrNoIdleIP, *CoolingError (also ErrIPCooling), ErrNodeNotFound,
// ErrInvalidArgument.
func (s *Store) Allocate(node string, req Request, now time.Time) (IPInfo, error) {
	if err := req.Owner.validate(); err != nil {
		return IPInfo{}, err
	}
	sl, err := s.lock(node)
	if err != nil {
		return IPInfo{}, err
	}
	defer sl.mu.Unlock()
	return sl.n.allocate(req, now)
}

// AllocateSpecific assigns the given idle address to o (fixed-IP
// StatefulSet pods), ignoring cooling. It is idempotent for the same pod.
func (s *Store) AllocateSpecific(node string, addr netip.Addr, o Owner) (IPInfo, error) {
	a, err := checkAddr(addr)
	if err != nil {
		return IPInfo{}, fmt.Errorf("node %s: %w", node, err)
	}
	if err := o.validate(); err != nil {
		return IPInfo{}, err
	}
	sl, err := s.lock(node)
	if err != nil {
		return IPInfo{}, err
	}
	defer sl.mu.Unlock()
	return sl.n.allocateSpecific(a, o)
}

// Release returns an assigned address to the pool, cooling from now, if
// and only if containerID is the sandbox that owns it. A cross-subnet
// address is forgotten instead (Released.Removed): delete it from the
// cloud. Errors: ErrUnknownIP, ErrNotAssigned (already released),
// ErrContainerMismatch (stale DEL), ErrHeld.
func (s *Store) Release(node string, addr netip.Addr, containerID string, now time.Time) (Released, error) {
	if containerID == "" {
		return Released{}, invalidf("node %s: release of %s without container id", node, addr)
	}
	a, err := checkAddr(addr)
	if err != nil {
		return Released{}, fmt.Errorf("node %s: %w", node, err)
	}
	sl, err := s.lock(node)
	if err != nil {
		return Released{}, err
	}
	defer sl.mu.Unlock()
	rel, err := sl.n.release(a, containerID, now)
	if err == nil && rel.Removed {
		s.idxMu.Lock()
		if s.ipOwner[a] == sl {
			delete(s.ipOwner, a)
		}
		s.idxMu.Unlock()
	}
	return rel, err
}

// Hold takes idle addresses out of the pool, typically right before the
// caller deletes them from the cloud (reason HoldReleasing). Addresses that
// are no longer idle are skipped; the ones actually held are returned, and
// only those may be deleted.
func (s *Store) Hold(node string, addrs []netip.Addr, why HoldReason) ([]netip.Addr, error) {
	if why != HoldConflict && why != HoldReleasing && why != HoldUnsettled {
		return nil, invalidf("node %s: hold reason %s", node, why)
	}
	norm := make([]netip.Addr, len(addrs))
	for i, a := range addrs {
		na, err := checkAddr(a)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", node, err)
		}
		norm[i] = na
	}
	sl, err := s.lock(node)
	if err != nil {
		return nil, err
	}
	defer sl.mu.Unlock()
	return sl.n.hold(norm, why), nil
}

// Unhold resolves a held address: back to the pool (o == nil; it cools
// from now) or assigned to *o. Use it when a cloud delete failed or to
// settle a restore conflict; RemoveIP is the other way out.
func (s *Store) Unhold(node string, addr netip.Addr, o *Owner, now time.Time) (IPInfo, error) {
	a, err := checkAddr(addr)
	if err != nil {
		return IPInfo{}, fmt.Errorf("node %s: %w", node, err)
	}
	if o != nil {
		if err := o.validate(); err != nil {
			return IPInfo{}, err
		}
	}
	sl, err := s.lock(node)
	if err != nil {
		return IPInfo{}, err
	}
	defer sl.mu.Unlock()
	return sl.n.unhold(a, o, now)
}

// Surrender takes an address assigned to pod back into Held(HoldReleasing)
// in one step, so that no Allocate can hand it out before the caller deletes
// it from the cloud: a fixed IP leaving its node for the pod's new node.
// Idle and held addresses are held (or stay held) as well; an address
// assigned to another pod is refused with ErrPodHasIP.
func (s *Store) Surrender(node string, addr netip.Addr, pod PodKey) (IPInfo, error) {
	sl, r, err := s.lockRecord(node, addr)
	if err != nil {
		return IPInfo{}, err
	}
	defer sl.mu.Unlock()
	if r.state == StateAssigned && r.owner.Pod() != pod {
		return IPInfo{}, fmt.Errorf("node %s: ip %s belongs to %s, not %s: %w", node, r.addr, r.owner, pod, ErrPodHasIP)
	}
	sl.n.leave(r)
	sl.n.enterHeld(r, HoldReleasing)
	return sl.n.info(r), nil
}

// Unsettle marks a held address HoldUnsettled: a cloud delete of it (a
// pool trim, a fixed IP leaving the node) had an unclear outcome, and only
// a later read can tell whether the ENI still has it (see Settle).
func (s *Store) Unsettle(node string, addr netip.Addr) error {
	sl, r, err := s.lockHeld(node, addr)
	if err != nil {
		return err
	}
	defer sl.mu.Unlock()
	r.hold = HoldUnsettled
	return nil
}

// Settle resolves a held address by what a cloud read of its ENI showed:
// listed (present), it returns to the pool, cooling from coolFrom (the
// last moment a pod may have used it: the release, or the hand-over); not
// listed, it is forgotten, as RemoveIP would. The read must be one taken
// late enough that the cloud's read lag cannot hide the write in question.
// Assigned and idle addresses are not changed (ErrNotHeld).
func (s *Store) Settle(node string, addr netip.Addr, present bool, coolFrom time.Time) (IPInfo, error) {
	sl, r, err := s.lockHeld(node, addr)
	if err != nil {
		return IPInfo{}, err
	}
	defer sl.mu.Unlock()
	if !present {
		return s.removeLocked(sl, r.addr)
	}
	if r.crossSubnet {
		return IPInfo{}, invalidf("node %s: cross-subnet ip %s cannot become idle; assign or remove it", node, r.addr)
	}
	sl.n.leave(r)
	sl.n.enterIdle(r, coolFrom, sl.n.cooldown)
	return sl.n.info(r), nil
}

// lockRecord locks the node's slot and finds the address's record; on
// success the caller must unlock sl.mu.
func (s *Store) lockRecord(node string, addr netip.Addr) (*slot, *ipRecord, error) {
	a, err := checkAddr(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("node %s: %w", node, err)
	}
	sl, err := s.lock(node)
	if err != nil {
		return nil, nil, err
	}
	r, ok := sl.n.ips[a]
	if !ok {
		sl.mu.Unlock()
		return nil, nil, fmt.Errorf("node %s: ip %s: %w", node, a, ErrUnknownIP)
	}
	return sl, r, nil
}

// lockHeld is lockRecord for an address that must be held (ErrNotHeld).
func (s *Store) lockHeld(node string, addr netip.Addr) (*slot, *ipRecord, error) {
	sl, r, err := s.lockRecord(node, addr)
	if err != nil {
		return nil, nil, err
	}
	if r.state != StateHeld {
		sl.mu.Unlock()
		return nil, nil, fmt.Errorf("node %s: ip %s is %s: %w", node, r.addr, r.state, ErrNotHeld)
	}
	return sl, r, nil
}

// Stats counts the node's addresses; now decides which idle ones are
// cooling.
func (s *Store) Stats(node string, now time.Time) (NodeStats, error) {
	sl, err := s.lock(node)
	if err != nil {
		return NodeStats{}, err
	}
	defer sl.mu.Unlock()
	return sl.n.stats(now), nil
}

// Snapshot returns a deep copy of the node's ENIs and addresses.
func (s *Store) Snapshot(node string) (NodeSnapshot, error) {
	sl, err := s.lock(node)
	if err != nil {
		return NodeSnapshot{}, err
	}
	defer sl.mu.Unlock()
	return sl.n.snapshot(), nil
}

// LookupIP finds an address on any stored node.
func (s *Store) LookupIP(addr netip.Addr) (IPInfo, error) {
	a, err := checkAddr(addr)
	if err != nil {
		return IPInfo{}, err
	}
	for range 3 { // the address may move between index read and node lock
		s.idxMu.Lock()
		sl := s.ipOwner[a]
		s.idxMu.Unlock()
		if sl == nil {
			break
		}
		sl.mu.Lock()
		r, ok := sl.n.ips[a]
		found := ok && !sl.gone
		var info IPInfo
		if found {
			info = sl.n.info(r)
		}
		sl.mu.Unlock()
		if found {
			return info, nil
		}
	}
	return IPInfo{}, fmt.Errorf("ip %s: %w", a, ErrUnknownIP)
}

// LookupPod returns the address a pod holds on the node.
func (s *Store) LookupPod(node string, pod PodKey) (IPInfo, error) {
	if pod.Namespace == "" || pod.Name == "" {
		return IPInfo{}, invalidf("pod %q needs namespace and name", pod.String())
	}
	sl, err := s.lock(node)
	if err != nil {
		return IPInfo{}, err
	}
	defer sl.mu.Unlock()
	r, ok := sl.n.pods[pod]
	if !ok {
		return IPInfo{}, fmt.Errorf("node %s: pod %s holds no ip: %w", node, pod, ErrUnknownIP)
	}
	return sl.n.info(r), nil
}
