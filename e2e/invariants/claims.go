package invariants

import (
	"net/netip"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// Check (g): I7, one holder per address of an exclusive subnet, and PSTS
// pods inside their PSTS's subnets (Config.Claims).

// subnetCIDR is a Subnet resource's ID and CIDR.
type subnetCIDR struct {
	id   string
	cidr netip.Prefix
}

// claimView is the part of the snapshot (g) reads, keyed.
type claimView struct {
	cidrs     map[string]netip.Prefix // subnet ID → CIDR, every Subnet resource
	exclusive []subnetCIDR            // the exclusive ones
	claims    map[netip.Addr]*cce.IPClaim
	spreads   map[string]*cce.PodSubnetTopologySpread // namespace/name
}

func newClaimView(s snapshot) claimView {
	v := claimView{
		cidrs:   map[string]netip.Prefix{},
		claims:  map[netip.Addr]*cce.IPClaim{},
		spreads: map[string]*cce.PodSubnetTopologySpread{},
	}
	for i := range s.subnets {
		sn := &s.subnets[i]
		p, err := netip.ParsePrefix(sn.Spec.CIDR)
		if err != nil {
			continue
		}
		id := sn.Spec.ID
		if id == "" {
			id = sn.Name
		}
		v.cidrs[id] = p.Masked()
		if sn.Spec.Exclusive {
			v.exclusive = append(v.exclusive, subnetCIDR{id: id, cidr: p.Masked()})
		}
	}
	sort.Slice(v.exclusive, func(i, j int) bool { return v.exclusive[i].id < v.exclusive[j].id })
	for i := range s.claims {
		c := &s.claims[i]
		// The name is the address (cce.ClaimName); a claim named otherwise
		// is for no address.
		if a, ok := cce.AddrOfClaimName(c.Name); ok {
			v.claims[a] = c
		}
	}
	for i := range s.spreads {
		p := &s.spreads[i]
		v.spreads[key(p.Namespace, p.Name)] = p
	}
	return v
}

// exclusiveOf returns the exclusive subnet holding ip, if any.
func (v claimView) exclusiveOf(ip string) (netip.Addr, string, bool) {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return netip.Addr{}, "", false
	}
	a = a.Unmap()
	for _, e := range v.exclusive {
		if e.cidr.Contains(a) {
			return a, e.id, true
		}
	}
	return a, "", false
}

// holder describes who holds a's claim, for details.
func (v claimView) holder(a netip.Addr) (*cce.IPClaimHolder, string) {
	c := v.claims[a]
	switch {
	case c == nil:
		return nil, "no IPClaim"
	case c.Spec.Holder == nil || c.Spec.Holder.Name == "":
		return nil, "its IPClaim is free"
	default:
		return c.Spec.Holder, "its IPClaim is held by " + key(c.Spec.Holder.Namespace, c.Spec.Holder.Name)
	}
}

// checkClaims applies (g).
func (r *rules) checkClaims(s snapshot, x indexed) Violations {
	v := newClaimView(s)
	seen := map[string]bool{}
	var out Violations
	out = append(out, r.sharedExclusive(v, x)...)
	out = append(out, r.unclaimedWEPs(v, x, s.now, seen)...)
	out = append(out, r.unclaimedIPs(v, x, s.now, seen)...)
	out = append(out, r.outsidePSTS(v, x)...)
	for id := range r.claimSince {
		if !seen[id] {
			delete(r.claimSince, id)
		}
	}
	return out
}

// pastGrace records id as seen and reports whether it has been seen for
// ClaimGrace.
func (r *rules) pastGrace(id string, now time.Time, seen map[string]bool) (time.Duration, bool) {
	seen[id] = true
	since, ok := r.claimSince[id]
	if !ok {
		since = now
		r.claimSince[id] = since
	}
	return now.Sub(since), now.Sub(since) >= r.cfg.ClaimGrace
}

