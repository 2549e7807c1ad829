package ipam

import (
	"context"
	"errors"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/cloud"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
)

// gcLoop runs CollectGarbage every GCPeriod until ctx ends.
func (i *IPAM) gcLoop(ctx context.Context) {
	tick := i.deps.Clock.NewTicker(i.cfg.GCPeriod)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
			i.CollectGarbage(ctx)
		}
	}
}

// CollectGarbage runs one pass of every GC routine over the served nodes:
// fixed IPs of deleted or scaled-down StatefulSets, weps of deleted pods, and
// assigned IPs that no wep names (leaked, after LeakGrace). A node whose pod
// watch has not synced yet waits for the next pass. On the leader it also
// sweeps what belongs to no shard: weps and IPPools of deleted nodes.
//
// No replica caches the weps: one pass reads them all, in pages, and keeps
// only those of served nodes (and, on the leader, of deleted ones).
func (i *IPAM) CollectGarbage(ctx context.Context) {
	// One pass at a time: the leak suspects' first-seen times are shared.
	i.gcMu.Lock()
	defer i.gcMu.Unlock()
	start := i.deps.Clock.Now()
	leader := i.deps.IsLeader == nil || i.deps.IsLeader()
	synced := map[string]bool{}
	for _, name := range i.ServedNodes() {
		if n, ok := i.node(name); ok && n.cache.synced() {
			synced[name] = true
		}
	}
	named := map[netip.Addr]datastore.PodKey{} // IPs that a wep of a served node names
	claimed := map[netip.Addr]wepClaim{}       // IPs that any wep names, and which
	client := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(metav1.NamespaceAll)
	opts := metav1.ListOptions{Limit: gcListPage}
	for {
		page, err := client.List(ctx, opts)
		if err != nil {
			i.log.Warn("gc: list weps", "err", err)
			return
		}
		for k := range page.Items {
			w := &page.Items[k]
			if addr, err := netip.ParseAddr(w.Spec.IP); err == nil {
				claimed[addr.Unmap()] = wepClaim{node: w.Spec.Node, owner: datastore.Owner{
					Namespace: w.Namespace, Name: w.Name, ContainerID: w.Spec.ContainerID,
				}}
			}
			switch {
			case synced[w.Spec.Node]:
				if addr, err := netip.ParseAddr(w.Spec.IP); err == nil {
					named[addr] = datastore.PodKey{
						Namespace: w.Namespace,
						Name:      w.Name,
					}
				}
				i.collectServedWEP(ctx, w)
				i.checkGhost(ctx, w)
			case i.deletedNodeDuty(w.Spec.Node, leader):
				if _, err := i.nodes.Get(w.Spec.Node); !apierrors.IsNotFound(err) {
					continue
				}
				if _, served := i.node(w.Spec.Node); !served {
					i.collectOnDeletedNode(ctx, w)
				}
			}
		}
		if page.Continue == "" {
			break
		}
		opts.Continue = page.Continue
	}
	i.collectLeakedIPs(ctx, named, claimed, synced)
	i.releaseGhostHolds(named)
	// Pools of deleted nodes belong to no shard either.
	if leader {
		i.collectLeakedIPPools(ctx)
	}
	i.metrics.gcDuration.Observe(i.deps.Clock.Since(start).Seconds())
}

// gcListPage bounds how many weps a GC pass holds at a time.
const gcListPage = 500

// collectServedWEP frees what a wep of a served node no longer needs, as
// in-flight work of the node (acquireWork): skipped once the node is no
// longer served here, waited for (its cloud call cut off) by
// StopServingNode, and its cloud calls fenced by the node's permission.
func (i *IPAM) collectServedWEP(ctx context.Context, w *cce.WorkloadEndpoint) {
	ctx, _, done, ok := i.acquireWork(ctx, w.Spec.Node)
	if !ok {
		return
	}
	defer done()
	if i.mayAct(w.Spec.Node) != nil {
		return
	}
	switch kind, ok := i.wepGarbage(ctx, w); {
	case !ok:
		i.repairWEP(ctx, w)
	case w.Spec.SubnetTopologyReference != "":
		i.collectPSTS(ctx, w, kind)
	case kind == gcDeletedStatefulSet, kind == gcScaledDown:
		i.freeFixed(ctx, w, kind)
	case kind == gcLeakedPod:
		i.freeLeakedPod(ctx, w)
	}
}

const (
	gcDeletedStatefulSet = "deleted_statefulset"
	gcScaledDown         = "scaled_down_statefulset"
	gcLeakedPod          = "leaked_pod"
	gcLeakedIP           = "leaked_ip"
	gcDeletedNode        = "deleted_node"
)

// nodeEvent records a Normal event on a node, for GC actions an operator
// should be able to see with kubectl describe node.
func (i *IPAM) nodeEvent(nodeName, reason, format string, args ...any) {
	if n, err := i.nodes.Get(nodeName); err == nil {
		i.events.Eventf(n, corev1.EventTypeNormal, reason, format, args...)
	}
}

