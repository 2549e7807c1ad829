package webhook

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

const ns = "apps"

// podWorld: PSTS "web" (priority 1) and "web-high" (priority 5, only for
// tier=gold), "spread" with zone spreading, "nowhere" whose subnets are all
// unusable; Subnets in two zones plus a disabled and an exhausted one.
func podWorld() world {
	alloc := map[string]cce.SubnetAllocation{"sbn-a": {}, "sbn-b": {}, "sbn-off": {}, "sbn-full": {}}
	spread := pstsObj(ns, "spread", 0, map[string]string{"app": "spread"}, map[string]cce.SubnetAllocation{"sbn-a": {}})
	spread.Spec.EnablePodTopologySpread, spread.Spec.MaxSkew = true, 0
	return world{
		psts: []*cce.PodSubnetTopologySpread{
			pstsObj(ns, "web", 1, map[string]string{"app": "web"}, alloc),
			pstsObj(ns, "web-high", 5, map[string]string{"app": "web", "tier": "gold"}, map[string]cce.SubnetAllocation{"sbn-b": {}}),
			pstsObj("other", "web", 9, map[string]string{"app": "web"}, alloc),
			spread,
			pstsObj(ns, "nowhere", 0, map[string]string{"app": "nowhere"}, map[string]cce.SubnetAllocation{"sbn-off": {}, "sbn-none": {}}),
		},
		subnets: []*cce.Subnet{
			subnetCR("sbn-a", "cn-bj-a", false, true, false),
			subnetCR("sbn-b", "cn-bj-b", true, true, false),
			subnetCR("sbn-off", "cn-bj-c", false, false, false),
			subnetCR("sbn-full", "cn-bj-d", false, true, true),
		},
	}
}

// review runs the pod webhook on raw and returns the patched pod (raw when
// there was no patch) and whether there was a patch.
func review(t *testing.T, s *Server, raw []byte) ([]byte, bool) {
	t.Helper()
	resp, err := s.reviewPod(context.Background(), &admissionv1.AdmissionRequest{
		UID: "u", Operation: admissionv1.Create, Namespace: ns,
		Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Object:   runtime.RawExtension{Raw: raw},
	})
	if err != nil {
		t.Fatalf("reviewPod: %v", err)
	}
	if !resp.Allowed {
		t.Fatalf("pod refused: %v", resp.Result)
	}
	if len(resp.Patch) == 0 {
		return raw, false
	}
	if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("patch type %v", resp.PatchType)
	}
	out, err := applyPatch(raw, resp.Patch)
	if err != nil {
		t.Fatalf("patch %s does not apply to %s: %v", resp.Patch, raw, err)
	}
	return out, true
}

func decodePod(t *testing.T, raw []byte) *corev1.Pod {
	t.Helper()
	var p corev1.Pod
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatalf("patched pod does not decode: %v\n%s", err, raw)
	}
	return &p
}

func zoneTermsOf(p *corev1.Pod) [][]string {
	var out [][]string
	if p.Spec.Affinity == nil || p.Spec.Affinity.NodeAffinity == nil ||
		p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
	}
	for _, t := range p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		var zones []string
		for _, e := range t.MatchExpressions {
			if e.Key == "topology.kubernetes.io/zone" && e.Operator == corev1.NodeSelectorOpIn {
				zones = e.Values
			}
		}
		out = append(out, zones)
	}
	return out
}

func ipRequest(c corev1.Container) (req, lim string) {
	name := corev1.ResourceName(cce.ResourceIP)
	if q, ok := c.Resources.Requests[name]; ok {
		req = q.String()
	}
	if q, ok := c.Resources.Limits[name]; ok {
		lim = q.String()
	}
	return req, lim
}

