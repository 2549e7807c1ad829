package psts

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8snet "k8s.io/utils/net"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

func TestResolve_GlobalOverridesAndDefaults(t *testing.T) {
	p := &cce.PodSubnetTopologySpread{Spec: cce.PodSubnetTopologySpreadSpec{Subnets: map[string]cce.SubnetAllocation{
		"sbn-a": {IPAllocationStrategy: cce.IPAllocationStrategy{Type: cce.IPAllocTypeCustom, EnableReuseIPAddress: true}},
		"sbn-b": {},
	}}}
	if s := Resolve(p, "sbn-b"); s.Type != cce.IPAllocTypeElastic || s.ReleaseStrategy != cce.ReleaseStrategyTTL || s.TTL != nil {
		t.Errorf("empty entry resolved to %+v, want Elastic/TTL without a TTL", s)
	}
	s := Resolve(p, "sbn-a")
	if s.Type != cce.IPAllocTypeCustom || TTL(s) != cce.DefaultReuseIPTTL || !KeepsAddress(s) {
		t.Errorf("custom reuse resolved to %+v (TTL %s), want Custom with the 7-day default", s, TTL(s))
	}
	if p.Spec.Subnets["sbn-a"].TTL != nil {
		t.Error("Resolve modified the PSTS")
	}
	p.Spec.Strategy = &cce.IPAllocationStrategy{Type: cce.IPAllocTypeFixed, ReleaseStrategy: cce.ReleaseStrategyNever}
	for _, id := range []string{"sbn-a", "sbn-b", "sbn-unknown"} {
		if s := Resolve(p, id); s.Type != cce.IPAllocTypeFixed || s.ReleaseStrategy != cce.ReleaseStrategyNever || !NeedsExclusive(s.Type) {
			t.Errorf("%s with a global strategy resolved to %+v", id, s)
		}
	}
	p.Spec.Strategy.TTL = &metav1.Duration{Duration: time.Hour}
	got := Resolve(p, "sbn-a")
	got.TTL.Duration = 0
	if p.Spec.Strategy.TTL.Duration != time.Hour {
		t.Error("the resolved TTL aliases the PSTS's")
	}
}

func TestAllowedRanges(t *testing.T) {
	cidr := netip.MustParsePrefix("10.1.0.0/24")
	tests := []struct {
		name    string
		alloc   cce.SubnetAllocation
		typ     cce.IPAllocType
		want    string // ranges joined by ","
		wantErr string
	}{
		{name: "elastic has no ranges", typ: cce.IPAllocTypeElastic, want: ""},
		{name: "fixed without ranges takes the subnet", typ: cce.IPAllocTypeFixed, want: "10.1.0.0-10.1.0.255"},
		{name: "manual addresses and ranges, sorted", typ: cce.IPAllocTypeManual,
			alloc: cce.SubnetAllocation{IPv4: []string{"10.1.0.200"}, IPv4Range: []string{"10.1.0.16/28"}},
			want:  "10.1.0.16-10.1.0.31,10.1.0.200"},
		{name: "custom ranges of the family", typ: cce.IPAllocTypeCustom,
			alloc: cce.SubnetAllocation{Custom: []cce.CustomAllocation{
				{Family: k8snet.IPv4, CustomIPRange: []cce.CustomIPRange{{Start: "10.1.0.10", End: "10.1.0.12"}}},
				{Family: k8snet.IPv6, CustomIPRange: []cce.CustomIPRange{{Start: "fd00::1", End: "fd00::2"}}},
			}},
			want: "10.1.0.10-10.1.0.12"},
		{name: "outside the subnet", typ: cce.IPAllocTypeFixed, alloc: cce.SubnetAllocation{IPv4: []string{"10.2.0.1"}},
			wantErr: "not inside the subnet"},
		{name: "overlap", typ: cce.IPAllocTypeManual,
			alloc:   cce.SubnetAllocation{IPv4: []string{"10.1.0.17"}, IPv4Range: []string{"10.1.0.16/28"}},
			wantErr: "overlap"},
		{name: "garbage address", typ: cce.IPAllocTypeManual, alloc: cce.SubnetAllocation{IPv4: []string{"ten"}},
			wantErr: "not an IPv4 address"},
		{name: "reversed custom range", typ: cce.IPAllocTypeCustom,
			alloc: cce.SubnetAllocation{Custom: []cce.CustomAllocation{
				{Family: k8snet.IPv4, CustomIPRange: []cce.CustomIPRange{{Start: "10.1.0.12", End: "10.1.0.10"}}}}},
			wantErr: "ends before it starts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs, err := AllowedRanges(cidr, tt.alloc, tt.typ)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range rs {
				got = append(got, r.String())
			}
			if strings.Join(got, ",") != tt.want {
				t.Errorf("ranges = %v, want %s", got, tt.want)
			}
		})
	}
}

