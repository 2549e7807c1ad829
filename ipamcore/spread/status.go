package spread

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/psts"
)

// statusInputs is what a PSTS's status is computed from, read from the
// informer caches by the reconcile.
type statusInputs struct {
	// Subnets are the Subnet resources of the PSTS's subnets, by subnet ID;
	// a missing ID has no Subnet resource.
	Subnets map[string]*cce.Subnet
	// WEPs are the WorkloadEndpoints of the PSTS's namespace whose
	// subnetTopologyReference names it.
	WEPs []*cce.WorkloadEndpoint
	// Pods are the names of the pods of the PSTS's namespace annotated with
	// its name.
	Pods []string
}

// Messages of unavailable subnets. The allocator (ipamcore/ipam) refuses a
// subnet for the same reasons, so the status says why a pod got no address
// from it.
const (
	msgNoSubnet    = "no Subnet resource yet (the Subnet controller creates it from the cloud)"
	msgDisabled    = "the subnet is disabled"
	msgNoMoreIP    = "the subnet has no more IP"
	msgBadSubnetID = "not a valid subnet ID"
)

// computeStatus is the status of p from in. It also returns the problems of
// the objects it read that the status cannot show in a subnet's message
// (weps with an invalid address), sorted; the reconcile reports them in an
// event.
//
// A subnet of the spec is available when its Subnet resource exists, is
// enabled, is not declared exhausted and can serve the subnet's strategy
// (exclusive exactly when the strategy picks addresses itself, a valid CIDR,
// valid address ranges); otherwise it is unavailable, with the reason in
// its message. Either way podCount counts the PSTS's weps of the subnet that
// are not podDeleted, and ipAllocations (when the spec asks for it) maps
// their valid addresses to their pods.
func computeStatus(p *cce.PodSubnetTopologySpread, in statusInputs) (cce.PodSubnetTopologySpreadStatus, []string) {
	st := cce.PodSubnetTopologySpreadStatus{Name: p.Name}
	var problems []string

	live := map[string][]*cce.WorkloadEndpoint{} // subnet ID → weps not podDeleted
	withIP := map[string]bool{}                  // pod name → it has a live wep with an address
	for _, w := range in.WEPs {
		if w.Spec.Phase == cce.WorkloadEndpointPhasePodDeleted {
			continue
		}
		live[w.Spec.SubnetID] = append(live[w.Spec.SubnetID], w)
		if w.Spec.IP != "" || w.Spec.IPv6 != "" {
			withIP[w.Name] = true
		}
		if _, listed := p.Spec.Subnets[w.Spec.SubnetID]; !listed {
			problems = append(problems, fmt.Sprintf("WorkloadEndpoint %s has an address of subnet %q, which the spec does not list",
				w.Name, w.Spec.SubnetID))
		}
	}

	for _, id := range sortedKeys(p.Spec.Subnets) {
		s, msg := subnetStatus(p, id, in.Subnets[id])
		weps := live[id]
		s.PodCount = int32(len(weps))
		var bad []string
		s.IPAllocations, bad = ipAllocations(weps, p.Spec.EnableIPAllocationStatus)
		problems = append(problems, bad...)
		if msg == "" {
			st.AvailableSubnets = setSubnet(st.AvailableSubnets, id, s)
			continue
		}
		s.Message = msg
		st.UnavailableSubnets = setSubnet(st.UnavailableSubnets, id, s)
	}
	st.AvailableSubnetsNum = int32(len(st.AvailableSubnets))
	st.UnavailableSubnetsNum = int32(len(st.UnavailableSubnets))

	pods := slices.Clone(in.Pods)
	slices.Sort(pods)
	pods = slices.Compact(pods)
	st.PodMatchedCount = int32(len(pods))
	for _, pod := range pods {
		if withIP[pod] {
			st.PodAffectedCount++
		}
	}
	slices.Sort(problems)
	return st, slices.Compact(problems)
}

