package ipam

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
)

// Leaked-IP GC (the reference's GC step 5). Every address the datastore
// records on a served node's ENIs (the ENI sync keeps that record equal to
// the cloud, address by address: reconcile.go) is, on each GC pass, one of:
//
//   - named by a wep (assigned to the wep's pod, or reserved by a fixed,
//     custom-reuse or kept PSTS wep anywhere): left alone;
//   - idle in the pool, or held by another path (a conflict, a cloud delete
//     or a read in flight): left alone, unless a running pod uses it;
//   - used by a running pod (its status.podIP) that no wep gives it: held,
//     never handed out, until no running pod uses it (podipguard.go);
//   - none of these: assigned to a pod whose wep is gone, or an orphan (a
//     cloud address the datastore did not know and no wep names, recorded
//     by the ENI sync as HoldOrphan). A suspect. Its first sighting is
//     stamped; seen in use again (also under another ENI) the stamp goes;
//     still a suspect after LeakGrace (--leaked-ip-grace), confirmed live
//     (no running pod in the cluster reports the address), it is deleted
//     from the cloud — never returned to the pool, since nothing proves that
//     nothing outside the IPAM uses it. A failed delete is retried on the
//     next pass.
//
// Cross-subnet (PSTS) addresses are not looked at: the PSTS release and the
// ENI sync's stray deletion own them.

// wepClaim is a wep's claim on an address, as a GC pass read it.
type wepClaim struct {
	node  string
	owner datastore.Owner
}

// collectLeakedIPs runs the leaked-IP GC over the served nodes whose pod
// watch has synced, and exports the suspects and holds as gauges.
func (i *IPAM) collectLeakedIPs(ctx context.Context, named map[netip.Addr]datastore.PodKey, claimed map[netip.Addr]wepClaim,
	nodes map[string]bool) {
	now := i.deps.Clock.Now()
	seen := map[netip.Addr]bool{}
	var oldest time.Duration
	inUse, pastGrace := 0, 0
	for nodeName := range nodes {
		// Per node, as in-flight work of the node (see collectServedWEP).
		ctx, n, done, ok := i.acquireWork(ctx, nodeName)
		if !ok {
			continue
		}
		o, held, past := i.collectLeakedIPsOf(ctx, n, named, claimed, now, seen)
		oldest, inUse, pastGrace = max(oldest, o), inUse+held, pastGrace+past
		done()
	}
	for a := range i.leakSuspects {
		if !seen[a] {
			delete(i.leakSuspects, a)
		}
	}
	i.metrics.leakSuspects.Set(float64(len(i.leakSuspects)))
	i.metrics.leakOldest.Set(oldest.Seconds())
	i.metrics.leakPastGrace.Set(float64(pastGrace))
	i.metrics.heldInUse.Set(float64(inUse))
}

