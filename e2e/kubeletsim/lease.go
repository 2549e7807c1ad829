package kubeletsim

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// nodeLeaseNamespace holds the kubelets' heartbeat Leases.
const nodeLeaseNamespace = "kube-node-lease"

// leaseLoop renews every simulated node's Lease in kube-node-lease each
// period, as kubelet's heartbeat does, so that kube-controller-manager's node
// lifecycle controller keeps the nodes Ready (and does not taint and evict
// their pods). It returns when ctx ends.
func (s *Simulator) leaseLoop(ctx context.Context, period time.Duration) {
	leases := map[string]*coordinationv1.Lease{} // owned by this loop
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		s.mu.Lock()
		names := make([]string, 0, len(s.place.byName))
		for n := range s.place.byName {
			names = append(names, n)
		}
		s.mu.Unlock()
		for _, n := range names {
			if ctx.Err() != nil {
				return
			}
			if err := s.renewLease(ctx, leases, n, period); err != nil && ctx.Err() == nil {
				s.log.Debug("node lease renewal failed", "node", n, "err", err)
				delete(leases, n)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Simulator) renewLease(ctx context.Context, leases map[string]*coordinationv1.Lease, node string, period time.Duration) error {
	client := s.deps.Kube.CoordinationV1().Leases(nodeLeaseNamespace)
	now := metav1.NewMicroTime(time.Now())
	l, ok := leases[node]
	if !ok {
		got, err := client.Get(ctx, node, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			n, err := s.deps.Kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			got, err = client.Create(ctx, newNodeLease(n, period, now), metav1.CreateOptions{})
			if err != nil {
				return err
			}
			leases[node] = got
			return nil
		case err != nil:
			return err
		}
		l = got
	}
	l = l.DeepCopy()
	l.Spec.RenewTime = &now
	got, err := client.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	leases[node] = got
	return nil
}

// newNodeLease is the Lease kubelet creates for its node: held by the node,
// four periods long, owned by the Node so that it goes with it.
func newNodeLease(n *corev1.Node, period time.Duration, now metav1.MicroTime) *coordinationv1.Lease {
	holder := n.Name
	secs := int32(max(4*period/time.Second, 1))
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: n.Name, Namespace: nodeLeaseNamespace,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1",
				Kind:       "Node",
				Name:       n.Name,
				UID:        n.UID,
			}},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &holder,
			LeaseDurationSeconds: &secs,
			RenewTime:            &now,
		},
	}
}
