package invariants

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

func subnetCR(id, cidr string, exclusive bool) cce.Subnet {
	return cce.Subnet{ObjectMeta: metav1.ObjectMeta{Namespace: cce.SubnetNamespace, Name: id},
		Spec: cce.SubnetSpec{ID: id, CIDR: cidr, Exclusive: exclusive}}
}

func claim(ip, holder string) cce.IPClaim {
	c := cce.IPClaim{ObjectMeta: metav1.ObjectMeta{Name: ip}, Spec: cce.IPClaimSpec{SubnetID: "sbn-x", IP: ip}}
	if holder != "" {
		ns, name := splitKey(holder)
		c.Spec.Holder = &cce.IPClaimHolder{Namespace: ns, Name: name}
	} else {
		c.Spec.ReleasedAt = &metav1.Time{Time: time.Unix(900, 0)}
	}
	return c
}

func spread(name string, subnets ...string) cce.PodSubnetTopologySpread {
	p := cce.PodSubnetTopologySpread{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: cce.PodSubnetTopologySpreadSpec{Subnets: map[string]cce.SubnetAllocation{}}}
	for _, s := range subnets {
		p.Spec.Subnets[s] = cce.SubnetAllocation{}
	}
	return p
}

func annotated(p corev1.Pod, psts string) corev1.Pod {
	p.Annotations = map[string]string{cce.AnnotationPodSubnetTopologySpread: psts}
	return p
}

// healthyPSTS is healthy() with the nodes' ENIs in 10.0.0.0/16 and two PSTS
// pods whose addresses came from other subnets: f-0 (Fixed, exclusive
// subnet sbn-x, its claim held) on n1 and e (Elastic, sbn-e, no claim
// needed) on n2.
func healthyPSTS() snapshot {
	s := healthy()
	for i := range s.enis {
		s.enis[i].SubnetID, s.enis[i].SubnetCIDR = "sbn-node", "10.0.0.0/16"
	}
	s.enis[0].IPs = append(s.enis[0].IPs, "10.9.0.10")
	s.enis[1].IPs = append(s.enis[1].IPs, "10.8.0.5")
	s.pods = append(s.pods, annotated(pod("f-0", "n1", "10.9.0.10", corev1.PodRunning), "fixed"),
		annotated(pod("e", "n2", "10.8.0.5", corev1.PodRunning), "elastic"))
	f := wep("f-0", "n1", "10.9.0.10")
	f.Spec.Type, f.Spec.EnableFixIP, f.Spec.SubnetID, f.Spec.SubnetTopologyReference =
		cce.WorkloadEndpointTypeStatefulSet, cce.EnableFixIPTrue, "sbn-x", "fixed"
	e := wep("e", "n2", "10.8.0.5")
	e.Spec.SubnetID, e.Spec.SubnetTopologyReference = "sbn-e", "elastic"
	s.weps = append(s.weps, f, e)
	s.subnets = []cce.Subnet{subnetCR("sbn-node", "10.0.0.0/16", false), subnetCR("sbn-x", "10.9.0.0/24", true),
		subnetCR("sbn-e", "10.8.0.0/24", false)}
	s.claims = []cce.IPClaim{claim("10.9.0.10", "ns/f-0"), claim("10.9.0.11", "")}
	s.spreads = []cce.PodSubnetTopologySpread{spread("fixed", "sbn-x"), spread("elastic", "sbn-e")}
	return s
}

