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
// and gets an ordinary IP (in the reserved subnet, if there is one).
func (i *IPAM) takeFixedIP(ctx context.Context, n *node, owner datastore.Owner) (info datastore.IPInfo, subnet string, ok bool, err error) {
	wep, err := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(owner.Namespace).Get(ctx, owner.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return datastore.IPInfo{}, "", false, nil
	}
	if err != nil {
		return datastore.IPInfo{}, "", false, fmt.Errorf("get WorkloadEndpoint: %w", err)
	}
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
	// address that is still attached elsewhere in the subnet).
	if wep.Spec.ENIID != "" {
		if old, ok := i.node(wep.Spec.Node); ok {
			if _, err := i.store.Hold(old.name, []netip.Addr{addr}, datastore.HoldReleasing); err != nil && !errors.Is(err, datastore.ErrNodeNotFound) {
				i.log.Warn("could not hold the fixed IP on its old node", "ip", addr, "node", old.name, "err", err)
			}
		}
		err := i.deps.Cloud.DeletePrivateIP(ctx, wep.Spec.ENIID, addr.String())
		if err != nil && !errors.Is(err, cloud.ErrPrivateIPNotFound) && !errors.Is(err, cloud.ErrENINotFound) {
			return datastore.IPInfo{}, subnet, false, fmt.Errorf("free fixed IP %s on %s: %w", addr, wep.Spec.ENIID, err)
		}
		if old, ok := i.node(wep.Spec.Node); ok {
			_, _ = i.store.RemoveIP(old.name, addr)
		}
	}
	for _, e := range i.nodeENIs(n.name) {
		if e.SubnetID != subnet {
			continue
		}
		added, err := i.deps.Cloud.BatchAddPrivateIPs(ctx, e.ID, cloud.BatchAddRequest{IPs: []string{addr.String()}})
		if err != nil {
			i.log.Info("could not re-add a fixed IP on this ENI", "ip", addr, "eni", e.ID, "err", err)
			if errors.Is(err, cloud.ErrPrivateIPInUse) {
				break // taken by someone else: no ENI will get it
			}
			continue
		}
		if len(added) != 1 || added[0] != addr.String() {
			return datastore.IPInfo{}, subnet, false, fmt.Errorf("cloud added %v, asked for %s", added, addr)
		}
		info, err := i.store.AddAssignedIP(n.name, e.ID, addr, owner, i.deps.Clock.Now())
		if err != nil {
			// Recorded nowhere: give it back so it cannot leak.
			_ = i.deps.Cloud.DeletePrivateIP(ctx, e.ID, addr.String())
			return datastore.IPInfo{}, subnet, false, err
		}
		return info, subnet, true, nil
	}
	i.log.Warn("fixed IP could not be re-added; the pod gets a new IP in its subnet", "pod", owner.Pod().String(), "ip", addr)
	return datastore.IPInfo{}, subnet, false, nil
}
