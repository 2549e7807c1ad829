package datastore

import (
	"fmt"
	"net"
	"net/netip"
	"time"
)

// PodKey names a pod. A pod holds at most one address per node.
type PodKey struct {
	Namespace string
	Name      string
}

func (k PodKey) String() string { return k.Namespace + "/" + k.Name }

// Owner is the holder of an assigned address: a pod and the sandbox
// (infra container) that the CNI ADD was made for. The container ID is the
// release guard.
type Owner struct {
	Namespace   string
	Name        string
	ContainerID string
}

// Pod returns the owner's pod key.
func (o Owner) Pod() PodKey {
	return PodKey{
		Namespace: o.Namespace,
		Name:      o.Name,
	}
}

func (o Owner) String() string { return o.Namespace + "/" + o.Name + "@" + o.ContainerID }

func (o Owner) validate() error {
	if o.Namespace == "" || o.Name == "" || o.ContainerID == "" {
		return invalidf("owner %q needs namespace, name and container id", o.String())
	}
	return nil
}

// ENI describes an elastic network interface attached to a node.
type ENI struct {
	ID       string
	SubnetID string
	// SubnetCIDR is the ENI's subnet. Addresses outside it are cross-subnet
	// (PSTS) addresses: they are only ever recorded as assigned and never
	// handed to ordinary pods. The zero prefix means "unknown": every
	// address then counts as in-subnet.
	SubnetCIDR netip.Prefix
	MAC        string
	// PrimaryIP belongs to the ENI itself and is never allocatable.
	PrimaryIP netip.Addr
	// Capacity is the maximum number of addresses on the ENI including the
	// primary (node annotation cce.io/max-ip-per-eni); 0 means unknown. The
	// store records it for planners and does not enforce it: the cloud is
	// the authority on what fits, and an address it confirmed must be
	// recorded or it would leak.
	Capacity int
}

func (e ENI) validate() (ENI, error) {
	if e.ID == "" {
		return e, invalidf("eni id is empty")
	}
	if e.SubnetID == "" {
		return e, invalidf("eni %s: subnet id is empty", e.ID)
	}
	if e.Capacity < 0 {
		return e, invalidf("eni %s: negative capacity %d", e.ID, e.Capacity)
	}
	if e.MAC != "" {
		if _, err := net.ParseMAC(e.MAC); err != nil {
			return e, invalidf("eni %s: mac %q: %v", e.ID, e.MAC, err)
		}
	}
	p, err := checkAddr(e.PrimaryIP)
	if err != nil {
		return e, fmt.Errorf("eni %s primary ip: %w", e.ID, err)
	}
	e.PrimaryIP = p
	if e.SubnetCIDR.IsValid() {
		e.SubnetCIDR = e.SubnetCIDR.Masked()
	}
	return e, nil
}

// checkAddr rejects the zero, unspecified and multicast addresses and folds
// IPv4-mapped IPv6 addresses to IPv4, so that one address has one key.
func checkAddr(a netip.Addr) (netip.Addr, error) {
	if !a.IsValid() {
		return a, invalidf("address is empty or malformed")
	}
	a = a.Unmap()
	if a.IsUnspecified() || a.IsMulticast() {
		return a, invalidf("address %s is not a unicast address", a)
	}
	return a, nil
}

// IPState is the state of one recorded address.
type IPState uint8

const (
	// StateIdle addresses are in the warm pool and may be allocated.
	StateIdle IPState = iota + 1
	// StateAssigned addresses belong to an Owner.
	StateAssigned
	// StateHeld addresses are out of the pool until the caller decides:
	// see HoldReason.
	StateHeld
)

func (s IPState) String() string {
	switch s {
	case StateIdle:
		return "idle"
	case StateAssigned:
		return "assigned"
	case StateHeld:
		return "held"
	}
	return fmt.Sprintf("IPState(%d)", uint8(s))
}

// HoldReason says why an address is held.
type HoldReason uint8