// subnetStatus is the copy of subnet id's resource sn (nil: none) and, when
// p's pods cannot get addresses from it, why.
func subnetStatus(p *cce.PodSubnetTopologySpread, id string, sn *cce.Subnet) (cce.SubnetPodStatus, string) {
	s := cce.SubnetPodStatus{ID: id}
	if errs := validation.IsDNS1123Subdomain(id); len(errs) > 0 {
		return s, fmt.Sprintf("%q is %s: %s", id, msgBadSubnetID, strings.Join(errs, "; "))
	}
	if sn == nil {
		return s, msgNoSubnet
	}
	s.AvailableIPNum = sn.Status.AvailableIPNum
	s.Enable = sn.Status.Enable
	s.HasNoMoreIP = sn.Status.HasNoMoreIP
	if sn.Spec.ID != "" {
		s.ID = sn.Spec.ID
	}
	s.Name = sn.Spec.Name
	s.AvailabilityZone = sn.Spec.AvailabilityZone
	s.CIDR = sn.Spec.CIDR
	switch {
	case !sn.Status.Enable:
		return s, msgDisabled
	case sn.Status.HasNoMoreIP:
		if sn.Status.Reason != "" {
			return s, msgNoMoreIP + ": " + sn.Status.Reason
		}
		return s, msgNoMoreIP
	}
	strategy := psts.Resolve(p, id)
	if !psts.Known(strategy.Type) {
		return s, fmt.Sprintf("unknown allocation type %q (Elastic, Fixed, Manual or Custom)", strategy.Type)
	}
	exclusive := psts.NeedsExclusive(strategy.Type)
	switch {
	case exclusive && !sn.Spec.Exclusive:
		return s, fmt.Sprintf("strategy %s needs an exclusive subnet; the Subnet resource is not exclusive", strategy.Type)
	case !exclusive && sn.Spec.Exclusive:
		return s, fmt.Sprintf("the subnet is exclusive; strategy %s cannot allocate from it", strategy.Type)
	}
	cidr, err := netip.ParsePrefix(sn.Spec.CIDR)
	if err != nil {
		return s, fmt.Sprintf("the Subnet resource's CIDR %q is not valid", sn.Spec.CIDR)
	}
	if _, err := psts.AllowedRanges(cidr.Masked(), p.Spec.Subnets[id], strategy.Type); err != nil {
		return s, "address ranges: " + err.Error()
	}
	return s, ""
}

// ipAllocations maps the valid addresses of weps to their pods (nil when
// not enabled or none), and lists the weps whose address is not valid or
// taken twice. Of two weps with one address, the first by name is shown.
func ipAllocations(weps []*cce.WorkloadEndpoint, enabled bool) (map[string]string, []string) {
	if !enabled {
		return nil, nil
	}
	weps = slices.Clone(weps)
	slices.SortFunc(weps, func(a, b *cce.WorkloadEndpoint) int { return strings.Compare(a.Name, b.Name) })
	var (
		out  map[string]string
		bad  []string
		seen = map[string]string{}
	)
	for _, w := range weps {
		for _, ip := range []string{w.Spec.IP, w.Spec.IPv6} {
			if ip == "" {
				continue
			}
			a, err := netip.ParseAddr(ip)
			if err != nil {
				bad = append(bad, fmt.Sprintf("WorkloadEndpoint %s has an invalid address %q", w.Name, ip))
				continue
			}
			key := a.String()
			if other, dup := seen[key]; dup {
				bad = append(bad, fmt.Sprintf("WorkloadEndpoints %s and %s both name address %s", other, w.Name, key))
				continue
			}
			seen[key] = w.Name
			if out == nil {
				out = map[string]string{}
			}
			out[key] = w.Name
		}
	}
	return out, bad
}

func setSubnet(m map[string]cce.SubnetPodStatus, id string, s cce.SubnetPodStatus) map[string]cce.SubnetPodStatus {
	if m == nil {
		m = map[string]cce.SubnetPodStatus{}
	}
	m[id] = s
	return m
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