func TestUsable_SkipsReservedAddresses(t *testing.T) {
	cidr := netip.MustParsePrefix("10.1.0.0/29")
	var got []string
	for a := cidr.Addr(); cidr.Contains(a); a = a.Next() {
		if Usable(cidr, a, DefaultAvailableIndex) {
			got = append(got, a.String())
		}
	}
	if want := "10.1.0.2,10.1.0.3,10.1.0.4,10.1.0.5,10.1.0.6"; strings.Join(got, ",") != want {
		t.Errorf("usable = %v, want %s", got, want)
	}
	if Usable(cidr, netip.MustParseAddr("10.1.0.9"), 0) {
		t.Error("an address outside the subnet is usable")
	}
	if Usable(cidr, netip.MustParseAddr("10.1.0.0"), 0) != true {
		t.Error("with index 0 the first address should be usable")
	}
}

func TestRange_Size(t *testing.T) {
	if got := PrefixRange(netip.MustParsePrefix("10.0.0.0/22")).Size().Int64(); got != 1024 {
		t.Errorf("size = %d, want 1024", got)
	}
	if got := PrefixRange(netip.MustParsePrefix("fd00::/64")).Size().String(); got != "18446744073709551616" {
		t.Errorf("size = %s, want 2^64", got)
	}
}

func TestMatch_HighestPriorityThenOldest(t *testing.T) {
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}
	mk := func(name, ns string, prio int32, age time.Duration, s *metav1.LabelSelector) *cce.PodSubnetTopologySpread {
		return &cce.PodSubnetTopologySpread{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, CreationTimestamp: metav1.NewTime(time.Unix(1e9, 0).Add(-age))},
			Spec:       cce.PodSubnetTopologySpreadSpec{Priority: prio, Selector: s},
		}
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "db-0", Namespace: "ns", Labels: map[string]string{"app": "db"}}}
	list := []*cce.PodSubnetTopologySpread{
		mk("low", "ns", 1, time.Hour, sel),
		mk("other-ns", "x", 9, time.Hour, sel),
		mk("no-selector", "ns", 9, time.Hour, nil),
		mk("high-young", "ns", 5, time.Minute, sel),
		mk("high-old", "ns", 5, time.Hour, sel),
		mk("mismatch", "ns", 9, time.Hour, &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}),
		mk("bad-selector", "ns", 9, time.Hour, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}}}),
	}
	if got := Match(pod, list); got == nil || got.Name != "high-old" {
		t.Fatalf("Match = %v, want high-old", got)
	}
	pod.Labels = nil
	if got := Match(pod, list); got != nil {
		t.Errorf("a pod without labels matched %s", got.Name)
	}
}

// FuzzAllowedRanges: any spec text gives ranges inside the subnet, sorted
// and disjoint, or an error; never a panic.
func FuzzAllowedRanges(f *testing.F) {
	f.Add("10.1.0.0/24", "10.1.0.5", "10.1.0.16/28", "10.1.0.40", "10.1.0.50")
	f.Add("10.1.0.0/24", "", "", "", "")
	f.Add("fd00::/64", "fd00::5", "fd00::/120", "fd00::1", "fd00::9")
	f.Fuzz(func(t *testing.T, cidrText, ip, rng, start, end string) {
		cidr, err := netip.ParsePrefix(cidrText)
		if err != nil {
			return
		}
		alloc := cce.SubnetAllocation{IPv4: []string{ip}, IPv4Range: []string{rng}, Custom: []cce.CustomAllocation{
			{Family: k8snet.IPv4, CustomIPRange: []cce.CustomIPRange{{Start: start, End: end}}}}}
		for _, typ := range []cce.IPAllocType{cce.IPAllocTypeFixed, cce.IPAllocTypeCustom} {
			rs, err := AllowedRanges(cidr, alloc, typ)
			if err != nil {
				continue
			}
			whole := PrefixRange(cidr)
			for k, r := range rs {
				if !whole.Contains(r.First) || !whole.Contains(r.Last) || r.Last.Less(r.First) {
					t.Fatalf("%s: range %s not inside %s", typ, r, cidr)
				}
				if k > 0 && r.First.Compare(rs[k-1].Last) <= 0 {
					t.Fatalf("%s: ranges %s and %s overlap or are unsorted", typ, rs[k-1], r)
				}
			}
		}
	})
}
