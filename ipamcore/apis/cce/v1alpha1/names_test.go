package v1alpha1_test

import (
	"net/netip"
	"testing"

	v1 "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestIPPoolName(t *testing.T) {
	for _, tc := range []struct{ node, want string }{
		{"node-a", "ippool-node-a"},
		{"10.0.0.5", "ippool-10-0-0-5"},
		{"192.168.100.254", "ippool-192-168-100-254"},
		// Host names keep their dots; only addresses are rewritten.
		{"worker-1.example.internal", "ippool-worker-1.example.internal"},
		{"fd00::1", "ippool-fd00--1"},
	} {
		got := v1.IPPoolName(tc.node)
		if got != tc.want {
			t.Errorf("IPPoolName(%q) = %q, want %q", tc.node, got, tc.want)
		}
		if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
			t.Errorf("IPPoolName(%q) = %q is not a valid object name: %v", tc.node, got, errs)
		}
	}
}

func TestIPPoolNodeSelector(t *testing.T) {
	if got, want := v1.IPPoolNodeSelector("10.0.0.5"), "kubernetes.io/hostname=10.0.0.5"; got != want {
		t.Errorf("IPPoolNodeSelector = %q, want %q", got, want)
	}
}

func TestStatefulSetName(t *testing.T) {
	for _, tc := range []struct {
		pod     string
		name    string
		ordinal int
		ok      bool
	}{
		{"web-0", "web", 0, true},
		{"web-12", "web", 12, true},
		{"my-db-3", "my-db", 3, true},
		{"web", "", 0, false},
		{"web-", "", 0, false},
		{"-3", "", 0, false},
		{"web-x1", "", 0, false},
		{"nginx-7c5b8d9f4-x2k7p", "", 0, false},
		{"web-99999999999999999999999", "", 0, false}, // overflows int
	} {
		name, ordinal, ok := v1.StatefulSetName(tc.pod)
		if name != tc.name || ordinal != tc.ordinal || ok != tc.ok {
			t.Errorf("StatefulSetName(%q) = %q, %d, %v; want %q, %d, %v",
				tc.pod, name, ordinal, ok, tc.name, tc.ordinal, tc.ok)
		}
	}
}

func TestWorkloadEndpoint_Kinds(t *testing.T) {
	for _, tc := range []struct {
		typ, fix          string
		fixedSts, reusing bool
	}{
		{v1.WorkloadEndpointTypeStatefulSet, "True", true, false},
		{v1.WorkloadEndpointTypeStatefulSet, "true", false, false}, // case-sensitive, as in the reference
		{v1.WorkloadEndpointTypeStatefulSet, "", false, false},
		{v1.WorkloadEndpointTypeReuseIPPod, "True", false, true},
		{v1.WorkloadEndpointTypeReuseIPPod, "false", false, false},
		{v1.WorkloadEndpointTypePod, "True", false, false},
	} {
		w := &v1.WorkloadEndpoint{Spec: v1.WorkloadEndpointSpec{Type: tc.typ, EnableFixIP: tc.fix}}
		if got := w.IsFixedStatefulSet(); got != tc.fixedSts {
			t.Errorf("type %q enableFixIP %q: IsFixedStatefulSet = %v", tc.typ, tc.fix, got)
		}
		if got := w.IsCustomReuse(); got != tc.reusing {
			t.Errorf("type %q enableFixIP %q: IsCustomReuse = %v", tc.typ, tc.fix, got)
		}
	}
}

func TestClaimName(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"10.0.1.5", "10.0.1.5"},
		{"0.0.0.0", "0.0.0.0"},
		{"255.255.255.255", "255.255.255.255"},
		{"::ffff:10.0.1.5", "10.0.1.5"}, // IPv4-mapped: the IPv4 address's claim
		{"fd00::1", "fd00-0-0-0-0-0-0-1"},
		{"fd00::1%eth0", "fd00-0-0-0-0-0-0-1"}, // a zone is no part of a subnet address
		{"::", "0-0-0-0-0-0-0-0"},
		{"2400:da00:e003:0:1a0:ff:fe00:ab", "2400-da00-e003-0-1a0-ff-fe00-ab"},
		{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "ffff-ffff-ffff-ffff-ffff-ffff-ffff-ffff"},
	} {
		addr := netip.MustParseAddr(tc.addr)
		got := v1.ClaimName(addr)
		if got != tc.want {
			t.Errorf("ClaimName(%s) = %q, want %q", tc.addr, got, tc.want)
		}
		if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
			t.Errorf("ClaimName(%s) = %q is not a valid object name: %v", tc.addr, got, errs)
		}
		back, ok := v1.AddrOfClaimName(got)
		if want := addr.Unmap().WithZone(""); !ok || back != want {
			t.Errorf("AddrOfClaimName(%q) = %s, %v; want %s", got, back, ok, want)
		}
	}
	if got := v1.ClaimName(netip.Addr{}); got != "" {
		t.Errorf("ClaimName of the zero Addr = %q, want \"\"", got)
	}
}

func TestAddrOfClaimName_RejectsOtherNames(t *testing.T) {
	for _, name := range []string{
		"", "web-0", "ip-10.0.1.5", "10.0.1", "10.0.1.5.6", "010.0.1.5", "10.0.1.256",
		"fd00::1",                        // colons are not in names
		"fd00-0-0-0-0-0-1",               // seven groups
		"fd00-0-0-0-0-0-0-0-1",           // nine groups
		"FD00-0-0-0-0-0-0-1",             // upper case
		"fd00-0-0-0-0-0-0-01",            // leading zero
		"fd00-0-0-0-0-0-0-0001",          // leading zeros
		"fd00-0-0-0-0-0-0-10000",         // five digits
		"fd00-0-0-0-0-0-0-+1",            // sign
		"fd00-0-0-0-0-0-0-",              // empty group
		"0-0-0-0-0-ffff-a00-105",         // IPv4-mapped: named 10.0.1.5
		"fd00-0-0-0-0-0-0-1.example.com", // dots and dashes
	} {
		if a, ok := v1.AddrOfClaimName(name); ok {
			t.Errorf("AddrOfClaimName(%q) = %s, want no address", name, a)
		}
	}
}
