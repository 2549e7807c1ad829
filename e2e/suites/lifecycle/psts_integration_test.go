//go:build integration

package lifecycle_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8snet "k8s.io/utils/net"

	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/suites/suite"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/psts"
)

// PSTS subnets of the lifecycle fleet (its nodes' subnet is 10.20.0.0/16).
const (
	elasticSubnet, elasticCIDR = "sbn-life-elastic", "10.61.0.0/24"
	fixedSubnet, fixedCIDR     = "sbn-life-fixed", "10.62.0.0/24"
	fixedRange                 = "10.62.0.32/28"
	customSubnet, customCIDR   = "sbn-life-custom", "10.63.0.0/24"
)

// lifecyclePSTS runs the three kinds of PSTS workload, each in a namespace
// of its own (ns), on subnets whose Subnet resources live as long as the
// lifecycle test (top), so that the final invariant check still knows them
// as exclusive.
func lifecyclePSTS(ctx context.Context, t *testing.T, top *testing.T, f *fleet.Fleet, ns func(*testing.T) string) {
	suite.CreatePSTSSubnet(ctx, top, f, elasticSubnet, elasticCIDR, false)
	suite.CreatePSTSSubnet(ctx, top, f, fixedSubnet, fixedCIDR, true)
	suite.CreatePSTSSubnet(ctx, top, f, customSubnet, customCIDR, true)

	// Elastic: the cloud picks addresses of a shared subnet; a Deployment
	// scaled up and down, and to zero, frees them with their weps.
	t.Run("ElasticDeployment", func(t *testing.T) {
		ns := ns(t)
		suite.CreatePSTS(ctx, t, f, ns, "elastic", cce.IPAllocationStrategy{Type: cce.IPAllocTypeElastic},
			map[string]cce.SubnetAllocation{elasticSubnet: {}})
		in := suite.CIDRRange(elasticCIDR)
		suite.CreatePSTSDeployment(ctx, t, f, ns, "elastic", 6)
		suite.InRanges(t, suite.WaitPods(ctx, t, f.Kube, ns, "app=elastic", 6), in)
		suite.ScaleDeployment(ctx, t, f.Kube, ns, "elastic", 12)
		pods := suite.WaitPods(ctx, t, f.Kube, ns, "app=elastic", 12)
		suite.InRanges(t, pods, in)
		weps := suite.WaitWEPs(ctx, t, f.CCE, ns, 12)
		for _, p := range pods {
			w := weps[p.Name]
			if w.Spec.IP != p.Status.PodIP || w.Spec.SubnetID != elasticSubnet || w.Spec.ENISubnetID != f.SubnetID ||
				w.Spec.SubnetTopologyReference != "elastic" || w.Spec.Type != cce.WorkloadEndpointTypePod {
				t.Errorf("pod %s (%s): WorkloadEndpoint %+v", p.Name, p.Status.PodIP, w.Spec)
			}
		}
		suite.ScaleDeployment(ctx, t, f.Kube, ns, "elastic", 3)
		suite.InRanges(t, suite.WaitPods(ctx, t, f.Kube, ns, "app=elastic", 3), in)
		suite.ScaleDeployment(ctx, t, f.Kube, ns, "elastic", 0)
		suite.WaitPods(ctx, t, f.Kube, ns, "app=elastic", 0)
		suite.WaitWEPs(ctx, t, f.CCE, ns, 0)
	})

	// Fixed: a StatefulSet's pods get addresses of the PSTS's range, held
	// in IPClaims by the pods' names, and the same ones after a rolling
	// restart; scaled down and deleted, the StatefulSet lets them go.
	t.Run("FixedStatefulSet", func(t *testing.T) {
		ns := ns(t)
		suite.CreatePSTS(ctx, t, f, ns, "fixed", cce.IPAllocationStrategy{Type: cce.IPAllocTypeFixed,
			ReleaseStrategy: cce.ReleaseStrategyTTL}, map[string]cce.SubnetAllocation{fixedSubnet: {IPv4Range: []string{fixedRange}}})
		in := psts.PrefixRange(mustPrefix(fixedRange))
		suite.CreatePSTSStatefulSet(ctx, t, f, ns, "fixed", 3, nil)
		before := suite.WaitPods(ctx, t, f.Kube, ns, "app=fixed", 3)
		ips := suite.InRanges(t, before, in)
		suite.WaitClaims(ctx, t, f, ns, invert(ips))
		weps := suite.WaitWEPs(ctx, t, f.CCE, ns, 3)
		for name, w := range weps {
			if !w.IsFixedStatefulSet() || w.Labels[cce.LabelOwner] != "fixed" || w.Spec.SubnetID != fixedSubnet {
				t.Errorf("%s: want a fixed StatefulSet WorkloadEndpoint of %s owned by fixed, got %+v %v", name, fixedSubnet, w.Spec, w.Labels)
			}
		}
		uids := map[string]string{}
		for _, p := range before {
			uids[p.Name] = string(p.UID)
		}
		suite.RolloutRestartStatefulSet(ctx, t, f.Kube, ns, "fixed")
		after := suite.WaitPods(ctx, t, f.Kube, ns, "app=fixed", 3, replaced(uids))
		for name, ip := range suite.InRanges(t, after, in) {
			if ips[name] != ip {
				t.Errorf("%s came back with %s after a rolling restart, want its PSTS Fixed address %s", name, ip, ips[name])
			}
		}
		t.Logf("rolling restart kept %v", ips)
		suite.ScaleStatefulSet(ctx, t, f.Kube, ns, "fixed", 1)
		suite.WaitPods(ctx, t, f.Kube, ns, "app=fixed", 1)
		if w := suite.WaitWEPs(ctx, t, f.CCE, ns, 1)["fixed-0"]; w.Spec.IP != ips["fixed-0"] {
			t.Errorf("fixed-0's WorkloadEndpoint %+v, want IP %s", w.Spec, ips["fixed-0"])
		}
		if err := f.Kube.AppsV1().StatefulSets(ns).Delete(ctx, "fixed", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		suite.WaitPods(ctx, t, f.Kube, ns, "app=fixed", 0)
		suite.WaitWEPs(ctx, t, f.CCE, ns, 0)
	})

	// Custom with reuse: a pod recreated under its name gets its address
	// back; once the PSTS is deleted, the kept addresses are freed.
	t.Run("CustomReuse", func(t *testing.T) {
		ns := ns(t)
		ttl := metav1.Duration{Duration: time.Hour}
		suite.CreatePSTS(ctx, t, f, ns, "reuse", cce.IPAllocationStrategy{Type: cce.IPAllocTypeCustom,
			EnableReuseIPAddress: true, TTL: &ttl}, map[string]cce.SubnetAllocation{customSubnet: {Custom: []cce.CustomAllocation{{
			Family: k8snet.IPv4, CustomIPRange: []cce.CustomIPRange{{Start: "10.63.0.100", End: "10.63.0.119"}}}}}})
		in := psts.Range{First: mustAddr("10.63.0.100"), Last: mustAddr("10.63.0.119")}
		for _, n := range []string{"reuse-a", "reuse-b", "reuse-c"} {
			suite.CreatePSTSPod(ctx, t, f, ns, n, "reuse")
		}
		ips := suite.InRanges(t, suite.WaitPods(ctx, t, f.Kube, ns, "app=reuse", 3), in)
		suite.WaitClaims(ctx, t, f, ns, invert(ips))
		// reuse-b goes and comes back under its name.
		if err := f.Kube.CoreV1().Pods(ns).Delete(ctx, "reuse-b", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		suite.WaitPods(ctx, t, f.Kube, ns, "app=reuse", 2)
		if w := suite.WaitWEPs(ctx, t, f.CCE, ns, 3)["reuse-b"]; !w.IsCustomReuse() || w.Spec.IP != ips["reuse-b"] {
			t.Errorf("reuse-b's kept WorkloadEndpoint: %+v", w.Spec)
		}
		suite.CreatePSTSPod(ctx, t, f, ns, "reuse-b", "reuse")
		again := suite.InRanges(t, suite.WaitPods(ctx, t, f.Kube, ns, "app=reuse", 3), in)
		if again["reuse-b"] != ips["reuse-b"] {
			t.Errorf("reuse-b came back with %s, want its address %s", again["reuse-b"], ips["reuse-b"])
		}
		// Every pod goes: the addresses stay reserved (kept weps) until
		// the PSTS goes.
		if err := f.Kube.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: "app=reuse"}); err != nil {
			t.Fatal(err)
		}
		suite.WaitPods(ctx, t, f.Kube, ns, "app=reuse", 0)
		suite.WaitClaims(ctx, t, f, ns, invert(ips))
		if err := f.CCE.CceV1alpha1().PodSubnetTopologySpreads(ns).Delete(ctx, "reuse", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		suite.WaitWEPs(ctx, t, f.CCE, ns, 0)
	})
}

func invert(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[v] = k
	}
	return out
}

// replaced: every pod has a UID other than the one recorded.
func replaced(uids map[string]string) func([]corev1.Pod) bool {
	return func(ps []corev1.Pod) bool {
		for _, p := range ps {
			if uids[p.Name] == string(p.UID) {
				return false
			}
		}
		return true
	}
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
