package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
	"github.com/cce-ipam/sharded/ipamcore/ipclaim"
	"github.com/cce-ipam/sharded/ipamcore/podip"
	"github.com/cce-ipam/sharded/ipamcore/psts"
)

// releasePSTS is the DEL of a PSTS pod on a served node. A kept address
// (Fixed, custom reuse) stays on the ENI, assigned, and the wep records when
// the pod went (the TTL counts from then; GC frees it). Any other address is
// released at once: the wep first (while it exists the address stays the
// pod's, so a failure is retried by kubelet), then the address, then its
// claim.
func (i *IPAM) releasePSTS(ctx context.Context, n *node, wep *cce.WorkloadEndpoint, tok *FenceToken,
	until time.Time) (podip.Endpoint, bool, error) {
	if wep.IsFixedStatefulSet() || wep.IsCustomReuse() {
		i.keepOnRelease(ctx, markPodDeleted(wep, i.deps.Clock.Now()), tok, until)
		i.metrics.releases.WithLabelValues("ok", pathPSTS).Inc()
		return endpointOf(wep), true, nil
	}
	addr, err := netip.ParseAddr(wep.Spec.IP)
	if err != nil {
		return podip.Endpoint{}, false, fmt.Errorf("WorkloadEndpoint %s/%s has an unparsable IP %q", wep.Namespace, wep.Name, wep.Spec.IP)
	}
	if err := i.deleteWEP(ctx, wep); err != nil {
		i.metrics.releases.WithLabelValues("error", pathPSTS).Inc()
		return podip.Endpoint{}, false, err
	}
	i.freePSTSAddress(ctx, n, wep, addr)
	i.metrics.releases.WithLabelValues("ok", pathPSTS).Inc()
	return endpointOf(wep), true, nil
}

// freePSTSAddress gives up the address of a deleted PSTS wep: an address of
// the ENI's own subnet goes back to the pool like any other, a cross-subnet
// one leaves the ENI (and then its claim, if it has one).
func (i *IPAM) freePSTSAddress(ctx context.Context, n *node, wep *cce.WorkloadEndpoint, addr netip.Addr) {
	pod := datastore.PodKey{Namespace: wep.Namespace, Name: wep.Name}
	cur, err := i.store.LookupIP(addr)
	onNode := err == nil && cur.Node == n.name
	if onNode && !cur.CrossSubnet {
		if cur.State == datastore.StateAssigned && cur.Owner.Pod() == pod {
			if _, err := i.store.Release(n.name, addr, cur.Owner.ContainerID, i.deps.Clock.Now()); err != nil {
				i.log.Warn("could not return a PSTS address to the pool", "node", n.name, "ip", addr, "err", err)
			}
		}
		return
	}
	eniID := wep.Spec.ENIID
	if onNode {
		eniID = cur.ENIID
	}
	i.dropPSTS(ctx, n, pod, addr, eniID, i.mayHoldClaim(addr, pod, wep.Spec.SubnetID))
}

// mayHoldClaim reports whether pod may hold the claim of addr, so that its
// release must free it: the ledger's cache says so, or the address is of an
// exclusive subnet (whose addresses are claimed), where the cache may not
// have seen the pod's claim yet under load. Free then reads the claim from
// the API server when its cache disagrees, and changes it only if pod holds
// it. Deciding from the cache alone left such a claim held by a gone pod
// until the claim keeper freed it (TestPSTS_DELFreesTheClaimTheCacheHasNotSeen).
func (i *IPAM) mayHoldClaim(addr netip.Addr, pod datastore.PodKey, subnetID string) bool {
	if _, held := i.claimOf(addr, pod); held {
		return true
	}
	if i.deps.Claims == nil {
		return false
	}
	sn := i.subnetCR(subnetID)
	return sn != nil && sn.Spec.Exclusive
}

// claimOf reports whether the ledger knows a claim of addr held by pod (no
// request: the ledger's informer).
func (i *IPAM) claimOf(addr netip.Addr, pod datastore.PodKey) (*cce.IPClaim, bool) {
	if i.deps.Claims == nil {
		return nil, false
	}
	c, ok := i.deps.Claims.Lookup(addr)
	if !ok || c.Spec.Holder == nil || c.Spec.Holder.Namespace != pod.Namespace || c.Spec.Holder.Name != pod.Name {
		return nil, false
	}
	return c, true
}

// markPodDeleted is wep recording that its pod is gone (now), so its TTL
// counts from then.
func markPodDeleted(wep *cce.WorkloadEndpoint, now time.Time) *cce.WorkloadEndpoint {
	upd := wep.DeepCopy()
	upd.Spec.UpdateAt = metav1.NewTime(now)
	if upd.Spec.Phase != cce.WorkloadEndpointPhasePodDeleted {
		upd.Spec.Phase = cce.WorkloadEndpointPhasePodDeleted
		if upd.Spec.Release == nil {
			upd.Spec.Release = &cce.WorkloadEndpointRelease{}
		}
		upd.Spec.Release.PodDeletedTime = metav1.NewTime(now)
	}
	return upd
}

