package invariants

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

func node(name string) corev1.Node {
	return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"sim": "yes"}},
		Spec: corev1.NodeSpec{ProviderID: "cce://i-" + name}}
}

func pod(name, nodeName, ip string, phase corev1.PodPhase) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: corev1.PodSpec{NodeName: nodeName}, Status: corev1.PodStatus{Phase: phase, PodIP: ip}}
	if ip != "" {
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	return p
}

func wep(name, nodeName, ip string) cce.WorkloadEndpoint {
	return cce.WorkloadEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("u-ns-" + name)},
		Spec: cce.WorkloadEndpointSpec{Node: nodeName, IP: ip, Type: cce.WorkloadEndpointTypePod}}
}

func eni(nodeName string, ips ...string) ENI {
	return ENI{ID: "eni-" + nodeName, InstanceID: "i-" + nodeName, InUse: true, IPs: ips}
}

// healthy: two nodes, three running pods with weps and cloud IPs, idle 2/1.
func healthy() snapshot {
	return snapshot{
		nodes: []corev1.Node{node("n1"), node("n2")},
		pods: []corev1.Pod{
			pod("a", "n1", "10.0.0.1", corev1.PodRunning),
			pod("b", "n1", "10.0.0.2", corev1.PodRunning),
			pod("c", "n2", "10.0.1.1", corev1.PodRunning),
		},
		weps: []cce.WorkloadEndpoint{wep("a", "n1", "10.0.0.1"), wep("b", "n1", "10.0.0.2"), wep("c", "n2", "10.0.1.1")},
		enis: []ENI{eni("n1", "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"), eni("n2", "10.0.1.1", "10.0.1.2")},
		now:  time.Unix(1000, 0),
	}
}

