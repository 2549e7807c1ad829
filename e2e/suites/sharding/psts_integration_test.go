//go:build integration

package sharding_test

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8snet "k8s.io/utils/net"

	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/invariants"
	"github.com/cce-ipam/sharded/e2e/kubeletsim"
	"github.com/cce-ipam/sharded/e2e/suites/suite"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/psts"
)

// A PSTS Fixed StatefulSet's pods and a custom-reuse pod run on a node of
// one replica; deleted, they come back (the StatefulSet controller, the
// test for the bare pod) on a node another replica serves, each with its
// address, still held by its IPClaim; the invariant checker (I7 included)
// then finds the cluster clean.
func TestPSTS_AddressesFollowPodsAcrossReplicas(t *testing.T) {
	if !env.Local() {
		t.Fatal("the sharding suite starts replica processes: run it locally (make e2e), not against kind")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	f := env.Fleet(t, fleet.Options{Name: "pstsmove", Replicas: 2, Nodes: 6})
	suite.WaitSharded(ctx, t, f)
	from, to := nodesOfTwoReplicas(ctx, t, f)
	ns := suite.Namespace(t, f.Kube)

	const fixedSubnet, reuseSubnet = "sbn-pstsmove-fixed", "sbn-pstsmove-reuse"
	suite.CreatePSTSSubnet(ctx, t, f, fixedSubnet, "10.62.0.0/24", true)
	suite.CreatePSTSSubnet(ctx, t, f, reuseSubnet, "10.63.0.0/24", true)
	suite.CreatePSTS(ctx, t, f, ns, "pfixed", cce.IPAllocationStrategy{Type: cce.IPAllocTypeFixed},
		map[string]cce.SubnetAllocation{fixedSubnet: {IPv4Range: []string{"10.62.0.64/28"}}})
	suite.CreatePSTS(ctx, t, f, ns, "preuse", cce.IPAllocationStrategy{Type: cce.IPAllocTypeCustom, EnableReuseIPAddress: true},
		map[string]cce.SubnetAllocation{reuseSubnet: {Custom: []cce.CustomAllocation{{Family: k8snet.IPv4,
			CustomIPRange: []cce.CustomIPRange{{Start: "10.63.0.10", End: "10.63.0.20"}}}}}})
	manual := func(tpl *corev1.PodTemplateSpec) { tpl.Spec.SchedulerName = kubeletsim.ManualScheduler }
	suite.CreatePSTSStatefulSet(ctx, t, f, ns, "pfixed", 2, manual)
	reuse := func() {
		tpl := suite.PSTSTemplate(f, "preuse")
		manual(&tpl)
		if _, err := f.Kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "preuse-0", Labels: tpl.Labels, Annotations: tpl.Annotations},
			Spec:       tpl.Spec,
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	reuse()
	const all = "app in (pfixed,preuse)"
	bindAll(ctx, t, f, ns, all, 3, from)
	before := suite.WaitPods(ctx, t, f.Kube, ns, all, 3)
	ips := suite.IPs(t, before)
	for _, p := range before {
		r := psts.Range{First: netip.MustParseAddr("10.62.0.64"), Last: netip.MustParseAddr("10.62.0.79")}
		if p.Name == "preuse-0" {
			r = psts.Range{First: netip.MustParseAddr("10.63.0.10"), Last: netip.MustParseAddr("10.63.0.20")}
		}
		suite.InRanges(t, []corev1.Pod{p}, r)
	}
	held := map[string]string{}
	for name, ip := range ips {
		held[ip] = name
	}
	suite.WaitClaims(ctx, t, f, ns, held)
	t.Logf("on %s: %v", from, ips)

	for _, p := range before {
		if err := f.Kube.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The bare pod is created again once it is gone, as its controller
	// would; the StatefulSet controller brings the others back.
	for {
		_, err := f.Kube.CoreV1().Pods(ns).Get(ctx, "preuse-0", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("preuse-0 was not removed: %v", ctx.Err())
		case <-time.After(300 * time.Millisecond):
		}
	}
	reuse()
	uids := map[string]bool{}
	for _, p := range before {
		uids[string(p.UID)] = true
	}
	bindAll(ctx, t, f, ns, all, 3, to)
	after := suite.WaitPods(ctx, t, f.Kube, ns, all, 3, func(ps []corev1.Pod) bool {
		for _, p := range ps {
			if uids[string(p.UID)] {
				return false
			}
		}
		return true
	})
	for name, ip := range suite.IPs(t, after) {
		if ips[name] != ip {
			t.Errorf("%s came back on %s (another replica's node) with %s, want its address %s", name, to, ip, ips[name])
		}
	}
	for _, p := range after {
		if p.Spec.NodeName != to {
			t.Errorf("%s runs on %s, bound to %s", p.Name, p.Spec.NodeName, to)
		}
	}
	suite.WaitClaims(ctx, t, f, ns, held)
	t.Logf("on %s: %v", to, ips)

	chk, err := f.Checker(invariants.Config{Namespaces: []string{ns}, OrphanGrace: 30 * time.Second, WEPAddresses: true,
		GhostGrace: 30 * time.Second, Claims: true, ClaimGrace: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()
	if vs, err := chk.WaitClean(wctx, 2*time.Second); err != nil {
		t.Fatalf("invariants: %v\n%s", err, vs)
	}
}

// nodesOfTwoReplicas returns a node of one replica and a node of another.
func nodesOfTwoReplicas(ctx context.Context, t *testing.T, f *fleet.Fleet) (string, string) {
	t.Helper()
	// Under load a hand-over may still be under way after the fleet looked
	// settled (one replica releasing what the other takes): ask again for
	// up to a minute until two replicas serve nodes.
	deadline := time.Now().Add(time.Minute)
	for {
		by := map[int][]string{}
		var lastErr error
		for _, n := range f.Nodes() {
			i, err := f.NodeOwner(ctx, n) // between owners: the loop asks again
			if err != nil {
				lastErr = err
				break
			}
			by[i] = append(by[i], n)
		}
		var owners []int
		for i, ns := range by {
			sort.Strings(ns)
			owners = append(owners, i)
		}
		sort.Ints(owners)
		if lastErr == nil && len(owners) >= 2 {
			return by[owners[0]][0], by[owners[1]][0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no two replicas serve nodes after a minute: %v (%v)", by, lastErr)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// bindAll binds the unscheduled pods selector selects to node until n of
// them are bound there.
func bindAll(ctx context.Context, t *testing.T, f *fleet.Fleet, ns, selector string, n int, node string) {
	t.Helper()
	var last string
	for {
		list, err := f.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		bound := 0
		if err == nil {
			for _, p := range list.Items {
				switch {
				case p.DeletionTimestamp != nil:
				case p.Spec.NodeName == node:
					bound++
				case p.Spec.NodeName == "":
					_ = f.Kube.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{
						ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: ns, UID: p.UID},
						Target:     corev1.ObjectReference{Kind: "Node", Name: node},
					}, metav1.CreateOptions{})
				}
			}
			last = fmt.Sprintf("%d of %d bound to %s", bound, len(list.Items), node)
		} else {
			last = err.Error()
		}
		if bound == n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("binding %q to %s: %v (last: %s)", selector, node, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
