package spread

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

func subnetCR(id, cidr string, mod ...func(*cce.Subnet)) *cce.Subnet {
	s := &cce.Subnet{
		ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: cce.SubnetNamespace},
		Spec:       cce.SubnetSpec{ID: id, Name: id + "-name", AvailabilityZone: "zone-a", CIDR: cidr},
		Status:     cce.SubnetStatus{Enable: true, AvailableIPNum: 100},
	}
	for _, m := range mod {
		m(s)
	}
	return s
}

func spreadOf(name string, subnets map[string]cce.SubnetAllocation, mod ...func(*cce.PodSubnetTopologySpread)) *cce.PodSubnetTopologySpread {
	p := &cce.PodSubnetTopologySpread{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"},
		Spec:       cce.PodSubnetTopologySpreadSpec{Subnets: subnets},
	}
	for _, m := range mod {
		m(p)
	}
	return p
}

func wep(name, subnetID, ip, phase string) *cce.WorkloadEndpoint {
	return &cce.WorkloadEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"},
		Spec:       cce.WorkloadEndpointSpec{SubnetID: subnetID, IP: ip, Phase: phase, SubnetTopologyReference: "p"},
	}
}

func exclusive(s *cce.Subnet) { s.Spec.Exclusive = true }

func TestComputeStatus_AvailableAndUnavailable(t *testing.T) {
	p := spreadOf("p", map[string]cce.SubnetAllocation{
		"sbn-ok": {}, "sbn-missing": {}, "sbn-off": {}, "sbn-full": {}, "sbn-excl": {},
	}, func(p *cce.PodSubnetTopologySpread) { p.Spec.EnableIPAllocationStatus = true })
	in := statusInputs{
		Subnets: map[string]*cce.Subnet{
			"sbn-ok":   subnetCR("sbn-ok", "10.0.0.0/24"),
			"sbn-off":  subnetCR("sbn-off", "10.1.0.0/24", func(s *cce.Subnet) { s.Status.Enable = false }),
			"sbn-full": subnetCR("sbn-full", "10.2.0.0/24", func(s *cce.Subnet) { s.Status.HasNoMoreIP = true; s.Status.Reason = "cloud said so" }),
			"sbn-excl": subnetCR("sbn-excl", "10.3.0.0/24", exclusive),
		},
		WEPs: []*cce.WorkloadEndpoint{
			wep("a", "sbn-ok", "10.0.0.5", cce.WorkloadEndpointPhasePodRunning),
			wep("b", "sbn-ok", "10.0.0.6", ""),
			wep("c", "sbn-ok", "10.0.0.7", cce.WorkloadEndpointPhasePodDeleted),
			wep("d", "sbn-full", "10.2.0.9", cce.WorkloadEndpointPhasePodRunning),
		},
		Pods: []string{"a", "b", "c", "e"},
	}
	st, problems := computeStatus(p, in)
	if len(problems) != 0 {
		t.Fatalf("problems %v", problems)
	}
	if st.Name != "p" || st.AvailableSubnetsNum != 1 || st.UnavailableSubnetsNum != 4 {
		t.Fatalf("status %+v", st)
	}
	ok := st.AvailableSubnets["sbn-ok"]
	want := cce.SubnetPodStatus{
		AvailableIPNum: 100, Enable: true, ID: "sbn-ok", Name: "sbn-ok-name", AvailabilityZone: "zone-a", CIDR: "10.0.0.0/24",
		PodCount: 2, IPAllocations: map[string]string{"10.0.0.5": "a", "10.0.0.6": "b"},
	}
	if !statusEqual(cce.PodSubnetTopologySpreadStatus{AvailableSubnets: map[string]cce.SubnetPodStatus{"x": ok}},
		cce.PodSubnetTopologySpreadStatus{AvailableSubnets: map[string]cce.SubnetPodStatus{"x": want}}) {
		t.Fatalf("available sbn-ok = %+v, want %+v", ok, want)
	}
	for id, msg := range map[string]string{
		"sbn-missing": msgNoSubnet,
		"sbn-off":     msgDisabled,
		"sbn-full":    msgNoMoreIP + ": cloud said so",
		"sbn-excl":    "the subnet is exclusive; strategy Elastic cannot allocate from it",
	} {
		if got := st.UnavailableSubnets[id].Message; got != msg {
			t.Errorf("%s: message %q, want %q", id, got, msg)
		}
	}
	if full := st.UnavailableSubnets["sbn-full"]; full.PodCount != 1 || full.IPAllocations["10.2.0.9"] != "d" || !full.HasNoMoreIP {
		t.Errorf("an exhausted subnet still counts its pods: %+v", full)
	}
	// a and b have live weps with addresses; c's wep is podDeleted; e has none.
	if st.PodMatchedCount != 4 || st.PodAffectedCount != 2 {
		t.Errorf("matched %d affected %d, want 4 and 2", st.PodMatchedCount, st.PodAffectedCount)
	}
}

