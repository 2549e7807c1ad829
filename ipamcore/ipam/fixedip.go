package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/cloud"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
)

var _ FixedIPMover = (*IPAM)(nil)

// isFixedIPPod reports whether the pod is a StatefulSet pod whose IP is
// pinned to its name (cce.io/sts-enable-fix-ip: "True").
func isFixedIPPod(pod *corev1.Pod) bool {
	if pod.Annotations[cce.AnnotationStsEnableFixIP] != cce.EnableFixIPTrue {
		return false
	}
	for _, ref := range pod.OwnerReferences {
		if ref.Kind == "StatefulSet" && ref.Controller != nil && *ref.Controller {
			return true
		}
	}
	return false
}

// takeFixedIP gives a fixed-IP StatefulSet pod the address its wep reserves,
// on this node: from the datastore if the address is already here, else by
// deleting it from its old ENI and adding the same address to an ENI of this
// node in the same subnet. ok=false means the pod has no usable reservation
// and gets an ordinary IP (in the reserved subnet, if there is one). wep is
// the pod's wep as read (nil: none), which the commit replaces.
func (i *IPAM) takeFixedIP(ctx context.Context, n *node, owner datastore.Owner) (info datastore.IPInfo, subnet string, ok bool,
	wep *cce.WorkloadEndpoint, err error) {
	wep, err = i.deps.CCE.CceV1alpha1().WorkloadEndpoints(owner.Namespace).Get(ctx, owner.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return datastore.IPInfo{}, "", false, nil, nil
	}
	if err != nil {
		return datastore.IPInfo{}, "", false, nil, fmt.Errorf("get WorkloadEndpoint: %w", err)
	}
	info, subnet, ok, err = i.takeReservedIP(ctx, n, owner, wep)
	return info, subnet, ok, wep, err
}

// takeReservedIP is takeFixedIP once the pod's wep is read.
func (i *IPAM) takeReservedIP(ctx context.Context, n *node, owner datastore.Owner,
	wep *cce.WorkloadEndpoint) (info datastore.IPInfo, subnet string, ok bool, err error) {
	addr, perr := netip.ParseAddr(wep.Spec.IP)
	if perr != nil || !wep.IsFixedStatefulSet() {
		return datastore.IPInfo{}, "", false, nil
	}
	subnet = wep.Spec.SubnetID

	// Already on this node (same node restart, or a retry after a move).
	if cur, err := i.store.LookupIP(addr); err == nil && cur.Node == n.name {
		switch {
		case cur.State == datastore.StateAssigned && cur.Owner.Pod() == owner.Pod():
			if cur.Owner.ContainerID == owner.ContainerID {
				return cur, subnet, true, nil
			}
			if _, err := i.store.Release(n.name, addr, cur.Owner.ContainerID, i.deps.Clock.Now()); err != nil {
				return datastore.IPInfo{}, subnet, false, err
			}
		case cur.State == datastore.StateAssigned:
			return datastore.IPInfo{}, subnet, false, fmt.Errorf("fixed IP %s is assigned to %s", addr, cur.Owner)
		}
		info, err := i.store.AllocateSpecific(n.name, addr, owner)
		return info, subnet, err == nil, err
	}

	// Move: free the address on its old ENI first (the cloud refuses an
	// address that is still attached elsewhere in the subnet). Only the old
	// node's owner may do that (I1): it must forget the address in the same
	// step, or it would give it back to the pod, or to a stranger, while the
	// cloud has it here.
	if wep.Spec.ENIID != "" && wep.Spec.Node != "" && wep.Spec.Node != n.name {
		if err := i.freeOnOldNode(ctx, wep.Spec.Node, owner, addr, wep.Spec.ENIID); err != nil {
			return datastore.IPInfo{}, subnet, false, fmt.Errorf("free fixed IP %s on its old node %s: %w", addr, wep.Spec.Node, err)
		}
	}
	for _, e := range i.nodeENIs(n.name) {
		if e.SubnetID != subnet {
			continue
		}
		added, err := i.deps.Cloud.BatchAddPrivateIPs(i.forNode(ctx, n.name), e.ID, cloud.BatchAddRequest{IPs: []string{addr.String()}})
		if err != nil {
			i.log.Info("could not re-add a fixed IP on this ENI", "ip", addr, "eni", e.ID, "err", err)
			if errors.Is(err, cloud.ErrPrivateIPInUse) {
				break // taken by someone else: no ENI will get it
			}
			if cloud.ClassOf(err).Retryable() || errors.Is(err, cloud.ErrFenced) {
				// Throttling, a 5xx, a broken connection, a hand-over: the
				// address is still the pod's to take. Fail this ADD (kubelet
				// retries) rather than give the pod a new IP for good.
				return datastore.IPInfo{}, subnet, false, fmt.Errorf("re-add fixed IP %s on %s (retry): %w", addr, e.ID, err)
			}
			continue
		}
		if len(added) != 1 || added[0] != addr.String() {
			return datastore.IPInfo{}, subnet, false, fmt.Errorf("cloud added %v, asked for %s", added, addr)
		}
		info, err := i.store.AddAssignedIP(n.name, e.ID, addr, owner, i.deps.Clock.Now())
		if err != nil {
			// Recorded nowhere: give it back so it cannot leak.
			_ = i.deps.Cloud.DeletePrivateIP(i.forNode(ctx, n.name), e.ID, addr.String())
			return datastore.IPInfo{}, subnet, false, err
		}
		return info, subnet, true, nil
	}
	i.log.Warn("fixed IP could not be re-added; the pod gets a new IP in its subnet", "pod", owner.Pod().String(), "ip", addr)
	return datastore.IPInfo{}, subnet, false, nil
}