// GC reasons of PSTS weps.
const (
	gcPSTSExpired = "psts_ttl_expired"
	gcPSTSDeleted = "psts_deleted"
	gcPSTSMark    = "psts_mark_deleted"
)

// pstsGarbage decides what GC does with a PSTS wep of a served node whose
// pod may be gone: a kept address goes when its PSTS is deleted or its TTL
// since the pod went has passed (a Fixed one also when its StatefulSet no
// longer wants it, as ordinary fixed IPs); with release strategy Never it
// goes only with its PSTS. Any other address goes with its pod.
func (i *IPAM) pstsGarbage(ctx context.Context, w *cce.WorkloadEndpoint) (string, bool) {
	if _, ok := i.cachedPod(w.Spec.Node, w.Namespace, w.Name); ok {
		return "", false
	}
	kept := w.IsFixedStatefulSet() || w.IsCustomReuse()
	if !kept {
		if i.podExists(ctx, w.Namespace, w.Name) {
			return "", false
		}
		return gcLeakedPod, true
	}
	ref := w.Spec.SubnetTopologyReference
	p, err := i.spreads.PodSubnetTopologySpreads(w.Namespace).Get(ref)
	if apierrors.IsNotFound(err) {
		p, err = i.deps.CCE.CceV1alpha1().PodSubnetTopologySpreads(w.Namespace).Get(ctx, ref, metav1.GetOptions{})
	}
	switch {
	case apierrors.IsNotFound(err):
		if i.podExists(ctx, w.Namespace, w.Name) {
			return "", false
		}
		return gcPSTSDeleted, true
	case err != nil:
		return "", false
	}
	if i.podExists(ctx, w.Namespace, w.Name) {
		return "", false
	}
	if w.Spec.Phase != cce.WorkloadEndpointPhasePodDeleted {
		return gcPSTSMark, true // the DEL never came: the TTL starts now
	}
	s := psts.Resolve(p, w.Spec.SubnetID)
	if s.ReleaseStrategy == cce.ReleaseStrategyNever || w.Spec.FixIPDeletePolicy == string(cce.ReleaseStrategyNever) {
		return "", false
	}
	ttl := psts.TTL(s)
	if w.Spec.Release != nil && w.Spec.Release.TTL.Duration > 0 {
		ttl = w.Spec.Release.TTL.Duration
	}
	if w.IsFixedStatefulSet() {
		if kind, ok := i.fixedGarbage(ctx, w); ok {
			return kind, true
		}
		if ttl <= 0 {
			return "", false // Fixed without a TTL: only its StatefulSet lets go
		}
	}
	if w.Spec.Release == nil || w.Spec.Release.PodDeletedTime.IsZero() {
		return gcPSTSMark, true
	}
	if i.deps.Clock.Since(w.Spec.Release.PodDeletedTime.Time) < ttl {
		return "", false
	}
	return gcPSTSExpired, true
}

// collectPSTS carries out a PSTS GC verdict on a served node's wep.
func (i *IPAM) collectPSTS(ctx context.Context, w *cce.WorkloadEndpoint, kind string) {
	unlock := i.podLock.lock(w.Namespace + "/" + w.Name)
	defer unlock()
	if kind == gcPSTSMark {
		upd := markPodDeleted(w, i.deps.Clock.Now())
		tok, until, err := i.fenceFor(w.Spec.Node)
		if err != nil {
			return
		}
		if tok != nil {
			tok.Stamp(upd)
		}
		uctx, cancel := fencedContext(ctx, until)
		defer cancel()
		_, err = i.deps.CCE.CceV1alpha1().WorkloadEndpoints(w.Namespace).Update(uctx, upd, metav1.UpdateOptions{})
		i.wepWritten(err)
		if err != nil {
			i.log.Info("gc: could not mark a PSTS wep whose pod is gone", "wep", w.Namespace+"/"+w.Name, "err", err)
			return
		}
		i.metrics.gcActions.WithLabelValues(kind).Inc()
		return
	}
	addr, err := netip.ParseAddr(w.Spec.IP)
	if err != nil {
		return
	}
	if err := i.deleteWEP(ctx, w); err != nil {
		i.log.Warn("gc: delete a PSTS wep", "wep", w.Namespace+"/"+w.Name, "err", err)
		return
	}
	if n, served := i.node(w.Spec.Node); served {
		i.freePSTSAddress(ctx, n, w, addr)
	} else if i.mayHoldClaim(addr, datastore.PodKey{Namespace: w.Namespace, Name: w.Name}, w.Spec.SubnetID) {
		// A deleted node's: its ENIs go with it (the leaked-ENI sweep).
		if err := i.deps.Claims.Free(ctx, addr, ipclaim.Holder{Namespace: w.Namespace, Name: w.Name}); err != nil {
			i.log.Warn("gc: could not free the claim of a deleted node's PSTS address", "ip", addr, "err", err)
		}
	}
	i.metrics.gcActions.WithLabelValues(kind).Inc()
	i.nodeEvent(w.Spec.Node, "ReleasedPSTSIP", "released %s of %s/%s (%s)", addr, w.Namespace, w.Name, kind)
	i.log.Info("gc: released a PSTS address", "reason", kind, "wep", w.Namespace+"/"+w.Name, "ip", addr)
}