func TestComputeStatus_IPAllocationsOnlyWhenEnabled(t *testing.T) {
	p := spreadOf("p", map[string]cce.SubnetAllocation{"sbn-ok": {}})
	in := statusInputs{
		Subnets: map[string]*cce.Subnet{"sbn-ok": subnetCR("sbn-ok", "10.0.0.0/24")},
		WEPs:    []*cce.WorkloadEndpoint{wep("a", "sbn-ok", "10.0.0.5", "")},
	}
	st, _ := computeStatus(p, in)
	if s := st.AvailableSubnets["sbn-ok"]; s.IPAllocations != nil || s.PodCount != 1 {
		t.Fatalf("disabled: %+v", s)
	}
}

func TestComputeStatus_StrategyChecks(t *testing.T) {
	fixed := cce.SubnetAllocation{IPAllocationStrategy: cce.IPAllocationStrategy{Type: cce.IPAllocTypeFixed}}
	for _, tc := range []struct {
		name   string
		alloc  cce.SubnetAllocation
		global *cce.IPAllocationStrategy
		subnet *cce.Subnet
		want   string // "" available, else a part of the message
	}{
		{"fixed on exclusive", fixed, nil, subnetCR("sbn-x", "10.0.0.0/24", exclusive), ""},
		{"fixed on shared", fixed, nil, subnetCR("sbn-x", "10.0.0.0/24"), "needs an exclusive subnet"},
		{"global strategy overrides", cce.SubnetAllocation{}, &cce.IPAllocationStrategy{Type: cce.IPAllocTypeManual},
			subnetCR("sbn-x", "10.0.0.0/24"), "strategy Manual needs an exclusive subnet"},
		{"unknown type", cce.SubnetAllocation{IPAllocationStrategy: cce.IPAllocationStrategy{Type: "Sticky"}}, nil,
			subnetCR("sbn-x", "10.0.0.0/24"), `unknown allocation type "Sticky"`},
		{"range outside the subnet", cce.SubnetAllocation{IPAllocationStrategy: fixed.IPAllocationStrategy, IPv4Range: []string{"10.9.0.0/28"}},
			nil, subnetCR("sbn-x", "10.0.0.0/24", exclusive), "address ranges: range 10.9.0.0-10.9.0.15 is not inside"},
		{"garbage address", cce.SubnetAllocation{IPAllocationStrategy: fixed.IPAllocationStrategy, IPv4: []string{"ten.0.0.1"}},
			nil, subnetCR("sbn-x", "10.0.0.0/24", exclusive), `"ten.0.0.1" is not an IPv4 address`},
		{"garbage CIDR", cce.SubnetAllocation{}, nil, subnetCR("sbn-x", "not-a-cidr"), `CIDR "not-a-cidr" is not valid`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := spreadOf("p", map[string]cce.SubnetAllocation{"sbn-x": tc.alloc},
				func(p *cce.PodSubnetTopologySpread) { p.Spec.Strategy = tc.global })
			st, _ := computeStatus(p, statusInputs{Subnets: map[string]*cce.Subnet{"sbn-x": tc.subnet}})
			if tc.want == "" {
				if _, ok := st.AvailableSubnets["sbn-x"]; !ok {
					t.Fatalf("not available: %+v", st.UnavailableSubnets)
				}
				return
			}
			if got := st.UnavailableSubnets["sbn-x"].Message; !strings.Contains(got, tc.want) {
				t.Fatalf("message %q, want it to contain %q", got, tc.want)
			}
		})
	}
}