func TestRules_Evaluate(t *testing.T) {
	bounds := &PoolBounds{Min: 1, Max: 2}
	for _, tc := range []struct {
		name   string
		cfg    Config
		mutate func(*snapshot)
		want   []string // Violation.String() prefixes, sorted by kind
	}{
		{"healthy", Config{Pool: bounds}, func(*snapshot) {}, nil},
		{"duplicate IP", Config{}, func(s *snapshot) {
			s.pods[1].Status.PodIP, s.pods[1].Status.PodIPs = "10.0.0.1", nil
		}, []string{"DuplicateIP pods=ns/a,ns/b ip=10.0.0.1", "WEPMismatch node=n1 pods=ns/b"}},
		{"duplicate across nodes, by PodIPs only", Config{}, func(s *snapshot) {
			s.pods[2].Status.PodIPs = append(s.pods[2].Status.PodIPs, corev1.PodIP{IP: "10.0.0.2"})
		}, []string{"DuplicateIP pods=ns/b,ns/c ip=10.0.0.2"}},
		{"a terminating pod whose wep is gone holds no IP", Config{}, func(s *snapshot) {
			now := metav1.Now()
			s.pods[0].DeletionTimestamp = &now // torn down: its wep released
			s.weps = s.weps[1:]
			s.pods[1].Status.PodIP, s.pods[1].Status.PodIPs = "10.0.0.1", nil // given out again
			s.weps[0].Spec.IP = "10.0.0.1"
			s.enis[0].IPs = []string{"10.0.0.1", "10.0.0.3"}
		}, nil},
		{"a terminating pod whose wep remains still holds its IP", Config{}, func(s *snapshot) {
			now := metav1.Now()
			s.pods[0].DeletionTimestamp = &now
			s.pods[1].Status.PodIP, s.pods[1].Status.PodIPs = "10.0.0.1", nil
		}, []string{"DuplicateIP pods=ns/a,ns/b ip=10.0.0.1", "WEPMismatch node=n1 pods=ns/b"}},
		{"finished and host-network pods hold no IP", Config{}, func(s *snapshot) {
			s.pods = append(s.pods, pod("done", "n1", "10.0.0.1", corev1.PodSucceeded), pod("host", "n1", "10.0.0.2", corev1.PodRunning))
			s.pods[len(s.pods)-1].Spec.HostNetwork = true
		}, nil},
		{"missing wep", Config{}, func(s *snapshot) { s.weps = s.weps[1:] }, []string{"MissingWEP node=n1 pods=ns/a ip=10.0.0.1"}},
		{"terminating pod may have lost its wep", Config{}, func(s *snapshot) {
			now := metav1.Now()
			s.pods[0].DeletionTimestamp = &now
			s.weps = s.weps[1:]
		}, nil},
		{"wep on another node", Config{}, func(s *snapshot) { s.weps[2].Spec.Node = "n1" },
			[]string{"WEPMismatch node=n2 pods=ns/c wep=ns/c ip=10.0.1.1"}},
		{"IP not on the node's ENIs", Config{}, func(s *snapshot) { s.enis[1].IPs = []string{"10.0.1.2"} },
			[]string{"IPNotOnNode node=n2 pods=ns/c ip=10.0.1.1"}},
		{"IP on a detached ENI", Config{}, func(s *snapshot) { s.enis[1].InUse = false },
			[]string{"IPNotOnNode node=n2 pods=ns/c ip=10.0.1.1"}},
		{"nodes out of scope are not checked", Config{NodeSelector: labels.SelectorFromSet(labels.Set{"sim": "no"}), Pool: bounds},
			func(s *snapshot) { s.enis = nil }, nil},
		{"orphan wep", Config{}, func(s *snapshot) { s.pods = s.pods[:2] }, []string{"OrphanWEP node=n2 wep=ns/c ip=10.0.1.1"}},
		{"fixed-IP StatefulSet reservation is no orphan", Config{}, func(s *snapshot) {
			s.pods = s.pods[:2]
			s.weps[2].Spec.Type, s.weps[2].Spec.EnableFixIP = cce.WorkloadEndpointTypeStatefulSet, cce.EnableFixIPTrue
		}, nil},
		{"other namespaces are not checked", Config{Namespaces: []string{"other"}}, func(s *snapshot) {
			s.pods[1].Status.PodIP, s.pods[1].Status.PodIPs = "10.0.0.1", nil
			s.pods = s.pods[:2]
		}, nil},
		{"leaked IPs", Config{Pool: bounds}, func(s *snapshot) {
			s.enis[0].IPs = append(s.enis[0].IPs, "10.0.0.10")
		}, []string{"LeakedIPs node=n1 idle=3[10.0.0.3,10.0.0.4,10.0.0.10]"}},
		{"pool below minimum", Config{Pool: bounds}, func(s *snapshot) { s.enis[1].IPs = []string{"10.0.1.1"} },
			[]string{"PoolBelowMin node=n2 idle=0"}},
		{"reserved IPs of other namespaces count as assigned", Config{Namespaces: []string{"ns"}, Pool: bounds}, func(s *snapshot) {
			w := wep("x", "n1", "10.0.0.3")
			w.Namespace = "elsewhere"
			s.weps = append(s.weps, w)
			s.enis[0].IPs = append(s.enis[0].IPs, "10.0.0.5")
		}, nil},
		{"(e) healthy", Config{WEPAddresses: true}, func(*snapshot) {}, nil},
		{"(e) a live pod's wep names an IP its node's ENIs lack", Config{WEPAddresses: true}, func(s *snapshot) {
			s.pods[2].Status.Phase, s.pods[2].Status.PodIP, s.pods[2].Status.PodIPs = corev1.PodPending, "", nil
			s.enis[1].IPs = []string{"10.0.1.2"}
		}, []string{"WEPNotOnENI node=n2 pods=ns/c wep=ns/c ip=10.0.1.1"}},
		{"(e) a Running pod's missing IP is (b)'s finding only", Config{WEPAddresses: true}, func(s *snapshot) {
			s.enis[1].IPs = []string{"10.0.1.2"}
		}, []string{"IPNotOnNode node=n2 pods=ns/c ip=10.0.1.1"}},
		{"(e) two weps name one IP", Config{WEPAddresses: true, Namespaces: []string{"ns"}}, func(s *snapshot) {
			w := wep("x", "n1", "10.0.0.1")
			w.Namespace = "elsewhere"
			s.weps = append(s.weps, w)
		}, []string{"WEPSharedIP wep=elsewhere/x,ns/a ip=10.0.0.1"}},
		{"(e) a reservation off its node's ENIs is a ghost past the grace (0)", Config{WEPAddresses: true}, func(s *snapshot) {
			s.pods = s.pods[:2]
			s.weps[2].Spec.Type, s.weps[2].Spec.EnableFixIP = cce.WorkloadEndpointTypeStatefulSet, cce.EnableFixIPTrue
			s.enis[1].IPs = []string{"10.0.1.2"}
		}, []string{"GhostWEP node=n2 wep=ns/c ip=10.0.1.1"}},
		{"(e) a reservation within the grace is no ghost yet", Config{WEPAddresses: true, GhostGrace: time.Second}, func(s *snapshot) {
			s.pods = s.pods[:2]
			s.weps[2].Spec.Type, s.weps[2].Spec.EnableFixIP = cce.WorkloadEndpointTypeStatefulSet, cce.EnableFixIPTrue
			s.enis[1].IPs = []string{"10.0.1.2"}
		}, nil},
		{"(e) a moving pod's wep gets the grace", Config{WEPAddresses: true, GhostGrace: time.Second}, func(s *snapshot) {
			s.pods[2].Spec.NodeName, s.pods[2].Status.Phase = "n1", corev1.PodPending
			s.enis[1].IPs = []string{"10.0.1.2"}
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := healthy()
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

func TestRules_Evaluate_OrphanGraceSpansChecks(t *testing.T) {
	r := newRules(Config{OrphanGrace: 30 * time.Second})
	s := healthy()
	s.pods = s.pods[:2]
	for _, step := range []struct {
		at   int64
		want int
	}{{1000, 0}, {1029, 0}, {1030, 1}, {1100, 1}} {
		s.now = time.Unix(step.at, 0)
		if got := r.evaluate(s).Of(KindOrphanWEP); len(got) != step.want {
			t.Fatalf("at %d: %s", step.at, got)
		}
	}
	// The pod returns: the orphan is forgotten, and a new orphan starts over.
	s.pods = healthy().pods
	s.now = time.Unix(1101, 0)
	if got := r.evaluate(s); len(got) != 0 {
		t.Fatalf("pod back: %s", got)
	}
	s.pods = s.pods[:2]
	s.now = time.Unix(1102, 0)
	if got := r.evaluate(s).Of(KindOrphanWEP); len(got) != 0 {
		t.Fatalf("grace did not restart: %s", got)
	}
}

func TestViolations_String(t *testing.T) {
	vs := Violations{{Kind: KindDuplicateIP, IP: "10.0.0.1", Pods: []string{"ns/a", "ns/b"}, Detail: "shared"}}
	want := "1 violation(s):\n  DuplicateIP pods=ns/a,ns/b ip=10.0.0.1: shared"
	if vs.String() != want {
		t.Fatalf("got %q\nwant %q", vs.String(), want)
	}
	if Violations(nil).String() != "no violations" {
		t.Fatal(Violations(nil).String())
	}
	if k := vs.Kinds(); k[KindDuplicateIP] != 1 || len(k) != 1 {
		t.Fatal(fmt.Sprint(k))
	}
}