// wepGarbage decides whether a wep of a served node is garbage, and why. It
// confirms with the API server before saying yes: the cache may lag.
func (i *IPAM) wepGarbage(ctx context.Context, w *cce.WorkloadEndpoint) (string, bool) {
	if w.Spec.SubnetTopologyReference != "" {
		return i.pstsGarbage(ctx, w)
	}
	if w.IsFixedStatefulSet() {
		if w.Spec.FixIPDeletePolicy == cce.FixIPDeletePolicyNever {
			return "", false
		}
		return i.fixedGarbage(ctx, w)
	}
	if _, ok := i.cachedPod(w.Spec.Node, w.Namespace, w.Name); ok {
		return "", false
	}
	if i.podExists(ctx, w.Namespace, w.Name) {
		return "", false
	}
	return gcLeakedPod, true
}

// fixedGarbage: a fixed wep whose StatefulSet is gone, or scaled below the
// pod's ordinal while the pod is gone.
func (i *IPAM) fixedGarbage(ctx context.Context, w *cce.WorkloadEndpoint) (string, bool) {
	name, ordinal, ok := cce.StatefulSetName(w.Name)
	if !ok {
		return "", false
	}
	// The cache answers; only a verdict of garbage (gone, or scaled
	// below this ordinal) is confirmed with the API server.
	sts, err := i.statefulSets.StatefulSets(w.Namespace).Get(name)
	if apierrors.IsNotFound(err) || (err == nil && sts.Spec.Replicas != nil && int32(ordinal) >= *sts.Spec.Replicas) {
		sts, err = i.deps.Kube.AppsV1().StatefulSets(w.Namespace).Get(ctx, name, metav1.GetOptions{})
	}
	switch {
	case apierrors.IsNotFound(err):
		return gcDeletedStatefulSet, true
	case err != nil:
		return "", false
	case sts.Spec.Replicas != nil && int32(ordinal) >= *sts.Spec.Replicas && !i.podExists(ctx, w.Namespace, w.Name):
		return gcScaledDown, true
	}
	return "", false
}

// deletedNodeDuty says whether this replica sweeps the weps of a node that
// may be gone: with a fence, the holder of the node's partition (its wep
// writes carry that claim's fencing token); without one, the leader.
func (i *IPAM) deletedNodeDuty(node string, leader bool) bool {
	if i.deps.Fence == nil {
		return leader
	}
	return i.holdsNode(node)
}

// collectOnDeletedNode deletes the wep of a deleted pod on a node that no
// longer exists: no shard serves that node, so no owner's GC sees it. Its IP went with the node's ENIs (the leaked-ENI sweep
// removes those). Fixed-IP weps stay: the pod's next incarnation takes the
// address to its new node.
func (i *IPAM) collectOnDeletedNode(ctx context.Context, w *cce.WorkloadEndpoint) {
	if w.Spec.SubnetTopologyReference != "" && (w.IsFixedStatefulSet() || w.IsCustomReuse()) {
		// A kept PSTS address outlives its node like a fixed IP, until its
		// TTL or its PSTS ends it.
		if kind, ok := i.pstsGarbage(ctx, w); ok && i.nodeGone(ctx, w.Spec.Node) {
			i.collectPSTS(ctx, w, kind)
		}
		return
	}
	if w.IsFixedStatefulSet() || w.IsCustomReuse() || !i.nodeGone(ctx, w.Spec.Node) {
		return
	}
	if kind, ok := i.wepGarbage(ctx, w); !ok || kind != gcLeakedPod {
		return
	}
	unlock := i.podLock.lock(w.Namespace + "/" + w.Name)
	defer unlock()
	if err := i.deleteWEP(ctx, w); err != nil {
		i.log.Warn("gc: delete the wep of a pod on a deleted node", "wep", w.Namespace+"/"+w.Name, "err", err)
		return
	}
	i.metrics.gcActions.WithLabelValues(gcDeletedNode).Inc()
	i.log.Info("gc: deleted the wep of a pod on a deleted node", "wep", w.Namespace+"/"+w.Name, "node", w.Spec.Node, "ip", w.Spec.IP)
}

func (i *IPAM) podExists(ctx context.Context, namespace, name string) bool {
	_, err := i.deps.Kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	return !apierrors.IsNotFound(err) // on other errors, assume it exists
}

