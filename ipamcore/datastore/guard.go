package datastore

import (
	"fmt"
	"net/netip"
	"time"
)

// The leaked-IP GC's states (HoldInUse, HoldOrphan): addresses the store
// must never hand out although no WorkloadEndpoint names them.

// AddHeldIP records a cloud-confirmed address of a recorded ENI as held for
// why (HoldInUse or HoldOrphan), in one step so no Allocate can take it in
// between. Cross-subnet addresses are refused: they are only ever recorded
// assigned (AddAssignedIP) and have their own handling.
func (s *Store) AddHeldIP(node, eniID string, addr netip.Addr, why HoldReason, now time.Time) (IPInfo, error) {
	if why != HoldInUse && why != HoldOrphan {
		return IPInfo{}, invalidf("node %s: hold reason %s for a new address", node, why)
	}
	if eniID == "" {
		return IPInfo{}, invalidf("node %s: eni id is empty", node)
	}
	a, err := checkAddr(addr)
	if err != nil {
		return IPInfo{}, fmt.Errorf("node %s eni %s: %w", node, eniID, err)
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
	e, ok := sl.n.enis[eniID]
	if !ok {
		return IPInfo{}, fmt.Errorf("node %s: eni %s: %w", node, eniID, ErrENINotFound)
	}
	if err := sl.n.checkNewAddr(a); err != nil {
		return IPInfo{}, err
	}
	if isCross(e, a) {
		return IPInfo{}, invalidf("node %s: ip %s is outside subnet %s of eni %s; cross-subnet ips must be added assigned",
			node, a, e.info.SubnetCIDR, eniID)
	}
	r := &ipRecord{
		addr:      a,
		eni:       e,
		addedAt:   now,
		heapIndex: -1,
	}
	e.ips[a] = r
	sl.n.ips[a] = r
	sl.n.enterHeld(r, why)
	s.ipOwner[a] = sl
	return sl.n.info(r), nil
}

// HoldInUse takes an address that a running pod uses without a wep naming
// it out of circulation. The caller says what it saw the address as (was:
// idle; assigned to pod; held orphaned or unsettled, the pod's use proving
// the cloud has it); if the record changed since (allocated meanwhile, say),
// nothing happens and ErrChanged is returned, so a decision made on a stale
// read never takes an address from a new owner. Holding an address already
// HoldInUse changes nothing. Addresses held for a conflict or a cloud delete
// in flight are refused with ErrHeld (their caller decides), cross-subnet
// ones with ErrInvalidArgument (PSTS addresses have their own handling).
func (s *Store) HoldInUse(node string, addr netip.Addr, was IPState, pod PodKey) error {
	sl, r, err := s.lockRecord(node, addr)
	if err != nil {
		return err
	}
	defer sl.mu.Unlock()
	if r.crossSubnet {
		return invalidf("node %s: cross-subnet ip %s is not held for a pod's use", node, r.addr)
	}
	if r.state == StateHeld {
		switch r.hold {
		case HoldInUse:
			return nil
		case HoldConflict, HoldReleasing:
			return fmt.Errorf("node %s: ip %s (%s): %w", node, r.addr, r.hold, ErrHeld)
		}
	}
	if r.state != was || (was == StateAssigned && r.owner.Pod() != pod) {
		return fmt.Errorf("node %s: ip %s is %s %s, not %s: %w", node, r.addr, r.state, r.owner, was, ErrChanged)
	}
	sl.n.leave(r)
	sl.n.enterHeld(r, HoldInUse)
	return nil
}
