package datastore

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// RestoreInput is what a node's state is rebuilt from: the cloud's view of
// the ENIs attached to the node, and the assignments recorded in the
// node's WorkloadEndpoints.
type RestoreInput struct {
	ENIs   []RestoreENI
	Claims []Claim
	// CoolFrom, when set, is the last moment the node's previous owner may
	// have released an address (a hand-over): unclaimed addresses this
	// store did not already hold idle cool from then, for the previous
	// owner's releases are not recorded anywhere. Zero: they are ready at
	// once (a first start, where nothing was released a moment ago).
	CoolFrom time.Time
	// Unsettled: the ENI list may lag the previous owner's last writes
	// (a hand-over), so unclaimed addresses this store did not already hold
	// idle are held HoldUnsettled until a later read settles them (Settle);
	// an address trimmed just before the hand-over is then never handed out.
	Unsettled bool
}

// RestoreENI is one attached ENI with its secondary addresses as the cloud
// lists them (the primary is in ENI.PrimaryIP and must not be repeated).
type RestoreENI struct {
	ENI ENI
	IPs []netip.Addr
}

// Claim says a pod holds an address on this node (a WorkloadEndpoint).
type Claim struct {
	Addr  netip.Addr
	Owner Owner
}

// ConflictKind classifies a restore conflict.
type ConflictKind uint8

const (
	// ConflictIPOnTwoENIs: the cloud lists the address on two ENIs. It is
	// recorded once, held, on the ENI whose ID sorts first.
	ConflictIPOnTwoENIs ConflictKind = iota + 1
	// ConflictClaimedTwice: two pods claim the address. It is held.
	ConflictClaimedTwice
	// ConflictPodClaimsTwo: one pod claims several addresses. Each is held.
	ConflictPodClaimsTwo
	// ConflictUnclaimedCrossSubnet: a cross-subnet address no pod claims.
	// It is held (it can serve no ordinary pod); delete it from the cloud.
	ConflictUnclaimedCrossSubnet
	// ConflictClaimNotOnNode: a pod claims an address the node's ENIs do
	// not have. Nothing is recorded.
	ConflictClaimNotOnNode
	// ConflictIPOnOtherNode: the address is recorded on another stored
	// node. Nothing is recorded here; the other node keeps it. Also
	// reported when an ENI's primary address is a secondary address of
	// another node (the ENI is kept).
	ConflictIPOnOtherNode
	// ConflictENIOnOtherNode: the ENI is recorded on another stored node.
	// The ENI and its addresses are skipped.
	ConflictENIOnOtherNode
	// ConflictPrimaryAsSecondary: a secondary address equals an ENI's
	// primary address. It is skipped.
	ConflictPrimaryAsSecondary
	// ConflictInvalidClaim: a claim with a malformed address or owner.
	ConflictInvalidClaim
)

var conflictNames = [...]string{
	ConflictIPOnTwoENIs:          "ip-on-two-enis",
	ConflictClaimedTwice:         "claimed-twice",
	ConflictPodClaimsTwo:         "pod-claims-two",
	ConflictUnclaimedCrossSubnet: "unclaimed-cross-subnet",
	ConflictClaimNotOnNode:       "claim-not-on-node",
	ConflictIPOnOtherNode:        "ip-on-other-node",
	ConflictENIOnOtherNode:       "eni-on-other-node",
	ConflictPrimaryAsSecondary:   "primary-as-secondary",
	ConflictInvalidClaim:         "invalid-claim",
}

func (k ConflictKind) String() string {
	if int(k) < len(conflictNames) && conflictNames[k] != "" {
		return conflictNames[k]
	}
	return fmt.Sprintf("ConflictKind(%d)", uint8(k))
}

// Conflict is one inconsistency Restore found. Restore never picks a
// winner: a conflicting address is either held (Held) or not recorded.
type Conflict struct {
	Kind      ConflictKind
	Addr      netip.Addr
	ENIs      []string // ENIs involved
	Owners    []Owner  // claimants involved
	OtherNode string   // for the *OnOtherNode kinds
	Held      bool     // the address is recorded as held (HoldConflict)
}

func (c Conflict) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", c.Kind, c.Addr)
	if len(c.ENIs) > 0 {
		fmt.Fprintf(&b, " enis=%v", c.ENIs)
	}
	for _, o := range c.Owners {
		fmt.Fprintf(&b, " owner=%s", o)
	}
	if c.OtherNode != "" {
		fmt.Fprintf(&b, " other-node=%s", c.OtherNode)
	}
	if c.Held {
		b.WriteString(" held")
	}
	return b.String()
}

// RestoreReport summarises a Restore.
type RestoreReport struct {
	Node      string
	Idle      int
	Assigned  int
	Held      int
	Conflicts []Conflict // sorted by address, then kind
}