// collectLeakedIPsOf is collectLeakedIPs for one node; it returns the age of
// its oldest suspect still in its grace period, how many addresses it holds
// for running pods, and how many suspects past their grace it could not
// delete (the leaked-IP alert's signal: the GC is stuck, not waiting).
func (i *IPAM) collectLeakedIPsOf(ctx context.Context, n *node, named map[netip.Addr]datastore.PodKey,
	claimed map[netip.Addr]wepClaim, now time.Time, seen map[netip.Addr]bool) (oldest time.Duration, inUse, pastGrace int) {
	if i.mayAct(n.name) != nil {
		return 0, 0, 0
	}
	users, ok := n.podIPUsers()
	if !ok {
		return 0, 0, 0
	}
	snap, err := i.store.Snapshot(n.name)
	if err != nil {
		return 0, 0, 0
	}
	for _, e := range snap.ENIs {
		for _, ip := range e.IPs {
			if ip.CrossSubnet {
				continue
			}
			user, used := users[ip.Addr]
			switch {
			case ip.State == datastore.StateHeld && ip.HoldReason == datastore.HoldInUse:
				if used {
					inUse++
				} else {
					i.releaseInUse(n, ip, now)
				}
				continue
			case ip.State == datastore.StateIdle:
				if used && i.holdInUse(n, ip, user) {
					inUse++
				}
				continue
			case ip.State == datastore.StateAssigned:
				if named[ip.Addr] == ip.Owner.Pod() {
					continue
				}
				if c, ok := claimed[ip.Addr]; ok && c.owner.Pod() != ip.Owner.Pod() {
					continue // another wep names it: the ghost check's business
				}
				if i.wepNames(ctx, ip) {
					continue
				}
				if used {
					if i.holdInUse(n, ip, user) {
						inUse++
					}
					continue
				}
			case ip.State == datastore.StateHeld && ip.HoldReason == datastore.HoldOrphan:
				if used {
					if i.holdInUse(n, ip, user) {
						inUse++
					}
					continue
				}
				if c, ok := claimed[ip.Addr]; ok {
					if c.node == n.name {
						i.adoptOrphan(n, ip, c.owner)
					}
					continue // reserved by a wep (another node's: a fixed IP on its way)
				}
			default:
				continue // held by another path, which decides
			}
			seen[ip.Addr] = true
			first, ok := i.leakSuspects[ip.Addr]
			if !ok {
				i.leakSuspects[ip.Addr] = now
				continue
			}
			if age := now.Sub(first); age < i.cfg.LeakGrace {
				oldest = max(oldest, age)
				continue
			}
			if !i.settleSuspect(ctx, n, ip, first, seen) {
				pastGrace++
			}
		}
	}
	return oldest, inUse, pastGrace
}

// settleSuspect deletes a suspect past its grace; it reports whether the
// suspect is settled: deleted, or found in use and held.
func (i *IPAM) settleSuspect(ctx context.Context, n *node, ip datastore.IPInfo, first time.Time, seen map[netip.Addr]bool) bool {
	if i.deleteLeakedIP(ctx, n, ip, first) {
		delete(i.leakSuspects, ip.Addr)
		delete(seen, ip.Addr)
		return true
	}
	_, still := i.leakSuspects[ip.Addr]
	return !still
}

// holdInUse holds an address a running pod uses without a wep giving it
// (podipguard.go); it reports whether the address is now so held.
func (i *IPAM) holdInUse(n *node, ip datastore.IPInfo, user datastore.PodKey) bool {
	err := i.store.HoldInUse(n.name, ip.Addr, ip.State, ip.Owner.Pod())
	if err != nil {
		// Changed since the snapshot (allocated: the allocation guard saw
		// it), or held by a path that decides: the next pass looks again.
		i.log.Info("gc: did not hold an address a running pod uses; next pass", "node", n.name, "ip", ip.Addr,
			"pod", user.String(), "err", err)
		return false
	}
	i.heldInUse(n.name, ip.Addr, user, "gc")
	return true
}

// releaseInUse returns to the pool an address held for a running pod that
// no running pod uses any more: the pod finished or was deleted. It cools
// from now, as any release does.
func (i *IPAM) releaseInUse(n *node, ip datastore.IPInfo, now time.Time) {
	if _, err := i.store.Unhold(n.name, ip.Addr, nil, now); err != nil {
		i.log.Warn("gc: could not release an address held for a running pod", "node", n.name, "ip", ip.Addr, "err", err)
		return
	}
	i.metrics.gcActions.WithLabelValues(gcInUseReleased).Inc()
	i.log.Info("gc: no running pod uses an address held for one any more; back to the pool", "node", n.name, "ip", ip.Addr)
	n.refill()
}