func TestServer_ReviewPod(t *testing.T) {
	for _, tc := range []struct {
		name       string
		pod        string
		patched    bool
		annotation string     // want; "" for none
		zoneTerms  [][]string // want, per required term
		ip         string     // want request = limit on the first container; "" for none
		check      func(t *testing.T, p *corev1.Pod)
	}{{
		name:    "matching pod with nothing set",
		pod:     `{"metadata":{"name":"p","labels":{"app":"web"}},"spec":{"containers":[{"name":"c","resources":{}}]}}`,
		patched: true, annotation: "web", zoneTerms: [][]string{{"zoneA", "zoneB"}}, ip: "1",
	}, {
		name:    "null annotations, no resources member",
		pod:     `{"metadata":{"name":"p","labels":{"app":"web"},"annotations":null},"spec":{"containers":[{"name":"c"}]}}`,
		patched: true, annotation: "web", zoneTerms: [][]string{{"zoneA", "zoneB"}}, ip: "1",
	}, {
		name:    "highest priority wins",
		pod:     `{"metadata":{"name":"p","labels":{"app":"web","tier":"gold"},"annotations":{"x":"y"}},"spec":{"containers":[{"name":"c"}]}}`,
		patched: true, annotation: "web-high", zoneTerms: [][]string{{"zoneB"}}, ip: "1",
		check: func(t *testing.T, p *corev1.Pod) {
			if p.Annotations["x"] != "y" {
				t.Errorf("other annotations lost: %v", p.Annotations)
			}
		},
	}, {
		name: "zone ANDed into every non-empty required term; the empty term stays empty",
		pod: `{"metadata":{"name":"p","labels":{"app":"web"}},"spec":{"containers":[{"name":"c"}],"affinity":{
			"podAntiAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[{"weight":1,"podAffinityTerm":{"topologyKey":"h"}}]},
			"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[
				{"matchExpressions":[{"key":"disk","operator":"In","values":["ssd"]}]},
				{"matchFields":[{"key":"metadata.name","operator":"In","values":["n1"]}]},
				{}]}}}}}`,
		patched: true, annotation: "web", zoneTerms: [][]string{{"zoneA", "zoneB"}, {"zoneA", "zoneB"}, nil}, ip: "1",
		check: func(t *testing.T, p *corev1.Pod) {
			terms := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
			if terms[0].MatchExpressions[0].Key != "disk" || len(terms[1].MatchFields) != 1 || p.Spec.Affinity.PodAntiAffinity == nil {
				t.Errorf("the pod's own affinity changed: %+v", p.Spec.Affinity)
			}
		},
	}, {
		name:    "node affinity with preferred terms only",
		pod:     `{"metadata":{"name":"p","labels":{"app":"web"}},"spec":{"containers":[{"name":"c"}],"affinity":{"nodeAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[{"weight":1,"preference":{"matchExpressions":[{"key":"a","operator":"Exists"}]}}]}}}}`,
		patched: true, annotation: "web", zoneTerms: [][]string{{"zoneA", "zoneB"}}, ip: "1",
		check: func(t *testing.T, p *corev1.Pod) {
			if len(p.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
				t.Error("preferred terms lost")
			}
		},
	}, {
		name:    "annotated by the user: kept, affinity of the named PSTS",
		pod:     `{"metadata":{"name":"p","labels":{"app":"web"},"annotations":{"cce.baidubce.com/PodSubnetTopologySpread":"web-high"}},"spec":{"containers":[{"name":"c"}]}}`,
		patched: true, annotation: "web-high", zoneTerms: [][]string{{"zoneB"}}, ip: "1",
	}, {
		name:    "annotated with a PSTS that does not exist",
		pod:     `{"metadata":{"name":"p","labels":{"app":"web"},"annotations":{"cce.baidubce.com/PodSubnetTopologySpread":"gone"}},"spec":{"containers":[{"name":"c"}]}}`,
		patched: false, annotation: "gone",
	}, {
		name:    "matches no PSTS",
		pod:     `{"metadata":{"name":"p","labels":{"app":"db"}},"spec":{"containers":[{"name":"c"}]}}`,
		patched: false,
	}, {
		name:    "host network",
		pod:     `{"metadata":{"name":"p","labels":{"app":"web"}},"spec":{"hostNetwork":true,"containers":[{"name":"c"}]}}`,
		patched: false,
	}, {
		name:    "the IP resource already asked for: left as written",
		pod:     `{"metadata":{"name":"p","labels":{"app":"web"}},"spec":{"initContainers":[{"name":"i","resources":{"limits":{"cce.baidubce.com/ip":"2"}}}],"containers":[{"name":"c"}]}}`,
		patched: true, annotation: "web", zoneTerms: [][]string{{"zoneA", "zoneB"}}, ip: "",
	}, {
		name:    "requests only: the limits map is created",
		pod:     `{"metadata":{"name":"p","labels":{"app":"web"}},"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"100m"}}},{"name":"d"}]}}`,
		patched: true, annotation: "web", zoneTerms: [][]string{{"zoneA", "zoneB"}}, ip: "1",
		check: func(t *testing.T, p *corev1.Pod) {
			if q := p.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU]; q.Cmp(resource.MustParse("100m")) != 0 {
				t.Errorf("cpu request changed: %v", q)
			}
			if r, l := ipRequest(p.Spec.Containers[1]); r != "" || l != "" {
				t.Error("the second container got the resource too")
			}
		},
	}, {
		name:    "zone spread added with maxSkew at least 1",
		pod:     `{"metadata":{"name":"p","labels":{"app":"spread"}},"spec":{"containers":[{"name":"c"}]}}`,
		patched: true, annotation: "spread", zoneTerms: [][]string{{"zoneA"}}, ip: "1",
		check: func(t *testing.T, p *corev1.Pod) {
			c := p.Spec.TopologySpreadConstraints
			if len(c) != 1 || c[0].MaxSkew != 1 || c[0].TopologyKey != "topology.kubernetes.io/zone" || c[0].WhenUnsatisfiable != corev1.DoNotSchedule ||
				c[0].LabelSelector.MatchLabels["app"] != "spread" {
				t.Errorf("spread constraints %+v", c)
			}
		},
	}, {
		name:    "no usable subnet: annotation and resource, no affinity",
		pod:     `{"metadata":{"name":"p","labels":{"app":"nowhere"}},"spec":{"containers":[{"name":"c"}]}}`,
		patched: true, annotation: "nowhere", zoneTerms: nil, ip: "1",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestServer(t, podWorld())
			out, patched := review(t, s, []byte(tc.pod))
			if patched != tc.patched {
				t.Fatalf("patched = %v, want %v", patched, tc.patched)
			}
			p := decodePod(t, out)
			if got := p.Annotations[cce.AnnotationPodSubnetTopologySpread]; got != tc.annotation {
				t.Errorf("annotation %q, want %q", got, tc.annotation)
			}
			if got := zoneTermsOf(p); !slices.EqualFunc(got, tc.zoneTerms, slices.Equal) {
				t.Errorf("zones per required term %q, want %q", got, tc.zoneTerms)
			}
			if r, l := ipRequest(p.Spec.Containers[0]); r != tc.ip || l != tc.ip {
				t.Errorf("first container's %s request %q limit %q, want both %q", cce.ResourceIP, r, l, tc.ip)
			}
			if tc.check != nil {
				tc.check(t, p)
			}
			// Invoked again (reinvocationPolicy IfNeeded): nothing more.
			if again, patched := review(t, s, out); patched {
				t.Errorf("a second review patched again:\n%s\n→ %s", out, again)
			}
		})
	}
}