// Restore replaces the node's state with one rebuilt from in (adding the
// node if needed). Claims decide assignment; cloud addresses nobody claims
// become idle. Addresses that stay idle across the restore keep their
// cooling and idle-since times; new ones cool from in.CoolFrom (ready at
// once when it is zero), or are held unsettled (in.Unsettled). Conflicts are
// reported and never resolved here (see ConflictKind). A malformed ENI list
// is an ErrInvalidArgument and changes nothing. The caller must not run
// allocations for the node concurrently with building the input.
func (s *Store) Restore(node string, in RestoreInput, now time.Time) (RestoreReport, error) {
	if node == "" {
		return RestoreReport{}, invalidf("node name is empty")
	}
	enis, err := validateRestoreENIs(node, in.ENIs)
	if err != nil {
		return RestoreReport{}, err
	}

	s.mu.Lock()
	sl, ok := s.nodes[node]
	if !ok {
		sl = &slot{n: newNodeState(node, s.cooldown)}
		s.nodes[node] = sl
	}
	sl.mu.Lock()
	s.mu.Unlock()
	defer sl.mu.Unlock()
	s.idxMu.Lock()
	defer s.idxMu.Unlock()

	b := rebuild{s: s, sl: sl, old: sl.n, n: newNodeState(node, s.cooldown), now: now,
		coolFrom: in.CoolFrom, unsettled: in.Unsettled}
	b.run(enis, in.Claims)

	s.unindexLocked(sl)
	sl.n = b.n
	for a := range b.n.ips {
		s.ipOwner[a] = sl
	}
	for id := range b.n.enis {
		s.eniOwner[id] = sl
	}
	slices.SortFunc(b.conflicts, func(x, y Conflict) int {
		return cmp.Or(x.Addr.Compare(y.Addr), cmp.Compare(x.Kind, y.Kind))
	})
	return RestoreReport{
		Node: node, Idle: b.n.nIdle, Assigned: b.n.nAssigned, Held: b.n.nHeld,
		Conflicts: b.conflicts,
	}, nil
}

func validateRestoreENIs(node string, in []RestoreENI) ([]RestoreENI, error) {
	out := make([]RestoreENI, len(in))
	ids := make(map[string]bool, len(in))
	prim := make(map[netip.Addr]string, len(in))
	for i, re := range in {
		e, err := re.ENI.validate()
		if err != nil {
			return nil, fmt.Errorf("restore node %s: %w", node, err)
		}
		if ids[e.ID] {
			return nil, invalidf("restore node %s: eni %s listed twice", node, e.ID)
		}
		ids[e.ID] = true
		if other, ok := prim[e.PrimaryIP]; ok {
			return nil, invalidf("restore node %s: enis %s and %s share primary ip %s", node, other, e.ID, e.PrimaryIP)
		}
		prim[e.PrimaryIP] = e.ID
		ips := make([]netip.Addr, len(re.IPs))
		for j, a := range re.IPs {
			na, err := checkAddr(a)
			if err != nil {
				return nil, fmt.Errorf("restore node %s eni %s: %w", node, e.ID, err)
			}
			ips[j] = na
		}
		out[i] = RestoreENI{
			ENI: e,
			IPs: ips,
		}
	}
	slices.SortFunc(out, func(a, b RestoreENI) int { return strings.Compare(a.ENI.ID, b.ENI.ID) })
	return out, nil
}

// rebuild builds a fresh nodeState; it needs the slot lock and idxMu.
type rebuild struct {
	s         *Store
	sl        *slot
	old, n    *nodeState
	now       time.Time
	coolFrom  time.Time // zero: new idle addresses are ready at once
	unsettled bool      // new idle addresses are held HoldUnsettled
	conflicts []Conflict
}

func (b *rebuild) conflict(c Conflict) { b.conflicts = append(b.conflicts, c) }

