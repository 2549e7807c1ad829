package ipclaim

import (
	"fmt"
	"net/netip"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// The pure rules of a claim: what state it is in at a given time, what a
// Reserve or a Free writes. No I/O, no clock: the time is an argument.

// Holder is the pod a claim is held for. A Fixed pod's next incarnation has
// the same namespace and name, and so the same claim.
type Holder struct{ Namespace, Name string }

func (h Holder) String() string { return h.Namespace + "/" + h.Name }

func (h Holder) valid() bool { return h.Namespace != "" && h.Name != "" }

// Attachment says where the holder got the address: written with a
// Reserve, informational.
type Attachment struct{ Node, ENIID, PSTS string }

// HolderOf returns the holder of a claim; ok is false when it is free.
func HolderOf(c *cce.IPClaim) (h Holder, ok bool) {
	if c.Spec.Holder == nil {
		return Holder{}, false
	}
	return Holder{Namespace: c.Spec.Holder.Namespace, Name: c.Spec.Holder.Name}, true
}

// state is what a claim allows at one instant.
type state int

const (
	// stateHeld: held by a pod.
	stateHeld state = iota
	// stateCooling: free, but freed less than the cooling period ago.
	stateCooling
	// stateBlocked: free, but NotBefore has not come.
	stateBlocked
	// stateFree: free and takeable.
	stateFree
	// stateCorrupt: not a claim the ledger can trust (Problem says why);
	// nobody takes it, the Keeper reports it.
	stateCorrupt
)

func (s state) String() string {
	switch s {
	case stateHeld:
		return "held"
	case stateCooling:
		return "cooling"
	case stateBlocked:
		return "blocked"
	case stateFree:
		return "free"
	case stateCorrupt:
		return "corrupt"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// Problem says why a claim is corrupt, or "" when it is sound: its name is
// ClaimName of an address, spec.ip is that address, and a holder names a
// pod.
func Problem(c *cce.IPClaim) string {
	addr, ok := cce.AddrOfClaimName(c.Name)
	if !ok {
		return fmt.Sprintf("name %q is not the claim name of an address", c.Name)
	}
	ip, err := netip.ParseAddr(c.Spec.IP)
	if err != nil {
		return fmt.Sprintf("spec.ip %q is not an address", c.Spec.IP)
	}
	if ip.Unmap().WithZone("") != addr {
		return fmt.Sprintf("spec.ip %s is not the address %s of the claim's name", ip, addr)
	}
	if h, held := HolderOf(c); held && !h.valid() {
		return fmt.Sprintf("holder %q names no pod", h)
	}
	return ""
}

// stateAt classifies a claim at now; until is when a cooling or blocked
// claim becomes free.
func stateAt(c *cce.IPClaim, now time.Time, cooling time.Duration) (s state, until time.Time) {
	if Problem(c) != "" {
		return stateCorrupt, time.Time{}
	}
	if c.Spec.Holder != nil {
		return stateHeld, time.Time{}
	}
	if c.Spec.ReleasedAt != nil {
		if end := c.Spec.ReleasedAt.Add(cooling); now.Before(end) {
			until = end
		}
	}
	if c.Spec.NotBefore != nil && now.Before(c.Spec.NotBefore.Time) && c.Spec.NotBefore.After(until) {
		return stateBlocked, c.Spec.NotBefore.Time
	}
	if !until.IsZero() {
		return stateCooling, until
	}
	return stateFree, time.Time{}
}

// stamp is the time written into a claim: now rounded up to the second (a
// metav1.Time keeps whole seconds). Rounding up never shortens a cooling
// period, a block or an orphan grace measured from it.
func stamp(now time.Time) *metav1.Time {
	t := now.Truncate(time.Second)
	if t.Before(now) {
		t = t.Add(time.Second)
	}
	return &metav1.Time{Time: t}
}

// newClaim is the claim of addr held by h, as a Reserve creates it.
func newClaim(subnetID string, addr netip.Addr, h Holder, at Attachment, now time.Time) *cce.IPClaim {
	c := &cce.IPClaim{ObjectMeta: metav1.ObjectMeta{Name: cce.ClaimName(addr)}}
	hold(c, subnetID, addr, h, at, now)
	return c
}

// hold makes c (a copy) held by h since now.
func hold(c *cce.IPClaim, subnetID string, addr netip.Addr, h Holder, at Attachment, now time.Time) {
	if c.Labels == nil {
		c.Labels = map[string]string{}
	}
	c.Labels[cce.LabelSubnetID] = subnetID
	c.Spec = cce.IPClaimSpec{
		SubnetID:   subnetID,
		IP:         addr.Unmap().WithZone("").String(),
		Holder:     &cce.IPClaimHolder{Namespace: h.Namespace, Name: h.Name},
		Node:       at.Node,
		ENIID:      at.ENIID,
		PSTS:       at.PSTS,
		ReservedAt: stamp(now),
	}
}

// needsRefresh reports whether a Reserve by the claim's own holder must
// write: the attachment or subnet changed, or half the orphan grace has
// passed since the claim was last reserved (so that the Keeper, which frees
// a claim whose holder has no wep after the whole grace, leaves the caller
// at least half of it to write its wep).
func needsRefresh(c *cce.IPClaim, subnetID string, at Attachment, now time.Time, grace time.Duration) bool {
	if c.Spec.Node != at.Node || c.Spec.ENIID != at.ENIID || c.Spec.PSTS != at.PSTS ||
		c.Spec.SubnetID != subnetID || c.Labels[cce.LabelSubnetID] != subnetID {
		return true
	}
	return c.Spec.ReservedAt == nil || now.Sub(c.Spec.ReservedAt.Time) >= grace/2
}

// release makes c (a copy) free since now; notBefore, when set, also keeps
// everyone off it until then. The attachment stays: it is the last holder's.
func release(c *cce.IPClaim, now time.Time, notBefore *time.Time) {
	c.Spec.Holder = nil
	c.Spec.ReleasedAt = stamp(now)
	if notBefore != nil {
		c.Spec.NotBefore = stamp(*notBefore)
	}
}

// reservedAt is when the claim was last reserved: spec.reservedAt, or its
// creation for a claim without one.
func reservedAt(c *cce.IPClaim) time.Time {
	if c.Spec.ReservedAt != nil {
		return c.Spec.ReservedAt.Time
	}
	return c.CreationTimestamp.Time
}