// Corrupt objects: subnet IDs no Subnet can have, weps with garbage fields.
// The status says what is wrong; nothing panics.
func TestComputeStatus_CorruptObjects(t *testing.T) {
	p := spreadOf("p", map[string]cce.SubnetAllocation{
		"": {}, "SBN_Bad!": {}, "sbn-ok": {}, strings.Repeat("x", 300): {},
	}, func(p *cce.PodSubnetTopologySpread) { p.Spec.EnableIPAllocationStatus = true })
	in := statusInputs{
		Subnets: map[string]*cce.Subnet{"sbn-ok": subnetCR("sbn-ok", "10.0.0.0/24")},
		WEPs: []*cce.WorkloadEndpoint{
			wep("garbage-ip", "sbn-ok", "10.0.0.999", ""),
			wep("ipv6-ok", "sbn-ok", "", ""),
			wep("dup-1", "sbn-ok", "10.0.0.9", ""),
			wep("dup-2", "sbn-ok", "10.0.0.9", ""),
			wep("elsewhere", "sbn-unlisted", "10.8.0.1", ""),
			wep("weird-phase", "sbn-ok", "", "¯\\_(ツ)_/¯"),
			{ObjectMeta: metav1.ObjectMeta{Name: "empty"}},
		},
		Pods: []string{"garbage-ip", "garbage-ip", ""},
	}
	in.WEPs[1].Spec.IPv6 = "fd00::5"
	st, problems := computeStatus(p, in)
	for _, id := range []string{"", "SBN_Bad!", strings.Repeat("x", 300)} {
		if msg := st.UnavailableSubnets[id].Message; !strings.Contains(msg, msgBadSubnetID) {
			t.Errorf("subnet %q: message %q", id, msg)
		}
	}
	ok := st.AvailableSubnets["sbn-ok"]
	if ok.PodCount != 5 {
		t.Errorf("podCount %d, want 5 (every live wep of the subnet)", ok.PodCount)
	}
	if want := map[string]string{"fd00::5": "ipv6-ok", "10.0.0.9": "dup-1"}; !equalMaps(ok.IPAllocations, want) {
		t.Errorf("ipAllocations %v, want %v", ok.IPAllocations, want)
	}
	for _, want := range []string{
		`WorkloadEndpoint garbage-ip has an invalid address "10.0.0.999"`,
		"WorkloadEndpoints dup-1 and dup-2 both name address 10.0.0.9",
		`WorkloadEndpoint elsewhere has an address of subnet "sbn-unlisted", which the spec does not list`,
	} {
		if !contains(problems, want) {
			t.Errorf("problems %q lack %q", problems, want)
		}
	}
	if n := st.UnavailableSubnets[""].PodCount; n != 1 {
		t.Errorf("the wep without a subnet ID counts %d times under the spec's empty ID, want once", n)
	}
	// Repeated and empty pod names count once.
	if st.PodMatchedCount != 2 || st.PodAffectedCount != 1 {
		t.Errorf("matched %d affected %d, want 2 and 1", st.PodMatchedCount, st.PodAffectedCount)
	}
}

func TestComputeStatus_NoSubnets(t *testing.T) {
	st, problems := computeStatus(spreadOf("p", nil), statusInputs{})
	if !statusEqual(st, cce.PodSubnetTopologySpreadStatus{Name: "p"}) || problems != nil {
		t.Fatalf("status %+v, problems %v", st, problems)
	}
}

func TestStatusEqual_EmptyIsNone(t *testing.T) {
	a := cce.PodSubnetTopologySpreadStatus{Name: "p", AvailableSubnets: map[string]cce.SubnetPodStatus{}}
	b := cce.PodSubnetTopologySpreadStatus{Name: "p"}
	if !statusEqual(a, b) {
		t.Fatal("an empty map differs from none")
	}
	b.PodAffectedCount = 1
	if statusEqual(a, b) {
		t.Fatal("a changed count compares equal")
	}
}

func TestSummarize_Bounded(t *testing.T) {
	var many []string
	for i := range 8 {
		many = append(many, string(rune('a'+i)))
	}
	if got := summarize(many); got != "a; b; c; d; e; and 3 more" {
		t.Fatalf("summarize = %q", got)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
