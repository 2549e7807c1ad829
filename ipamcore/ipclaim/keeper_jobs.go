package ipclaim

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// Event reasons of the Keeper.
const (
	// ReasonConflict is the Warning event on a kept PSTS wep whose address
	// another pod holds in the ledger.
	ReasonConflict = "IPClaimConflict"
	// ReasonCorrupt is the Warning event on a claim the ledger cannot trust.
	ReasonCorrupt = "IPClaimCorrupt"
)

// reportCorrupt logs and makes an event of every corrupt claim once, and
// counts them. Nobody takes a corrupt claim and the Keeper changes none:
// an operator deletes it (or fixes its spec).
func (k *Keeper) reportCorrupt(claims []*cce.IPClaim, events record.EventRecorder, st *passState) int {
	current := map[string]bool{}
	for _, c := range claims {
		problem := Problem(c)
		if problem == "" {
			continue
		}
		current[c.Name] = true
		if report(st.corrupt, c.Name, problem) {
			k.log.Error("ipclaim: corrupt claim, nobody will take its address; delete or fix it", "claim", c.Name, "problem", problem)
			events.Eventf(c, corev1.EventTypeWarning, ReasonCorrupt, "corrupt IPClaim, nobody will take it: %s", problem)
		}
	}
	forget(st.corrupt, current)
	return len(current)
}

// freeOrphans frees the held claims whose holder has had no wep naming the
// address for the orphan grace (a Reserve whose ADD never committed its
// wep, a Free lost with its replica). The cache's verdict is confirmed with
// a live read of the wep, and the Update carries the claim's
// resourceVersion: a claim reserved again meanwhile is not freed.
func (k *Keeper) freeOrphans(ctx context.Context, claims []*cce.IPClaim, now time.Time, r *Report) error {
	var errs []error
	for _, c := range claims {
		h, held := HolderOf(c)
		if !held || Problem(c) != "" || now.Sub(reservedAt(c)) < k.cfg.OrphanGrace {
			continue
		}
		addr, _ := cce.AddrOfClaimName(c.Name)
		if w, err := k.wepsL.WorkloadEndpoints(h.Namespace).Get(h.Name); err == nil && names(w, addr) {
			continue
		}
		w, err := k.deps.CCE.CceV1alpha1().WorkloadEndpoints(h.Namespace).Get(ctx, h.Name, metav1.GetOptions{})
		switch {
		case err == nil && names(w, addr):
			continue // the cache is behind
		case err != nil && !apierrors.IsNotFound(err):
			errs = append(errs, fmt.Errorf("orphan %s: read the wep of %s: %w", addr, h, err))
			continue
		}
		u := c.DeepCopy()
		release(u, now, nil)
		if _, err := k.claims.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
			if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("orphan %s: free the claim of %s: %w", addr, h, err))
			}
			continue
		}
		r.OrphansFreed++
		k.metrics.orphansFreed.Inc()
		k.log.Info("ipclaim: freed an orphaned claim: its holder has no wep naming the address",
			"ip", addr, "holder", h, "reservedAt", reservedAt(c), "grace", k.cfg.OrphanGrace)
	}
	return errors.Join(errs...)
}

// names reports whether a wep names addr.
func names(w *cce.WorkloadEndpoint, addr netip.Addr) bool {
	for _, s := range []string{w.Spec.IP, w.Spec.IPv6} {
		if a, err := netip.ParseAddr(s); err == nil && a.Unmap().WithZone("") == addr {
			return true
		}
	}
	return false
}

// adopt makes sure every kept PSTS wep's pod holds the claim of its
// address: weps written by the reference have none. A claim held by
// another pod is reported (log, Warning event on the wep), never taken.
func (k *Keeper) adopt(ctx context.Context, weps []*cce.WorkloadEndpoint, now time.Time, events record.EventRecorder,
	st *passState, r *Report) error {
	var errs []error
	current := map[string]bool{}
	for _, w := range weps {
		if !kept(w) {
			continue
		}
		addr, err := netip.ParseAddr(w.Spec.IP)
		if err != nil {
			continue // no IPv4 address to claim; not the ledger's to judge
		}
		addr = addr.Unmap().WithZone("")
		h := Holder{Namespace: w.Namespace, Name: w.Name}
		c := k.cachedClaim(addr)
		if holder, held := heldBy(c); held && holder == h {
			continue
		}
		outcome, other, err := k.adoptOne(ctx, w, addr, h, c, now)
		switch {
		case err != nil:
			errs = append(errs, err)
		case outcome == adopted:
			r.Adopted++
			k.metrics.adopted.Inc()
			k.log.Info("ipclaim: adopted the address of a kept PSTS wep", "ip", addr, "holder", h, "psts", w.Spec.SubnetTopologyReference)
		case outcome == conflict:
			r.Conflicts++
			key := h.String()
			current[key] = true
			msg := fmt.Sprintf("address %s is claimed by %s in the IPClaim ledger, not by this pod; "+
				"two pods may use one address: delete one of them (or the claim, once the other is gone)", addr, other)
			if report(st.conflicts, key, msg) {
				k.log.Error("ipclaim: a kept PSTS wep's address is held by another pod; not overwritten",
					"ip", addr, "wep", key, "holder", other)
				events.Event(w, corev1.EventTypeWarning, ReasonConflict, msg)
			}
		}
	}
	forget(st.conflicts, current)
	return errors.Join(errs...)
}