func (b *rebuild) run(enis []RestoreENI, claims []Claim) {
	// ENIs first, so that every primary is known before any secondary.
	var kept []RestoreENI
	for _, re := range enis {
		if other, ok := b.s.eniOwner[re.ENI.ID]; ok && other != b.sl {
			b.conflict(Conflict{Kind: ConflictENIOnOtherNode, Addr: re.ENI.PrimaryIP,
				ENIs: []string{re.ENI.ID}, OtherNode: other.n.name})
			continue
		}
		if err := b.n.addENI(re.ENI); err != nil {
			// Unreachable after validation (fresh state, unique IDs and
			// primaries); skip the ENI rather than panic.
			b.conflict(Conflict{
				Kind: ConflictPrimaryAsSecondary,
				Addr: re.ENI.PrimaryIP,
				ENIs: []string{re.ENI.ID},
			})
			continue
		}
		if other, ok := b.s.ipOwner[re.ENI.PrimaryIP]; ok && other != b.sl {
			// The cloud says this is a primary here; the other node's
			// record is stale. Keep the ENI (dropping it would drop pod
			// addresses) and report it.
			b.conflict(Conflict{Kind: ConflictIPOnOtherNode, Addr: re.ENI.PrimaryIP,
				ENIs: []string{re.ENI.ID}, OtherNode: other.n.name})
		}
		kept = append(kept, re)
	}

	// Where does the cloud put each address?
	where := make(map[netip.Addr][]string)
	var order []netip.Addr
	for _, re := range kept {
		for _, a := range re.IPs {
			if slices.Contains(where[a], re.ENI.ID) {
				continue // listed twice on the same ENI: harmless
			}
			if len(where[a]) == 0 {
				order = append(order, a)
			}
			where[a] = append(where[a], re.ENI.ID)
		}
	}
	slices.SortFunc(order, netip.Addr.Compare)

	// Who claims what?
	byAddr := make(map[netip.Addr][]Owner)
	byPod := make(map[PodKey]int)
	for _, c := range claims {
		a, aerr := checkAddr(c.Addr)
		if aerr != nil || c.Owner.validate() != nil {
			b.conflict(Conflict{
				Kind:   ConflictInvalidClaim,
				Addr:   c.Addr,
				Owners: []Owner{c.Owner},
			})
			continue
		}
		if slices.ContainsFunc(byAddr[a], func(o Owner) bool { return o.Pod() == c.Owner.Pod() }) {
			continue // the same pod's claim twice
		}
		byAddr[a] = append(byAddr[a], c.Owner)
		byPod[c.Owner.Pod()]++
	}

	for _, a := range order {
		b.place(a, where[a], byAddr[a], byPod)
	}
	for a, owners := range byAddr {
		if _, inCloud := where[a]; !inCloud {
			b.conflict(Conflict{
				Kind:   ConflictClaimNotOnNode,
				Addr:   a,
				Owners: owners,
			})
		}
	}
}

// place records one cloud address.
func (b *rebuild) place(a netip.Addr, enis []string, owners []Owner, byPod map[PodKey]int) {
	if id, ok := b.n.primaries[a]; ok {
		b.conflict(Conflict{
			Kind:   ConflictPrimaryAsSecondary,
			Addr:   a,
			ENIs:   append(slices.Clone(enis), id),
			Owners: owners,
		})
		return
	}
	if other, ok := b.s.ipOwner[a]; ok && other != b.sl {
		b.conflict(Conflict{
			Kind:      ConflictIPOnOtherNode,
			Addr:      a,
			ENIs:      enis,
			Owners:    owners,
			OtherNode: other.n.name,
		})
		return
	}
	e := b.n.enis[enis[0]]
	r := &ipRecord{
		addr:        a,
		eni:         e,
		addedAt:     b.now,
		heapIndex:   -1,
		crossSubnet: isCross(e, a),
	}
	var prev *ipRecord
	if b.old != nil {
		prev = b.old.ips[a]
	}
	if prev != nil {
		r.addedAt = prev.addedAt
	}
	e.ips[a] = r
	b.n.ips[a] = r

	held := false
	add := func(k ConflictKind) {
		held = true
		b.conflict(Conflict{
			Kind:   k,
			Addr:   a,
			ENIs:   enis,
			Owners: owners,
			Held:   true,
		})
	}
	if len(enis) > 1 {
		add(ConflictIPOnTwoENIs)
	}
	if len(owners) > 1 {
		add(ConflictClaimedTwice)
	}
	if len(owners) == 1 && byPod[owners[0].Pod()] > 1 {
		add(ConflictPodClaimsTwo)
	}
	if r.crossSubnet && len(owners) == 0 {
		add(ConflictUnclaimedCrossSubnet)
	}
	switch {
	case held:
		b.n.enterHeld(r, HoldConflict)
	case len(owners) == 1:
		b.n.enterAssigned(r, owners[0])
	case prev != nil && prev.state == StateIdle:
		// Keep the cooling of an address released just before the
		// resync, and its place in the idle order.
		b.n.enterIdle(r, prev.idleSince, prev.readyAt.Sub(prev.idleSince))
	case b.unsettled, prev != nil && prev.state == StateHeld && prev.hold == HoldUnsettled:
		b.n.enterHeld(r, HoldUnsettled)
	case !b.coolFrom.IsZero():
		b.n.enterIdle(r, b.coolFrom, b.n.cooldown)
	default:
		b.n.enterIdle(r, b.now, 0)
	}
}