const (
	// HoldNone is the reason of addresses that are not held.
	HoldNone HoldReason = iota
	// HoldConflict: Restore found a conflict (two claimants, an address on
	// two ENIs, an unclaimed cross-subnet address). It is counted but never
	// allocated until the caller resolves it with Unhold or RemoveIP.
	HoldConflict
	// HoldReleasing: the caller is returning the address to the cloud
	// (pool trimming). Holding it first means no Allocate can hand it out
	// while the DeletePrivateIP call is in flight.
	HoldReleasing
	// HoldUnsettled: the store cannot tell whether the cloud still has the
	// address on its ENI: a delete whose outcome is unclear (a timeout after
	// the request was sent), or an address a new owner read once from a
	// cloud whose reads may lag its writes. It is never allocated until a
	// cloud read taken late enough settles it with Settle: still listed, it
	// returns to the pool; gone, it is forgotten. The pool planner counts it
	// as idle, so that waiting for the read does not grow the pool.
	HoldUnsettled
	// HoldInUse: a running pod uses the address (its status.podIP) while no
	// WorkloadEndpoint names it for that pod, e.g. the wep was deleted out
	// of band. Handing it out would give one IP to two pods, so it is never
	// allocated; the caller returns it to the pool with Unhold once no
	// running pod uses it.
	HoldInUse
	// HoldOrphan: a cloud address of a recorded ENI that the store did not
	// know and no WorkloadEndpoint names (an add whose reply was lost, an
	// address added by hand). Nothing proves it unused by something outside
	// the IPAM, so it never joins the pool: the caller deletes it from the
	// cloud after a grace period, or gives it to a claimant with Unhold.
	HoldOrphan
)

func (r HoldReason) String() string {
	switch r {
	case HoldNone:
		return "none"
	case HoldConflict:
		return "conflict"
	case HoldReleasing:
		return "releasing"
	case HoldUnsettled:
		return "unsettled"
	case HoldInUse:
		return "in_use"
	case HoldOrphan:
		return "orphan"
	}
	return fmt.Sprintf("HoldReason(%d)", uint8(r))
}

// IPInfo is a copy of one address record.
type IPInfo struct {
	Node        string
	ENIID       string
	SubnetID    string
	MAC         string
	Addr        netip.Addr
	State       IPState
	Owner       Owner      // zero unless State is StateAssigned
	HoldReason  HoldReason // HoldNone unless State is StateHeld
	CrossSubnet bool
	AddedAt     time.Time // when the store first recorded the address
	IdleSince   time.Time // when it last became idle; zero unless idle
	ReadyAt     time.Time // idle addresses are not handed out before this (cooling)
}

// Cooling reports whether an idle address is still cooling at now.
func (i IPInfo) Cooling(now time.Time) bool {
	return i.State == StateIdle && i.ReadyAt.After(now)
}

// ENIStats counts one ENI's non-primary addresses.
type ENIStats struct {
	ID       string
	SubnetID string
	Capacity int
	Total    int // idle + assigned + held
	Idle     int // includes Cooling
	Cooling  int
	Assigned int
	Held     int
}

// NodeStats counts one node's addresses, with a per-ENI breakdown sorted by
// ENI ID.
type NodeStats struct {
	Node     string
	Total    int
	Idle     int // includes Cooling
	Cooling  int
	Assigned int
	Held     int
	ENIs     []ENIStats
}

// ENISnapshot is a copy of one ENI and its addresses, sorted by address.
type ENISnapshot struct {
	ENI ENI
	IPs []IPInfo
}

// NodeSnapshot is a deep copy of one node's state, ENIs sorted by ID.
type NodeSnapshot struct {
	Node string
	ENIs []ENISnapshot
}

// Request asks Allocate for an address.
type Request struct {
	Owner Owner
	// SubnetID, when set, restricts the choice to ENIs of that subnet (a
	// fixed-IP StatefulSet pod whose old address could not be re-added must
	// stay in its subnet).
	SubnetID string
}

// Released describes the outcome of a Release.
type Released struct {
	Info IPInfo // the record before release
	// Removed is true for cross-subnet addresses: they cannot serve other
	// pods, so the store forgets them and the caller must delete them from
	// the cloud.
	Removed bool
}

// Config configures a Store. Start from DefaultConfig.
type Config struct {
	// Cooldown is how long a released address stays out of circulation so
	// the old pod's neighbour entries and conntrack state drain; zero means
	// none. DefaultConfig has DefaultCooldown.
	Cooldown time.Duration
}

// DefaultCooldown matches the reference's cooling period
// (DATASTORE_ADDRESS_COOLING_PERIOD).
const DefaultCooldown = 5 * time.Second

// DefaultConfig is the reference's configuration. The store has no flags of
// its own: the IPAM's --ip-cooling-period feeds Cooldown.
func DefaultConfig() Config {
	return Config{Cooldown: DefaultCooldown}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Cooldown < 0 {
		return invalidf("negative cooldown %s", c.Cooldown)
	}
	return nil
}