// freeLeakedPod releases the IP of a wep whose pod is gone, as a DEL would.
func (i *IPAM) freeLeakedPod(ctx context.Context, w *cce.WorkloadEndpoint) {
	unlock := i.podLock.lock(w.Namespace + "/" + w.Name)
	defer unlock()
	if err := i.deleteWEP(ctx, w); err != nil {
		i.log.Warn("gc: delete leaked wep", "wep", w.Namespace+"/"+w.Name, "err", err)
		return
	}
	if addr, err := netip.ParseAddr(w.Spec.IP); err == nil {
		rel, err := i.store.Release(w.Spec.Node, addr, w.Spec.ContainerID, i.deps.Clock.Now())
		if err != nil && !errors.Is(err, datastore.ErrUnknownIP) && !errors.Is(err, datastore.ErrNotAssigned) {
			i.log.Warn("gc: free IP of leaked pod", "ip", addr, "err", err)
		}
		if n, ok := i.node(w.Spec.Node); ok && err == nil && rel.Removed {
			n.queueReturn(addr, rel.Info.ENIID)
		}
	}
	i.metrics.gcActions.WithLabelValues(gcLeakedPod).Inc()
	i.nodeEvent(w.Spec.Node, "ReleasedLeakedPodIP", "released %s of deleted pod %s/%s", w.Spec.IP, w.Namespace, w.Name)
	i.log.Info("gc: released the IP of a deleted pod", "wep", w.Namespace+"/"+w.Name, "ip", w.Spec.IP)
}

// freeFixed returns a fixed IP whose StatefulSet no longer wants it to the
// cloud, then deletes the wep. The IP is held first so nothing allocates it
// while the cloud call is in flight.
func (i *IPAM) freeFixed(ctx context.Context, w *cce.WorkloadEndpoint, kind string) {
	unlock := i.podLock.lock(w.Namespace + "/" + w.Name)
	defer unlock()
	addr, err := netip.ParseAddr(w.Spec.IP)
	if err != nil {
		return
	}
	if _, err := i.store.Hold(w.Spec.Node, []netip.Addr{addr}, datastore.HoldReleasing); err != nil {
		i.log.Warn("gc: hold fixed IP", "ip", addr, "err", err)
	}
	err = i.deps.Cloud.DeletePrivateIP(ctx, w.Spec.ENIID, addr.String())
	if err != nil && !errors.Is(err, cloud.ErrPrivateIPNotFound) && !errors.Is(err, cloud.ErrENINotFound) {
		owner := &datastore.Owner{
			Namespace:   w.Namespace,
			Name:        w.Name,
			ContainerID: w.Spec.ContainerID,
		}
		_, _ = i.store.Unhold(w.Spec.Node, addr, owner, i.deps.Clock.Now())
		i.log.Warn("gc: delete fixed IP from the cloud; will retry", "ip", addr, "err", err)
		return
	}
	_, _ = i.store.RemoveIP(w.Spec.Node, addr)
	if err := i.deleteWEP(ctx, w); err != nil {
		i.log.Warn("gc: delete fixed wep", "wep", w.Namespace+"/"+w.Name, "err", err)
		return
	}
	i.metrics.gcActions.WithLabelValues(kind).Inc()
	i.nodeEvent(w.Spec.Node, "ReleasedFixedIP", "released fixed IP %s of %s/%s (%s)", addr, w.Namespace, w.Name, kind)
	i.log.Info("gc: released a fixed IP", "reason", kind, "wep", w.Namespace+"/"+w.Name, "ip", addr)
}

// collectLeakedIPPools deletes the IPPools the node agent wrote (creation
// source cce-cni, named after the node it selects) for nodes that no longer
// exist; user pools are left alone. The node's absence is confirmed live.
func (i *IPAM) collectLeakedIPPools(ctx context.Context) {
	client := i.deps.CCE.CceV1alpha1().IPPools(cce.IPPoolNamespace)
	pools, err := client.List(ctx, metav1.ListOptions{})
	if err != nil {
		i.log.Warn("gc: list IPPools", "err", err)
		return
	}
	for _, p := range pools.Items {
		// The agent's pools select their node by hostname.
		nodeName, ok := strings.CutPrefix(p.Spec.NodeSelector, "kubernetes.io/hostname=")
		if !ok || p.Spec.CreationSource != cce.IPPoolCreationSourceCNI || p.Name != cce.IPPoolName(nodeName) {
			continue
		}
		if _, err := i.nodes.Get(nodeName); err == nil {
			continue
		}
		if _, err := i.deps.Kube.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			continue
		}
		err := client.Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})
		switch {
		case err == nil:
			i.metrics.gcActions.WithLabelValues("leaked_ippool").Inc()
			i.log.Info("gc: deleted the IPPool of a deleted node", "ippool", p.Name)
		case !apierrors.IsNotFound(err) && !apierrors.IsConflict(err):
			i.log.Warn("gc: could not delete the IPPool of a deleted node", "ippool", p.Name, "err", err)
		}
	}
}

// wepNames confirms with the API server that the owner's wep names the IP.
func (i *IPAM) wepNames(ctx context.Context, ip datastore.IPInfo) bool {
	w, err := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(ip.Owner.Namespace).Get(ctx, ip.Owner.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	return err != nil || w.Spec.IP == ip.Addr.String() // on errors, assume named
}
