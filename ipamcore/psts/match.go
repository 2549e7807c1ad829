package psts

import (
	"cmp"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// Match returns the PSTS a new pod falls under: among those of the pod's
// namespace whose selector matches the pod's labels, the highest priority;
// ties go to the oldest, then to the first name, so that every replica's
// webhook picks the same one. A PSTS without a selector, or with an empty or
// invalid one, matches nothing: a PSTS must say which pods it takes (the
// reference's webhook is said to let a nil selector take every pod of the
// namespace; a PSTS that silently moves every pod of a namespace onto its
// subnets is not a default we want). nil when none matches.
func Match(pod *corev1.Pod, list []*cce.PodSubnetTopologySpread) *cce.PodSubnetTopologySpread {
	var found []*cce.PodSubnetTopologySpread
	for _, p := range list {
		if p.Namespace != pod.Namespace || p.Spec.Selector == nil || p.DeletionTimestamp != nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil || sel.Empty() {
			continue
		}
		if sel.Matches(labels.Set(pod.Labels)) {
			found = append(found, p)
		}
	}
	if len(found) == 0 {
		return nil
	}
	slices.SortFunc(found, func(a, b *cce.PodSubnetTopologySpread) int {
		if c := cmp.Compare(b.Spec.Priority, a.Spec.Priority); c != 0 {
			return c
		}
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return found[0]
}