// sharedExclusive: no two weps, whatever their namespace and node, name one
// address of an exclusive subnet. Groups whose weps are all on served nodes
// are (e)'s when it runs.
func (r *rules) sharedExclusive(v claimView, x indexed) Violations {
	byAddr := map[netip.Addr][]string{}
	for k, w := range x.weps {
		if a, _, ok := v.exclusiveOf(w.Spec.IP); ok {
			byAddr[a] = append(byAddr[a], k)
		}
	}
	var out Violations
	for a, ks := range byAddr {
		if len(ks) < 2 {
			continue
		}
		served := true
		for _, k := range ks {
			_, ok := x.nodes[x.weps[k].Spec.Node]
			served = served && ok
		}
		if served && r.cfg.WEPAddresses {
			continue
		}
		sort.Strings(ks)
		out = append(out, Violation{Kind: KindWEPSharedIP, IP: a.String(), WEP: strings.Join(ks, ","),
			Detail: "WorkloadEndpoints name the same address of an exclusive subnet"})
	}
	return out
}

// unclaimedWEPs: a wep of the checked namespaces naming an address of an
// exclusive subnet has its claim, held by the wep's pod.
func (r *rules) unclaimedWEPs(v claimView, x indexed, now time.Time, seen map[string]bool) Violations {
	var out Violations
	for k, w := range x.weps {
		if !r.inNamespace(w.Namespace) {
			continue
		}
		a, subnet, ok := v.exclusiveOf(w.Spec.IP)
		if !ok {
			continue
		}
		h, why := v.holder(a)
		if h != nil && h.Namespace == w.Namespace && h.Name == w.Name {
			continue
		}
		held, past := r.pastGrace("wep/"+k+"/"+string(w.UID)+"/"+a.String(), now, seen)
		if !past {
			continue
		}
		out = append(out, Violation{Kind: KindUnclaimedWEP, WEP: k, Node: w.Spec.Node, IP: a.String(),
			Detail: "WorkloadEndpoint names an address of the exclusive subnet " + subnet + " but " + why + " for " +
				held.Round(time.Millisecond).String()})
	}
	return out
}

// unclaimedIPs: an address of an exclusive subnet on an in-use ENI of a
// served node has a held claim.
func (r *rules) unclaimedIPs(v claimView, x indexed, now time.Time, seen map[string]bool) Violations {
	var out Violations
	for name, n := range x.nodes {
		for ip := range x.cloudIPs[instanceOf(n)] {
			a, subnet, ok := v.exclusiveOf(ip)
			if !ok {
				continue
			}
			h, why := v.holder(a)
			if h != nil {
				continue
			}
			held, past := r.pastGrace("ip/"+instanceOf(n)+"/"+a.String(), now, seen)
			if !past {
				continue
			}
			out = append(out, Violation{Kind: KindUnclaimedIP, Node: name, IP: a.String(),
				Detail: "address of the exclusive subnet " + subnet + " on an ENI of instance " + instanceOf(n) + ", but " +
					why + " for " + held.Round(time.Millisecond).String()})
		}
	}
	return out
}

// outsidePSTS: a Running PSTS pod on a served node has its address in one
// of the subnets its PSTS lists. A pod whose PSTS is gone is not judged.
func (r *rules) outsidePSTS(v claimView, x indexed) Violations {
	var out Violations
	for k, p := range x.pods {
		ref := p.Annotations[cce.AnnotationPodSubnetTopologySpread]
		if ref == "" || p.Status.Phase != corev1.PodRunning || p.Spec.HostNetwork || p.DeletionTimestamp != nil {
			continue
		}
		if _, ok := x.nodes[p.Spec.NodeName]; !ok {
			continue
		}
		ps := v.spreads[key(p.Namespace, ref)]
		if ps == nil {
			continue
		}
		for _, ip := range podIPs(p) {
			a, err := netip.ParseAddr(ip)
			if err != nil || !a.Unmap().Is4() {
				continue // BCE gives no IPv6 cross-subnet addresses
			}
			in := false
			var ids []string
			for id := range ps.Spec.Subnets {
				ids = append(ids, id)
				if c, ok := v.cidrs[id]; ok && c.Contains(a.Unmap()) {
					in = true
				}
			}
			if in {
				continue
			}
			sort.Strings(ids)
			out = append(out, Violation{Kind: KindOutsidePSTS, Pods: []string{k}, Node: p.Spec.NodeName, IP: canon(ip),
				Detail: "the pod's PodSubnetTopologySpread " + ref + " lists the subnets " + strings.Join(ids, ",") +
					"; the address is in none of them"})
		}
	}
	return out
}
