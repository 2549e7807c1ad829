package ipam

import (
	"context"
	"net/netip"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
)

// A ghost wep names an address of a served node that the datastore holds
// idle, or gives to another pod: a write that should never have landed (a
// replica that lost the node, an edit by hand). Handing the address out
// again would give one IP to two pods, so an idle one is held (HoldConflict)
// until no wep names it; an address two pods claim cannot be taken back from
// either and is only reported. Every finding is an Event on the node and
// cce_ipam_ghost_weps_total{kind}, and is confirmed by a live read of the wep
// first: the GC's paged list may predate a DEL that freed the address since.

// checkGhost is the GC's look at one wep of a synced served node; it runs
// under gcMu, which guards ghostHeld.
func (i *IPAM) checkGhost(ctx context.Context, w *cce.WorkloadEndpoint) {
	addr, err := netip.ParseAddr(w.Spec.IP)
	if err != nil {
		return
	}
	pod := datastore.PodKey{
		Namespace: w.Namespace,
		Name:      w.Name,
	}
	info, err := i.store.LookupIP(addr)
	if err != nil {
		return // not recorded here: the ENI sync adopts it if the cloud has it
	}
	switch {
	case info.State == datastore.StateAssigned && info.Owner.Pod() == pod && info.Node == w.Spec.Node:
		return
	case info.State == datastore.StateHeld:
		return
	}
	live, err := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(w.Namespace).Get(ctx, w.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || err != nil || live.Spec.IP != w.Spec.IP || live.Spec.Node != w.Spec.Node {
		return // gone or changed since the list: not a ghost
	}
	if info, err = i.store.LookupIP(addr); err != nil {
		return
	}
	switch {
	case info.State == datastore.StateIdle:
		if held, err := i.store.Hold(info.Node, []netip.Addr{addr}, datastore.HoldConflict); err != nil || len(held) == 0 {
			return
		}
		if i.ghostHeld == nil {
			i.ghostHeld = map[netip.Addr]string{}
		}
		i.ghostHeld[addr] = info.Node
		i.metrics.ghostWEPs.WithLabelValues("idle_held").Inc()
		i.nodeEvent(w.Spec.Node, "GhostWorkloadEndpoint",
			"wep %s/%s names %s, which the pool held idle on %s; held out of the pool while the wep names it",
			w.Namespace, w.Name, addr, info.Node)
		i.log.Error("ghost wep: it names an idle address; held out of the pool", "wep", pod.String(), "ip", addr, "node", info.Node)
	case info.State == datastore.StateAssigned && (info.Owner.Pod() != pod || info.Node != w.Spec.Node):
		i.metrics.ghostWEPs.WithLabelValues("claimed_twice").Inc()
		i.nodeEvent(w.Spec.Node, "GhostWorkloadEndpoint", "wep %s/%s names %s, which %s on %s holds", w.Namespace, w.Name, addr,
			info.Owner, info.Node)
		i.log.Error("ghost wep: it names an address another pod holds", "wep", pod.String(), "ip", addr, "holder", info.Owner.String(),
			"node", info.Node)
	}
}

// releaseGhostHolds returns to the pool the addresses held for ghost weps
// that no wep names any more (named: this GC pass's weps of served nodes).
func (i *IPAM) releaseGhostHolds(named map[netip.Addr]datastore.PodKey) {
	for addr, node := range i.ghostHeld {
		if _, still := named[addr]; still {
			continue
		}
		if _, err := i.store.Unhold(node, addr, nil, i.deps.Clock.Now()); err != nil {
			i.log.Warn("could not return an address held for a ghost wep", "node", node, "ip", addr, "err", err)
		}
		delete(i.ghostHeld, addr)
	}
}
