package ipam

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// ENI placement (spec §7.2 "ENI creation"): the candidate subnets of a new
// ENI are the union of the subnets of the top-priority IPPools whose node
// selector matches the node; its security groups come from the node's own
// pool (the node agent's ippool-<node>). The choice is made by pure
// functions over what was read, so tables can test it.

// placement is where a new ENI goes: the subnets it may use (already
// filtered) and exactly one kind of security group.
type placement struct {
	Subnets          []string
	SecurityGroups   []string
	EnterpriseGroups []string
}

// errNoPool: no IPPool selects the node (the caller may fall back to the
// node's existing ENIs).
var errNoPool = errors.New("no IPPool selects the node")

// subnetVerdict is what a Subnet resource says about a subnet's use for a
// new ENI; "" means usable (or unknown: no resource yet, the cloud decides).
func subnetVerdict(sn *cce.Subnet) string {
	switch {
	case sn == nil:
		return ""
	case sn.Spec.Exclusive:
		return "exclusive (reserved for PSTS pods that pick their addresses)"
	case !sn.Status.Enable:
		return "disabled"
	case sn.Status.HasNoMoreIP:
		return "exhausted (hasNoMoreIP)"
	}
	return ""
}

// planPlacement picks the placement of a new ENI for the node from every
// IPPool (any namespace) and the Subnet resources (nil: none for that ID).
//
// A pool matches when its nodeSelector selects the node's labels; the
// node's own pool (IPPoolName in IPPoolNamespace) always matches, as its
// selector is the node's hostname label. Among matching pools those of the
// highest priority give the subnets (their union, in pool-name order);
// exclusive, disabled and exhausted subnets are dropped. The security
// groups come from the node's own pool when it matches, otherwise from the
// first top-priority pool that sets any; exactly one kind must be set.
func planPlacement(k8sNode *corev1.Node, pools []cce.IPPool, subnet func(id string) *cce.Subnet) (placement, error) {
	ownName := cce.IPPoolName(k8sNode.Name)
	matching, top, err := topPools(k8sNode, pools)
	if err != nil {
		return placement{}, err
	}
	var out placement
	var excluded []string
	seen := map[string]bool{}
	for _, p := range matching {
		for _, id := range p.Spec.ENI.Subnets {
			if id == "" || seen[id] {
				continue
			}
			seen[id] = true
			if why := subnetVerdict(subnet(id)); why != "" {
				excluded = append(excluded, id+" "+why)
				continue
			}
			out.Subnets = append(out.Subnets, id)
		}
	}
	names := make([]string, len(matching))
	for k, p := range matching {
		names[k] = p.Namespace + "/" + p.Name
	}
	if len(out.Subnets) == 0 {
		if len(excluded) == 0 {
			return placement{}, fmt.Errorf("no subnet for a new ENI: the top-priority IPPools (priority %d: %s) list none",
				top, strings.Join(names, ", "))
		}
		return placement{}, fmt.Errorf("no subnet qualifies for a new ENI among the top-priority IPPools (priority %d: %s): %s",
			top, strings.Join(names, ", "), strings.Join(excluded, "; "))
	}

	var groupsFrom *cce.IPPool
	for k := range pools {
		if pools[k].Namespace == cce.IPPoolNamespace && pools[k].Name == ownName {
			groupsFrom = &pools[k]
			break
		}
	}
	if groupsFrom == nil {
		for _, p := range matching {
			if len(p.Spec.ENI.SecurityGroups)+len(p.Spec.ENI.EnterpriseSecurityGroups) > 0 {
				groupsFrom = p
				break
			}
		}
	}
	if groupsFrom == nil {
		return placement{}, fmt.Errorf("no security groups for a new ENI: the node has no IPPool %s and no top-priority pool (%s) sets any",
			ownName, strings.Join(names, ", "))
	}
	out.SecurityGroups, out.EnterpriseGroups, err = poolGroups(groupsFrom)
	return out, err
}

