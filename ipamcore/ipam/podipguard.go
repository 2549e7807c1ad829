package ipam

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	"github.com/cce-ipam/sharded/ipamcore/datastore"
)

// The podIP guard. A wep deleted out of band while its pod runs leaves an
// address that nothing the IPAM writes names, yet a pod still uses: handed
// out again it would be one IP on two pods (I3). So the running pods'
// status.podIP counts as a claim of its own:
//
//   - the leaked-IP GC holds every address of a served node that a running
//     pod uses without a wep naming it for that pod (datastore.HoldInUse:
//     never allocated), whatever the datastore had it as (idle, assigned to
//     the deleted wep's pod, orphaned, unsettled after a takeover);
//   - Allocate checks the address the datastore picked against the node's
//     running pods and holds it instead of handing it out (the GC runs
//     every few minutes; this closes the window in between);
//   - an address stays held while a running pod uses it; once none does
//     (the pod finished or was deleted: a DEL finds no wep and frees
//     nothing), the GC returns it to the pool, cooling like any release.
//
// Each hold is logged, counted in cce_ipam_gc_actions_total{kind="in_use_held"}
// (and in_use_released when it ends), reported as an Event on the node, and
// cce_ipam_ips_held_in_use shows how many are held now.
//
// "Running" is the reference's rule: a pod not on the host network that has
// not finished (a pod being deleted still runs until it is gone). The node's
// pod watch (nodeCache) answers; a pod too new to be in it has no podIP yet.

// podRunsOnNetwork reports whether p holds its addresses: not on the host
// network, not finished.
func podRunsOnNetwork(p *corev1.Pod) bool {
	return !p.Spec.HostNetwork && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// podAddrs returns the addresses a pod's status reports.
func podAddrs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a.Unmap())
		}
	}
	add(p.Status.PodIP)
	for _, x := range p.Status.PodIPs {
		if x.IP != p.Status.PodIP {
			add(x.IP)
		}
	}
	return out
}

// podIPUsers maps each address a running pod of the node uses to the pod;
// ok is false while the node's pod watch has not synced (no verdict then).
func (n *node) podIPUsers() (users map[netip.Addr]datastore.PodKey, ok bool) {
	if n.cache == nil || !n.cache.synced() {
		return nil, false
	}
	users = map[netip.Addr]datastore.PodKey{}
	for _, obj := range n.cache.pods.List() {
		p, isPod := obj.(*corev1.Pod)
		if !isPod || !podRunsOnNetwork(p) {
			continue
		}
		for _, a := range podAddrs(p) {
			users[a] = datastore.PodKey{Namespace: p.Namespace, Name: p.Name}
		}
	}
	return users, true
}

// podUsing returns a running pod of the node other than except that reports
// addr, without building podIPUsers' whole map: Allocate asks for one address
// per call. ok is false while the node's pod watch has not synced.
func (n *node) podUsing(addr netip.Addr, except datastore.PodKey) (user datastore.PodKey, used, ok bool) {
	if n.cache == nil || !n.cache.synced() {
		return datastore.PodKey{}, false, false
	}
	for _, obj := range n.cache.pods.List() {
		p, isPod := obj.(*corev1.Pod)
		if !isPod || !podRunsOnNetwork(p) {
			continue
		}
		for _, a := range podAddrs(p) {
			if k := (datastore.PodKey{Namespace: p.Namespace, Name: p.Name}); a == addr && k != except {
				return k, true, true
			}
		}
	}
	return datastore.PodKey{}, false, true
}

// guardAllocation is Allocate's look at the address the datastore just gave
// owner: when another running pod of the node uses it, the address is held
// (HoldInUse) instead, and the caller must pick again. It reports whether it
// held the address.
func (i *IPAM) guardAllocation(n *node, info datastore.IPInfo) bool {
	user, used, ok := n.podUsing(info.Addr, info.Owner.Pod())
	if !ok || !used {
		return false
	}
	if err := i.store.HoldInUse(n.name, info.Addr, datastore.StateAssigned, info.Owner.Pod()); err != nil {
		// Still assigned to the caller's pod: refusing it would need the
		// release the caller does on any error; say so and let it be.
		i.log.Error("podIP guard: could not hold an address a running pod uses", "node", n.name, "ip", info.Addr,
			"user", user.String(), "err", err)
		return false
	}
	i.heldInUse(n.name, info.Addr, user, "allocation")
	return true
}

// heldInUse reports a new HoldInUse.
func (i *IPAM) heldInUse(nodeName string, addr netip.Addr, user datastore.PodKey, by string) {
	i.metrics.gcActions.WithLabelValues(gcInUseHeld).Inc()
	i.nodeEvent(nodeName, "AddressInUseWithoutWEP",
		"%s is used by running pod %s, which no WorkloadEndpoint gives it; held out of the pool until the pod is gone", addr, user)
	i.log.Warn("podIP guard: a running pod uses an address no wep gives it; held out of the pool",
		"node", nodeName, "ip", addr, "pod", user.String(), "found_by", by)
}

const (
	gcInUseHeld     = "in_use_held"
	gcInUseReleased = "in_use_released"
)