// adoptOrphan gives an orphaned address to the wep of the node that names
// it (written since the ENI sync recorded the orphan).
func (i *IPAM) adoptOrphan(n *node, ip datastore.IPInfo, o datastore.Owner) {
	if _, err := i.store.Unhold(n.name, ip.Addr, &o, i.deps.Clock.Now()); err != nil {
		i.log.Warn("gc: could not give an orphaned address to the wep naming it", "node", n.name, "ip", ip.Addr,
			"wep", o.Pod().String(), "err", err)
		return
	}
	i.log.Info("gc: an orphaned address is named by a wep; assigned to it", "node", n.name, "ip", ip.Addr, "wep", o.Pod().String())
}

// deleteLeakedIP deletes a suspect past its grace from the cloud and the
// datastore; it reports whether the address is gone. Assigned addresses are
// taken out of circulation first (orphans never are in it), so nothing
// allocates one while the cloud call is in flight; a failed call puts the
// address back as it was, for the next pass.
func (i *IPAM) deleteLeakedIP(ctx context.Context, n *node, ip datastore.IPInfo, first time.Time) bool {
	if user, used, err := i.runningPodWithIP(ctx, ip.Addr); err != nil || used {
		if used && i.holdInUse(n, ip, user) {
			delete(i.leakSuspects, ip.Addr) // in use, not leaked: no longer a suspect
		}
		return false
	}
	if i.mayAct(n.name) != nil {
		return false
	}
	if ip.State == datastore.StateAssigned {
		if _, err := i.store.Surrender(n.name, ip.Addr, ip.Owner.Pod()); err != nil {
			return false
		}
	}
	err := i.deps.Cloud.DeletePrivateIP(ctx, ip.ENIID, ip.Addr.String())
	if err != nil && !errors.Is(err, cloud.ErrPrivateIPNotFound) && !errors.Is(err, cloud.ErrENINotFound) {
		if ip.State == datastore.StateAssigned {
			if _, uerr := i.store.Unhold(n.name, ip.Addr, &ip.Owner, i.deps.Clock.Now()); uerr != nil {
				i.log.Error("gc: could not restore a leaked address after its cloud delete failed", "node", n.name,
					"ip", ip.Addr, "err", uerr)
			}
		}
		i.log.Warn("gc: delete a leaked IP from the cloud; will retry next pass", "node", n.name, "eni", ip.ENIID,
			"ip", ip.Addr, "err", err)
		return false
	}
	_, _ = i.store.RemoveIP(n.name, ip.Addr)
	i.metrics.gcActions.WithLabelValues(gcLeakedIP).Inc()
	was := "an orphaned cloud address"
	if ip.State == datastore.StateAssigned {
		was = "assigned to " + ip.Owner.String()
	}
	i.nodeEvent(n.name, "DeletedLeakedIP", "deleted %s from ENI %s: %s, no WorkloadEndpoint and no running pod since %s",
		ip.Addr, ip.ENIID, was, first.UTC().Format(time.RFC3339))
	i.log.Info("gc: deleted a leaked IP from the cloud", "node", n.name, "eni", ip.ENIID, "ip", ip.Addr, "was", was,
		"suspect_since", first)
	return true
}

// runningPodWithIP asks the API server whether any running pod in the
// cluster reports addr: the last word before a cloud delete, which the
// node's pod watch may not have caught up with.
func (i *IPAM) runningPodWithIP(ctx context.Context, addr netip.Addr) (datastore.PodKey, bool, error) {
	pods, err := i.deps.Kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("status.podIP", addr.String()).String(),
	})
	if err != nil {
		i.log.Warn("gc: could not confirm that no pod uses a leaked IP; kept", "ip", addr, "err", err)
		return datastore.PodKey{}, false, err
	}
	for k := range pods.Items {
		// The server filtered on status.podIP; checked again for a server
		// (or a test double) that does not.
		if p := &pods.Items[k]; podRunsOnNetwork(p) && slices.Contains(podAddrs(p), addr) {
			return datastore.PodKey{Namespace: p.Namespace, Name: p.Name}, true, nil
		}
	}
	return datastore.PodKey{}, false, nil
}