// topPools returns the pools that select the node and have the highest
// priority among those, in namespace/name order, and that priority.
func topPools(k8sNode *corev1.Node, pools []cce.IPPool) ([]*cce.IPPool, int32, error) {
	nodeLabels := labels.Set(k8sNode.Labels)
	ownName := cce.IPPoolName(k8sNode.Name)
	var matching []*cce.IPPool
	var bad []string
	for k := range pools {
		p := &pools[k]
		if p.Namespace == cce.IPPoolNamespace && p.Name == ownName {
			matching = append(matching, p)
			continue
		}
		sel, err := labels.Parse(p.Spec.NodeSelector)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s/%s: %v", p.Namespace, p.Name, err))
			continue
		}
		if sel.Matches(nodeLabels) {
			matching = append(matching, p)
		}
	}
	if len(matching) == 0 {
		if len(bad) > 0 {
			return nil, 0, fmt.Errorf("%w (pools with a malformed nodeSelector skipped: %s)", errNoPool, strings.Join(bad, "; "))
		}
		return nil, 0, errNoPool
	}
	top := slices.MaxFunc(matching, func(a, b *cce.IPPool) int { return cmp.Compare(a.Spec.Priority, b.Spec.Priority) }).Spec.Priority
	matching = slices.DeleteFunc(matching, func(p *cce.IPPool) bool { return p.Spec.Priority != top })
	slices.SortFunc(matching, func(a, b *cce.IPPool) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return matching, top, nil
}

// poolGroups returns the pool's security groups, exactly one kind of them.
func poolGroups(p *cce.IPPool) (sgs, esgs []string, err error) {
	sgs, esgs = p.Spec.ENI.SecurityGroups, p.Spec.ENI.EnterpriseSecurityGroups
	switch {
	case len(sgs) > 0 && len(esgs) > 0:
		return nil, nil, fmt.Errorf("IPPool %s/%s sets both securityGroups and enterpriseSecurityGroups: an ENI takes exactly one kind",
			p.Namespace, p.Name)
	case len(sgs) == 0 && len(esgs) == 0:
		return nil, nil, fmt.Errorf("IPPool %s/%s sets neither securityGroups nor enterpriseSecurityGroups: "+
			"an ENI needs exactly one kind", p.Namespace, p.Name)
	}
	return slices.Clone(sgs), slices.Clone(esgs), nil
}

// eniPlacement reads the IPPools (one list from the API server's watch
// cache per creation: creations are rare, and caching every pool would hold
// every ENI's status on every replica) and plans the placement. A node that
// no pool selects (a cluster without the node agent) gets the subnet and
// security groups of one of its existing ENIs.
func (i *IPAM) eniPlacement(ctx context.Context, n *node, k8sNode *corev1.Node) (placement, error) {
	list, err := i.deps.CCE.CceV1alpha1().IPPools(metav1.NamespaceAll).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return placement{}, fmt.Errorf("list IPPools: %w", err)
	}
	pl, err := planPlacement(k8sNode, list.Items, i.subnetCR)
	if !errors.Is(err, errNoPool) {
		return pl, err
	}
	var unusable []string // why each ENI could not be copied, for the error
	for _, e := range i.nodeENIs(n.name) {
		got, gerr := i.deps.Cloud.GetENI(ctx, e.ID)
		if gerr != nil {
			unusable = append(unusable, e.ID+": "+gerr.Error())
			continue
		}
		if why := subnetVerdict(i.subnetCR(got.SubnetID)); why != "" {
			unusable = append(unusable, e.ID+": subnet "+got.SubnetID+" "+why)
			continue
		}
		if len(got.SecurityGroupIDs) > 0 {
			return placement{Subnets: []string{got.SubnetID}, SecurityGroups: got.SecurityGroupIDs}, nil
		}
		if len(got.EnterpriseSecurityGroupIDs) > 0 {
			return placement{Subnets: []string{got.SubnetID}, EnterpriseGroups: got.EnterpriseSecurityGroupIDs}, nil
		}
	}
	if len(unusable) > 0 {
		return placement{}, fmt.Errorf("%w %s, and none of its ENIs can be copied for a subnet and security groups (%s)",
			err, n.name, strings.Join(unusable, "; "))
	}
	return placement{}, fmt.Errorf("%w %s, and it has no usable ENI to copy a subnet and security groups from", err, n.name)
}

// subnetCR is the Subnet resource of id from the cache, nil without one.
func (i *IPAM) subnetCR(id string) *cce.Subnet {
	sn, err := i.subnets.Subnets(cce.SubnetNamespace).Get(id)
	if err != nil {
		return nil
	}
	return sn
}