// FixedIPMover frees a fixed IP on the node it leaves, through that node's
// owner (the shard router forwards the call; see Deps.FixedIPMover).
type FixedIPMover interface {
	FreeMovedIP(ctx context.Context, node, namespace, name string, addr netip.Addr, eniID string) error
}

// freeOnOldNode frees addr on the old node: here if this replica holds the
// node (serves it, or holds its partition: a deleted node's, which nobody
// serves), else through the mover, which asks the replica that does.
func (i *IPAM) freeOnOldNode(ctx context.Context, oldNode string, owner datastore.Owner, addr netip.Addr, eniID string) error {
	if i.deps.FixedIPMover == nil || i.freesHere(oldNode) {
		return i.FreeMovedIP(ctx, oldNode, owner.Namespace, owner.Name, addr, eniID)
	}
	return i.deps.FixedIPMover.FreeMovedIP(ctx, oldNode, owner.Namespace, owner.Name, addr, eniID)
}

// freesHere: this replica serves the node, or the fence says its partition
// is held here (without a fence, only a served node is).
func (i *IPAM) freesHere(name string) bool {
	if _, ok := i.node(name); ok {
		return true
	}
	return i.deps.Fence != nil && i.holdsNode(name)
}

// freeOnDeletedNode frees addr from a deleted node's ENI. Nobody serves the
// node any more, so there is no pool to take it out of; the cloud call is
// made under the node's permission (forNode), which only the holder of its
// partition has (I1). A node that still exists is not deleted but not
// served here yet: retryable.
func (i *IPAM) freeOnDeletedNode(ctx context.Context, node string, addr netip.Addr, eniID string) error {
	if !i.nodeGone(ctx, node) {
		return fmt.Errorf("%w: %s (the fixed IP's old node)", ErrNodeNotServed, node)
	}
	err := i.deps.Cloud.DeletePrivateIP(i.forNode(ctx, node), eniID, addr.String())
	if err != nil && !errors.Is(err, cloud.ErrPrivateIPNotFound) && !errors.Is(err, cloud.ErrENINotFound) {
		return fmt.Errorf("delete fixed IP %s from %s of the deleted node %s: %w", addr, eniID, node, err)
	}
	i.log.Info("fixed IP left a deleted node's ENI for the pod's new node", "node", node, "ip", addr, "eni", eniID)
	return nil
}

// FreeMovedIP runs on the owner of node: the fixed IP of pod namespace/name
// leaves node's ENI eniID for the pod's new node. The address is taken out
// of the pool (it must not be assigned to another pod), deleted from the
// cloud under node's fence, and forgotten. Safe to repeat: an address
// already gone from the datastore or the cloud is done.
func (i *IPAM) FreeMovedIP(ctx context.Context, node, namespace, name string, addr netip.Addr, eniID string) error {
	n, done, ok := i.acquire(node)
	if !ok {
		return i.freeOnDeletedNode(ctx, node, addr, eniID)
	}
	defer done()
	until, err := i.mayActUntil(n.name)
	if err != nil {
		return err
	}
	if !until.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, until)
		defer cancel()
	}
	pod := datastore.PodKey{
		Namespace: namespace,
		Name:      name,
	}
	if err := i.dropAddress(ctx, n, pod, addr, eniID); err != nil {
		return err
	}
	i.log.Info("fixed IP left the node for the pod's new node", "node", n.name, "ip", addr, "eni", eniID,
		"pod", pod.String())
	return nil
}

// dropAddress takes an address of pod out of a served node's pool (it must
// not be assigned to another pod), deletes it from the cloud under the
// node's fence, and forgets it. Safe to repeat: an address already gone from
// the datastore or the cloud is done. On a cloud failure the address stays
// held, unsettled, for the ENI sync to settle.
func (i *IPAM) dropAddress(ctx context.Context, n *node, pod datastore.PodKey, addr netip.Addr, eniID string) error {
	held := false
	info, err := i.store.Surrender(n.name, addr, pod)
	switch {
	case err == nil:
		held = true
	case errors.Is(err, datastore.ErrUnknownIP):
		// Not recorded here (a rebuild after the DEL): the cloud may still
		// have it on the ENI.
	default:
		return err
	}
	err = i.deps.Cloud.DeletePrivateIP(i.forNode(ctx, n.name), eniID, addr.String())
	if err != nil && !errors.Is(err, cloud.ErrPrivateIPNotFound) && !errors.Is(err, cloud.ErrENINotFound) {
		switch {
		case held && info.CrossSubnet:
			// It can never be idle, so a read cannot settle it back into
			// the pool: forget it. The ENI sync finds it on the ENI and
			// gives it back to the wep that names it, or deletes it.
			_, _ = i.store.RemoveIP(n.name, addr)
		case held:
			_ = i.store.Unsettle(n.name, addr)
		}
		return fmt.Errorf("delete %s from %s: %w", addr, eniID, err)
	}
	if held {
		if _, err := i.store.RemoveIP(n.name, addr); err != nil {
			i.log.Error("could not forget a deleted address", "node", n.name, "ip", addr, "err", err)
		}
	}
	return nil
}