func TestZoneValue(t *testing.T) {
	for _, tc := range []struct{ zone, format, want string }{
		{"cn-bj-a", ZoneFormatCCE, "zoneA"},
		{"cn-gz-c", ZoneFormatCCE, "zoneC"},
		{"zoneB", ZoneFormatCCE, "zoneB"},
		{"cn-bj-1", ZoneFormatCCE, "cn-bj-1"},
		{"cn-bj-", ZoneFormatCCE, "cn-bj-"},
		{"weird", ZoneFormatCCE, "weird"},
		{"cn-bj-a", ZoneFormatRaw, "cn-bj-a"},
	} {
		if got := zoneValue(tc.zone, tc.format); got != tc.want {
			t.Errorf("zoneValue(%q, %s) = %q, want %q", tc.zone, tc.format, got, tc.want)
		}
	}
}

func TestServer_ReviewPod_RawZonesAndLabel(t *testing.T) {
	s := newTestServer(t, podWorld())
	s.cfg.ZoneFormat, s.cfg.ZoneLabel = ZoneFormatRaw, "failure-domain.beta.kubernetes.io/zone"
	out, _ := review(t, s, []byte(`{"metadata":{"name":"p","labels":{"app":"web"}},"spec":{"containers":[{"name":"c"}]}}`))
	e := decodePod(t, out).Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0]
	if e.Key != "failure-domain.beta.kubernetes.io/zone" || !slices.Equal(e.Values, []string{"cn-bj-a", "cn-bj-b"}) {
		t.Fatalf("expression %+v", e)
	}
}