type adoption int

const (
	unchanged adoption = iota // held by the wep's pod already, or the wep is gone: nothing to do
	adopted                   // created or taken over
	conflict                  // held by another pod
	skipped                   // corrupt, or changed under the pass: the next pass looks again
)

// adoptOne makes h hold addr's claim c (nil: none in the cache): Create
// it; take a free one over (compare-and-swap) once a live read confirms the
// wep; report one held by another pod.
func (k *Keeper) adoptOne(ctx context.Context, w *cce.WorkloadEndpoint, addr netip.Addr, h Holder, c *cce.IPClaim,
	now time.Time) (adoption, Holder, error) {
	at := Attachment{Node: w.Spec.Node, ENIID: w.Spec.ENIID, PSTS: w.Spec.SubnetTopologyReference}
	if c == nil {
		_, err := k.claims.Create(ctx, newClaim(w.Spec.SubnetID, addr, h, at, now), metav1.CreateOptions{})
		if err == nil {
			return adopted, Holder{}, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return skipped, Holder{}, fmt.Errorf("adopt %s for %s: create its claim: %w", addr, h, err)
		}
		if c, err = k.claims.Get(ctx, cce.ClaimName(addr), metav1.GetOptions{}); err != nil {
			return skipped, Holder{}, fmt.Errorf("adopt %s for %s: read its claim: %w", addr, h, err)
		}
	}
	if Problem(c) != "" {
		return skipped, Holder{}, nil // reported as corrupt
	}
	holder, held := HolderOf(c)
	switch {
	case held && holder == h:
		return unchanged, Holder{}, nil
	case held:
		return conflict, holder, nil
	}
	// Free: the wep's pod has the address (the reference kept it on its
	// ENI), whatever cooling or block the claim carries; unless the cache
	// still shows a wep that is gone.
	live, err := k.deps.CCE.CceV1alpha1().WorkloadEndpoints(w.Namespace).Get(ctx, w.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && (!kept(live) || !names(live, addr))) {
		return unchanged, Holder{}, nil
	}
	if err != nil {
		return skipped, Holder{}, fmt.Errorf("adopt %s for %s: read the wep: %w", addr, h, err)
	}
	u := c.DeepCopy()
	hold(u, w.Spec.SubnetID, addr, h, at, now)
	if _, err := k.claims.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return skipped, Holder{}, nil
		}
		return skipped, Holder{}, fmt.Errorf("adopt %s for %s: take its free claim over: %w", addr, h, err)
	}
	return adopted, Holder{}, nil
}

func (k *Keeper) cachedClaim(addr netip.Addr) *cce.IPClaim {
	c, err := k.claimsL.Get(cce.ClaimName(addr))
	if err != nil {
		return nil
	}
	return c
}

// sweep deletes the free claims (past their cooling and block) of subnets
// that no PSTS lists any more, with a UID and resourceVersion precondition:
// a claim reserved again meanwhile stays. Claims are bounded by the
// exclusive subnets' sizes; this bounds them by the subnets in use.
func (k *Keeper) sweep(ctx context.Context, claims []*cce.IPClaim, spreads []*cce.PodSubnetTopologySpread, now time.Time,
	r *Report) error {
	listed := map[string]bool{}
	for _, p := range spreads {
		for id := range p.Spec.Subnets {
			listed[id] = true
		}
	}
	var errs []error
	for _, c := range claims {
		if s, _ := stateAt(c, now, k.cfg.Cooling); s != stateFree || listed[c.Spec.SubnetID] {
			continue
		}
		uid, rv := c.UID, c.ResourceVersion
		err := k.claims.Delete(ctx, c.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		if err != nil {
			if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("sweep the claim %s: %w", c.Name, err))
			}
			continue
		}
		r.Swept++
		k.metrics.swept.Inc()
		k.log.Info("ipclaim: deleted the free claim of a subnet no PSTS lists", "claim", c.Name, "subnet", c.Spec.SubnetID)
	}
	return errors.Join(errs...)
}