func TestRules_Evaluate_PSTS(t *testing.T) {
	bounds := &PoolBounds{Min: 1, Max: 2}
	all := Config{Pool: bounds, WEPAddresses: true, Claims: true}
	for _, tc := range []struct {
		name   string
		cfg    Config
		mutate func(*snapshot)
		want   []string // Violation.String() prefixes, sorted by kind
	}{
		{"healthy: cross-subnet addresses on the node's ENIs pass (b), (d), (e), (g)", all, func(*snapshot) {}, nil},
		{"(d) a cross-subnet address no wep names is leaked, not idle", Config{Pool: bounds}, func(s *snapshot) {
			s.enis[0].IPs = append(s.enis[0].IPs, "10.8.0.9")
		}, []string{"LeakedCrossSubnetIP node=n1 ip=10.8.0.9"}},
		{"(d) a PSTS pod's wep on another node leaves its address unnamed on this one", Config{Pool: bounds}, func(s *snapshot) {
			s.weps[4].Spec.Node = "n1"
		}, []string{"LeakedCrossSubnetIP node=n2 ip=10.8.0.5", "WEPMismatch node=n2 pods=ns/e"}},
		{"(d) an ENI whose subnet is unknown counts every unnamed address as idle", Config{Pool: bounds}, func(s *snapshot) {
			s.enis[0].SubnetCIDR = ""
			s.enis[0].IPs = append(s.enis[0].IPs, "10.8.0.9")
		}, []string{"LeakedIPs node=n1 idle=3[10.0.0.3,10.0.0.4,10.8.0.9]"}},
		{"(g) a wep on an exclusive address without a claim", Config{Claims: true}, func(s *snapshot) {
			s.claims = s.claims[1:]
		}, []string{"UnclaimedIP node=n1 ip=10.9.0.10: address of the exclusive subnet sbn-x on an ENI of instance i-n1, but no IPClaim",
			"UnclaimedWEP node=n1 wep=ns/f-0 ip=10.9.0.10: WorkloadEndpoint names an address of the exclusive subnet sbn-x but no IPClaim"}},
		{"(g) a wep whose address's claim another pod holds", Config{Claims: true}, func(s *snapshot) {
			s.claims[0] = claim("10.9.0.10", "ns/other")
		}, []string{"UnclaimedWEP node=n1 wep=ns/f-0 ip=10.9.0.10: WorkloadEndpoint names an address of the exclusive subnet sbn-x but its IPClaim is held by ns/other"}},
		{"(g) a wep whose address's claim is free", Config{Claims: true}, func(s *snapshot) {
			s.claims[0] = claim("10.9.0.10", "")
		}, []string{"UnclaimedIP node=n1 ip=10.9.0.10", "UnclaimedWEP node=n1 wep=ns/f-0 ip=10.9.0.10"}},
		{"(g) a claim of the same name in another namespace is not the pod's", Config{Claims: true}, func(s *snapshot) {
			s.claims[0] = claim("10.9.0.10", "elsewhere/f-0")
		}, []string{"UnclaimedWEP node=n1 wep=ns/f-0 ip=10.9.0.10"}},
		{"(g) weps of unchecked namespaces need no claim here", Config{Claims: true, Namespaces: []string{"other"}}, func(s *snapshot) {
			s.claims = s.claims[1:]
			s.enis[0].IPs = s.enis[0].IPs[:4]
		}, nil},
		{"(g) an exclusive address on an ENI with no wep and no held claim", Config{Claims: true}, func(s *snapshot) {
			s.enis[1].IPs = append(s.enis[1].IPs, "10.9.0.11")
		}, []string{"UnclaimedIP node=n2 ip=10.9.0.11: address of the exclusive subnet sbn-x on an ENI of instance i-n2, but its IPClaim is free"}},
		{"(g) an exclusive address held for a pod that is away (a kept address) is fine", Config{Claims: true}, func(s *snapshot) {
			s.pods = append(s.pods[:3], s.pods[4])
		}, nil},
		{"(g) an exclusive address on a detached ENI is not checked", Config{Claims: true}, func(s *snapshot) {
			s.enis = append(s.enis, ENI{ID: "eni-old", InstanceID: "i-n2", IPs: []string{"10.9.0.12"}})
		}, nil},
		{"(g) two weps on one exclusive address, one on a node nobody serves", Config{Claims: true, Namespaces: []string{"ns"}}, func(s *snapshot) {
			w := wep("x", "gone", "10.9.0.10")
			w.Namespace = "elsewhere"
			s.weps = append(s.weps, w)
		}, []string{"WEPSharedIP wep=elsewhere/x,ns/f-0 ip=10.9.0.10: WorkloadEndpoints name the same address of an exclusive subnet"}},
		{"(g) with (e) on, two weps of served nodes on one address are reported once", Config{Claims: true, WEPAddresses: true,
			Namespaces: []string{"ns"}}, func(s *snapshot) {
			w := wep("x", "n2", "10.9.0.10")
			w.Namespace = "elsewhere"
			s.weps = append(s.weps, w)
		}, []string{"GhostWEP node=n2 wep=elsewhere/x ip=10.9.0.10", "WEPSharedIP wep=elsewhere/x,ns/f-0 ip=10.9.0.10: WorkloadEndpoints name the same IP"}},
		{"(g) a PSTS pod's address outside its PSTS's subnets", Config{Claims: true}, func(s *snapshot) {
			s.pods[4].Annotations[cce.AnnotationPodSubnetTopologySpread] = "fixed"
		}, []string{"OutsidePSTS node=n2 pods=ns/e ip=10.8.0.5: the pod's PodSubnetTopologySpread fixed lists the subnets sbn-x"}},
		{"(g) a PSTS pod with the node's subnet address", Config{Claims: true}, func(s *snapshot) {
			s.pods[0] = annotated(s.pods[0], "elastic")
		}, []string{"OutsidePSTS node=n1 pods=ns/a ip=10.0.0.1"}},
		{"(g) a PSTS pod whose PSTS is gone is not judged", Config{Claims: true}, func(s *snapshot) {
			s.pods[0] = annotated(s.pods[0], "deleted")
		}, nil},
		{"(g) a PSTS subnet without a Subnet resource contains nothing", Config{Claims: true}, func(s *snapshot) {
			s.subnets = s.subnets[:2]
		}, []string{"OutsidePSTS node=n2 pods=ns/e ip=10.8.0.5"}},
		{"(g) off: nothing of it is checked", Config{}, func(s *snapshot) {
			s.claims = nil
			s.pods[4].Annotations[cce.AnnotationPodSubnetTopologySpread] = "fixed"
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := healthyPSTS()
			tc.mutate(&s)
			got := newRules(tc.cfg).evaluate(s)
			if len(got) != len(tc.want) {
				t.Fatalf("want %d violations, got %s", len(tc.want), got)
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(got[i].String(), w) {
					t.Errorf("violation %d: want prefix %q, got %q", i, w, got[i])
				}
			}
		})
	}
}

// The claim grace spans checks, per wep and per ENI address, and starts
// over once the claim was back.
func TestRules_Evaluate_ClaimGraceSpansChecks(t *testing.T) {
	r := newRules(Config{Claims: true, ClaimGrace: 30 * time.Second})
	s := healthyPSTS()
	s.claims = s.claims[1:]
	for _, step := range []struct {
		at   int64
		want int
	}{{1000, 0}, {1029, 0}, {1030, 2}, {1100, 2}} {
		s.now = time.Unix(step.at, 0)
		got := r.evaluate(s)
		if len(got.Of(KindUnclaimedWEP)) != step.want/2 || len(got.Of(KindUnclaimedIP)) != step.want/2 || len(got) != step.want {
			t.Fatalf("at %d: want %d findings, got %s", step.at, step.want, got)
		}
	}
	s.claims = healthyPSTS().claims
	s.now = time.Unix(1101, 0)
	if got := r.evaluate(s); len(got) != 0 {
		t.Fatalf("claim back: %s", got)
	}
	s.claims = s.claims[1:]
	s.now = time.Unix(1102, 0)
	if got := r.evaluate(s); len(got) != 0 {
		t.Fatalf("grace did not restart: %s", got)
	}
}
