//go:build integration

package invariants_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/e2e/cluster"
	"github.com/cce-ipam/sharded/e2e/invariants"
	"github.com/cce-ipam/sharded/e2e/kubeletsim"
	"github.com/cce-ipam/sharded/e2e/kubeletsim/stack"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

var cp *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.RunTests(m, cluster.Options{}, &cp))
}

// runPods brings up a stack with running pods and returns it with the pods.
func runPods(t *testing.T, name string, nodes, n int) (*stack.Stack, []corev1.Pod) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cp.InstallCRDs(ctx, filepath.Join("..", "..", "charts", "cce-ipam", "crds")); err != nil {
		t.Fatal(err)
	}
	st := stack.Start(t, cp.Config, stack.Options{Name: name, Nodes: nodes, Namespace: cp.Namespace(t)})
	for k := range n {
		_, err := st.Kube.CoreV1().Pods(st.Opts.Namespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", k)},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	var pods []corev1.Pod
	stack.Eventually(t, 60*time.Second, "pods Running", func() (bool, string) {
		list, err := st.Kube.CoreV1().Pods(st.Opts.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		pods = list.Items
		running := 0
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				running++
			}
		}
		return running == n, fmt.Sprintf("%d/%d", running, n)
	})
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return cmpStr(a.Name, b.Name) })
	return st, pods
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func setPodIP(t *testing.T, st *stack.Stack, name, ip string) {
	t.Helper()
	ctx := context.Background()
	p, err := st.Kube.CoreV1().Pods(st.Opts.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.PodIP, p.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
	if _, err := st.Kube.CoreV1().Pods(st.Opts.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// find returns the violations of kind k that involve pod (or wep) name.
func find(vs invariants.Violations, k invariants.Kind, match func(v invariants.Violation) bool) invariants.Violations {
	var out invariants.Violations
	for _, v := range vs.Of(k) {
		if match(v) {
			out = append(out, v)
		}
	}
	return out
}

// The checker finds nothing in a healthy cluster, and then each kind of
// violation, built by hand, with the objects involved.
func TestChecker_Check_FindsEveryKind(t *testing.T) {
	st, pods := runPods(t, "kinds", 2, 6)
	ns := st.Opts.Namespace
	ctx := context.Background()
	bounds := &invariants.PoolBounds{Min: 0, Max: 10}
	chk := st.Checker(invariants.Config{Namespaces: []string{ns}, Pool: bounds})
	if vs, err := chk.Check(ctx); err != nil || len(vs) > 0 {
		t.Fatalf("healthy cluster: err=%v\n%s", err, vs)
	}

	// Pods a0-a2 run on one node, b0-b2 on the other (least-loaded
	// placement alternates).
	byNode := map[string][]corev1.Pod{}
	for _, p := range pods {
		byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
	}
	a, b := byNode[st.Nodes[0].Name], byNode[st.Nodes[1].Name]
	if len(a) != 3 || len(b) != 3 {
		t.Fatalf("pods not spread 3+3: %d+%d", len(a), len(b))
	}
	pods = []corev1.Pod{a[0], a[1], a[2], b[0], b[1]}

	// (a) a1 claims a0's IP (also (b): it disagrees with its wep).
	setPodIP(t, st, pods[1].Name, pods[0].Status.PodIP)
	// (b) a2's wep is gone.
	wepc := st.CCE.CceV1alpha1().WorkloadEndpoints(ns)
	w, err := wepc.Get(ctx, pods[2].Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.Finalizers = nil
	if _, err := wepc.Update(ctx, w, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wepc.Delete(ctx, w.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// (b) b0 runs with an IP the cloud never gave its node (nor its wep).
	setPodIP(t, st, pods[3].Name, "192.0.2.77")
	// (c) a wep without a pod.
	_, err = wepc.Create(ctx, &cce.WorkloadEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "ghost", Labels: map[string]string{cce.LabelSubnetID: st.SubnetID}},
		Spec:       cce.WorkloadEndpointSpec{IP: "10.1.15.200", Node: pods[0].Spec.NodeName, ContainerID: "c0ffee", Type: cce.WorkloadEndpointTypePod},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// (d) 20 extra cloud IPs on b1's node's ENI that nobody assigned.
	leakNode := pods[4].Spec.NodeName
	var eniID string
	for _, n := range st.Nodes {
		if n.Name == leakNode {
			eniID = n.ENIID
		}
	}
	for range 2 {
		if _, err := st.Cloud.BatchAddPrivateIPs(ctx, eniID, cloud.BatchAddRequest{Count: 10}); err != nil {
			t.Fatal(err)
		}
	}

	vs, err := chk.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("found:\n%s", vs)
	pod := func(name string) func(invariants.Violation) bool {
		return func(v invariants.Violation) bool { return slices.Contains(v.Pods, ns+"/"+name) }
	}
	want := []struct {
		kind  invariants.Kind
		match func(invariants.Violation) bool
	}{
		{invariants.KindDuplicateIP, func(v invariants.Violation) bool {
			return v.IP == pods[0].Status.PodIP && slices.Equal(v.Pods, []string{ns + "/" + pods[0].Name, ns + "/" + pods[1].Name})
		}},
		{invariants.KindWEPMismatch, pod(pods[1].Name)},
		{invariants.KindMissingWEP, pod(pods[2].Name)},
		{invariants.KindWEPMismatch, pod(pods[3].Name)},
		{invariants.KindIPNotOnNode, func(v invariants.Violation) bool {
			return pod(pods[3].Name)(v) && v.IP == "192.0.2.77" && v.Node == pods[3].Spec.NodeName
		}},
		{invariants.KindOrphanWEP, func(v invariants.Violation) bool { return v.WEP == ns+"/ghost" }},
		{invariants.KindLeakedIPs, func(v invariants.Violation) bool { return v.Node == leakNode && len(v.IdleIPs) > bounds.Max }},
	}
	for _, w := range want {
		if got := find(vs, w.kind, w.match); len(got) != 1 {
			t.Errorf("want exactly one matching %s, got %d", w.kind, len(got))
		}
	}
	if len(vs) != len(want) {
		t.Errorf("got %d violations, want %d (no others)", len(vs), len(want))
	}

	// The BCE API view (ListENIs, paginated) sees the same cloud as Dump.
	viaAPI, err := invariants.New(invariants.Config{Namespaces: []string{ns}, Pool: bounds,
		NodeSelector: labels.SelectorFromSet(labels.Set{kubeletsim.LabelSimulator: st.Opts.Name})},
		st.Kube, st.CCE, invariants.ProviderView(st.Cloud, st.VPCID, st.ClusterID+"/"))
	if err != nil {
		t.Fatal(err)
	}
	// (The idle lists may differ if a pool worker acted in between.)
	if vs2, err := viaAPI.Check(ctx); err != nil || fmt.Sprint(vs2.Kinds()) != fmt.Sprint(vs.Kinds()) {
		t.Errorf("ProviderView disagrees with SimView (err=%v):\n%s\nvs\n%s", err, vs2, vs)
	}

	// A pool minimum no node reaches.
	strict := st.Checker(invariants.Config{Namespaces: []string{ns}, Pool: &invariants.PoolBounds{Min: 100, Max: 200}})
	vs, err = strict.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := vs.Of(invariants.KindPoolBelowMin); len(got) != len(st.Nodes) {
		t.Errorf("want PoolBelowMin on all %d nodes, got\n%s", len(st.Nodes), vs)
	}
}

// An orphaned wep is reported only once it outlived the grace, measured
// across checks; a pod deleted meanwhile is not a finding.
func TestChecker_Check_OrphanGrace(t *testing.T) {
	st, pods := runPods(t, "grace", 1, 1)
	ns := st.Opts.Namespace
	ctx := context.Background()
	now := time.Unix(1_000_000, 0)
	chk := st.Checker(invariants.Config{Namespaces: []string{ns}, OrphanGrace: time.Minute, Now: func() time.Time { return now }})
	_, err := st.CCE.CceV1alpha1().WorkloadEndpoints(ns).Create(ctx, &cce.WorkloadEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "late"},
		Spec:       cce.WorkloadEndpointSpec{IP: "10.1.15.201", Node: pods[0].Spec.NodeName},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		advance time.Duration
		want    int
	}{{0, 0}, {59 * time.Second, 0}, {time.Second, 1}} {
		now = now.Add(step.advance)
		vs, err := chk.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(vs.Of(invariants.KindOrphanWEP)); got != step.want || len(vs) != step.want {
			t.Fatalf("after %s: want %d OrphanWEP, got\n%s", step.advance, step.want, vs)
		}
	}
}

// (d) and (g) on a real API server and bce-sim: a cross-subnet address of
// an exclusive subnet on a node's ENI is leaked until a wep names it,
// unclaimed until its claim is held by the wep's pod, and a PSTS pod whose
// address is outside its PSTS's subnets is reported. The node is one the
// stack's IPAM does not serve, so nothing but the test touches its ENI.
func TestChecker_Check_ClaimsAndCrossSubnet(t *testing.T) {
	st, pods := runPods(t, "claims", 1, 1)
	ns := st.Opts.Namespace
	ctx := context.Background()
	extra, err := st.Kubelet.RegisterNodes(ctx, []string{"claims-extra"})
	if err != nil || len(extra) != 1 {
		t.Fatalf("register the unserved node: %v", err)
	}
	t.Cleanup(func() {
		_ = st.Kube.CoreV1().Nodes().Delete(context.Background(), "claims-extra", metav1.DeleteOptions{})
	})
	node, eniID := extra[0].Name, extra[0].ENIID
	const subnetID, ip = "sbn-claims-x", "10.77.0.10"
	if _, err := st.BCE.AddSubnet(bcesim.SubnetSpec{ID: subnetID, ZoneName: st.Zone, CIDR: "10.77.0.0/24", VPCID: st.VPCID}); err != nil {
		t.Fatal(err)
	}
	subnets := st.CCE.CceV1alpha1().Subnets(cce.SubnetNamespace)
	if _, err := subnets.Create(ctx, &cce.Subnet{ObjectMeta: metav1.ObjectMeta{Name: subnetID},
		Spec:   cce.SubnetSpec{ID: subnetID, CIDR: "10.77.0.0/24", AvailabilityZone: st.Zone, Exclusive: true},
		Status: cce.SubnetStatus{Enable: true}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = subnets.Delete(context.Background(), subnetID, metav1.DeleteOptions{}) })
	chk := st.Checker(invariants.Config{Namespaces: []string{ns}, OrphanGrace: time.Hour, WEPAddresses: true, Claims: true,
		Pool: &invariants.PoolBounds{Min: 0, Max: 10}})
	step := func(what string, want ...invariants.Kind) {
		t.Helper()
		vs, err := chk.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := vs.Kinds()
		ok := len(vs) == len(want)
		for _, k := range want {
			ok = ok && got[k] == 1
		}
		if !ok {
			t.Fatalf("%s: want one each of %v, got\n%s", what, want, vs)
		}
	}
	step("healthy")

	added, err := st.Cloud.BatchAddPrivateIPsCrossSubnet(ctx, eniID, cloud.CrossSubnetAddRequest{SubnetID: subnetID, IPs: []string{ip}})
	if err != nil || len(added) != 1 || added[0] != ip {
		t.Fatalf("cross-subnet add: %v %v", added, err)
	}
	step("an exclusive address on the ENI, no wep, no claim", invariants.KindLeakedCrossSubnetIP, invariants.KindUnclaimedIP)

	wepc := st.CCE.CceV1alpha1().WorkloadEndpoints(ns)
	if _, err := wepc.Create(ctx, &cce.WorkloadEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "fixed-0", Labels: map[string]string{cce.LabelSubnetID: subnetID}},
		Spec: cce.WorkloadEndpointSpec{IP: ip, Node: node, ENIID: eniID, SubnetID: subnetID, ContainerID: "c0ffee",
			Type: cce.WorkloadEndpointTypeStatefulSet, EnableFixIP: cce.EnableFixIPTrue, SubnetTopologyReference: "spread"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	step("named by a wep, no claim", invariants.KindUnclaimedWEP, invariants.KindUnclaimedIP)

	claims := st.CCE.CceV1alpha1().IPClaims()
	c, err := claims.Create(ctx, &cce.IPClaim{ObjectMeta: metav1.ObjectMeta{Name: ip},
		Spec: cce.IPClaimSpec{SubnetID: subnetID, IP: ip, Holder: &cce.IPClaimHolder{Namespace: ns, Name: "other"}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = claims.Delete(context.Background(), ip, metav1.DeleteOptions{}) })
	step("its claim held by another pod", invariants.KindUnclaimedWEP)
	c.Spec.Holder.Name = "fixed-0"
	if _, err := claims.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	step("its claim held by the wep's pod")

	// A Running pod of the stack, annotated for a PSTS of the exclusive
	// subnet: its address is the node subnet's.
	if _, err := st.CCE.CceV1alpha1().PodSubnetTopologySpreads(ns).Create(ctx, &cce.PodSubnetTopologySpread{
		ObjectMeta: metav1.ObjectMeta{Name: "spread"},
		Spec: cce.PodSubnetTopologySpreadSpec{Subnets: map[string]cce.SubnetAllocation{subnetID: {
			IPAllocationStrategy: cce.IPAllocationStrategy{Type: cce.IPAllocTypeFixed}}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p, err := st.Kube.CoreV1().Pods(ns).Get(ctx, pods[0].Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Annotations = map[string]string{cce.AnnotationPodSubnetTopologySpread: "spread"}
	if _, err := st.Kube.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	step("a PSTS pod outside its PSTS's subnets", invariants.KindOutsidePSTS)
}
