package suite

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/kubeletsim"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/psts"
)

// PSTS workloads. No admission webhook runs in the suites, so the helpers
// leave objects as the PSTS webhooks would: the validating webhook creates
// the Subnet resource of every subnet a PSTS lists (enabled, from
// DescribeSubnet) and marks it exclusive for Fixed, Manual and Custom; the
// mutating webhook annotates a selected pod with its PSTS, gives it a
// request for one cce.baidubce.com/ip and a node affinity on the subnets'
// zone.

// CreatePSTSSubnet creates a subnet of the fleet's VPC and zone in bce-sim
// and its Subnet resource, enabled, exclusive when asked (the strategy
// picks addresses itself: Fixed, Manual, Custom). The Subnet resource is
// deleted when the test ends (bce-sim's subnet goes with the fleet).
func CreatePSTSSubnet(ctx context.Context, t testing.TB, f *fleet.Fleet, id, cidr string, exclusive bool) {
	t.Helper()
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		t.Fatalf("PSTS subnet %s: %v", id, err)
	}
	if err := f.AddSubnet(ctx, id, cidr); err != nil {
		t.Fatalf("create subnet %s in bce-sim: %v", id, err)
	}
	subnets := f.CCE.CceV1alpha1().Subnets(cce.SubnetNamespace)
	_, err = subnets.Create(ctx, &cce.Subnet{
		ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: cce.SubnetNamespace},
		Spec:       cce.SubnetSpec{ID: id, Name: id, AvailabilityZone: fleet.Zone, CIDR: cidr, Exclusive: exclusive},
		// What DescribeSubnet says of a new subnet: all but the reserved
		// addresses (the first two and the last) are available.
		Status: cce.SubnetStatus{Enable: true, AvailableIPNum: 1<<(p.Addr().BitLen()-p.Bits()) - 3},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Subnet %s: %v", id, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := subnets.Delete(ctx, id, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete Subnet %s: %v", id, err)
		}
	})
}

// CreatePSTS creates a PodSubnetTopologySpread named name in ns that selects
// the pods labelled app=name, with one strategy for all of its subnets
// (spec.strategy, which overrides theirs).
func CreatePSTS(ctx context.Context, t testing.TB, f *fleet.Fleet, ns, name string, strategy cce.IPAllocationStrategy,
	subnets map[string]cce.SubnetAllocation) *cce.PodSubnetTopologySpread {
	t.Helper()
	p, err := f.CCE.CceV1alpha1().PodSubnetTopologySpreads(ns).Create(ctx, &cce.PodSubnetTopologySpread{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: cce.PodSubnetTopologySpreadSpec{
			Name: name, Subnets: subnets, Strategy: &strategy,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create PodSubnetTopologySpread %s: %v", name, err)
	}
	return p
}

// PSTSTemplate is a pod template of the fleet's pause pods labelled
// app=<pstsName>, as the mutating webhook leaves it (see PSTSMutate).
func PSTSTemplate(f *fleet.Fleet, pstsName string) corev1.PodTemplateSpec {
	tpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": pstsName}},
		Spec:       PodSpec(f),
	}
	PSTSMutate(&tpl.ObjectMeta, &tpl.Spec, pstsName)
	return tpl
}

// PSTSMutate does what the PSTS mutating webhook does to a pod it selects:
// the annotation naming its PSTS, a request (and limit) of one
// cce.baidubce.com/ip on the first container, and a required node affinity
// on the zone of the PSTS's subnets (the fleet's).
func PSTSMutate(meta *metav1.ObjectMeta, spec *corev1.PodSpec, pstsName string) {
	if meta.Annotations == nil {
		meta.Annotations = map[string]string{}
	}
	meta.Annotations[cce.AnnotationPodSubnetTopologySpread] = pstsName
	one := resource.MustParse("1")
	c := &spec.Containers[0]
	if c.Resources.Requests == nil {
		c.Resources.Requests = corev1.ResourceList{}
	}
	if c.Resources.Limits == nil {
		c.Resources.Limits = corev1.ResourceList{}
	}
	c.Resources.Requests[cce.ResourceIP], c.Resources.Limits[cce.ResourceIP] = one, one
	spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: kubeletsim.LabelZone, Operator: corev1.NodeSelectorOpIn, Values: []string{fleet.Zone},
			}},
		}}},
	}}
}

// CreatePSTSPod creates a bare pod of the PSTS (see PSTSTemplate).
func CreatePSTSPod(ctx context.Context, t testing.TB, f *fleet.Fleet, ns, name, pstsName string) {
	t.Helper()
	tpl := PSTSTemplate(f, pstsName)
	_, err := f.Kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: tpl.Labels, Annotations: tpl.Annotations},
		Spec:       tpl.Spec,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create PSTS pod %s: %v", name, err)
	}
}

// CreatePSTSDeployment creates a Deployment of the PSTS's pods, named after
// it.
func CreatePSTSDeployment(ctx context.Context, t testing.TB, f *fleet.Fleet, ns, pstsName string, replicas int) {
	t.Helper()
	tpl := PSTSTemplate(f, pstsName)
	_, err := f.Kube.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: pstsName},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(replicas)),
			Selector: &metav1.LabelSelector{MatchLabels: tpl.Labels}, Template: tpl},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create deployment %s: %v", pstsName, err)
	}
}

// CreatePSTSStatefulSet creates a StatefulSet (parallel pod management) of
// the PSTS's pods, named after it; adjust, when given, changes the pod
// template (e.g. a scheduler the test plays).
func CreatePSTSStatefulSet(ctx context.Context, t testing.TB, f *fleet.Fleet, ns, pstsName string, replicas int,
	adjust func(*corev1.PodTemplateSpec)) {
	t.Helper()
	tpl := PSTSTemplate(f, pstsName)
	if adjust != nil {
		adjust(&tpl)
	}
	_, err := f.Kube.AppsV1().StatefulSets(ns).Create(ctx, &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: pstsName},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To(int32(replicas)),
			Selector: &metav1.LabelSelector{MatchLabels: tpl.Labels}, PodManagementPolicy: appsv1.ParallelPodManagement,
			Template: tpl},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create statefulset %s: %v", pstsName, err)
	}
}

// InRanges fails the test unless every pod's IP lies in one of ranges, and
// returns the pods' IPs by name (IPs checks they are distinct).
func InRanges(t testing.TB, pods []corev1.Pod, ranges ...psts.Range) map[string]string {
	t.Helper()
	ips := IPs(t, pods)
	for name, ip := range ips {
		a, err := netip.ParseAddr(ip)
		in := false
		for _, r := range ranges {
			in = in || (err == nil && r.Contains(a))
		}
		if !in {
			t.Errorf("pod %s has %s, outside %v", name, ip, ranges)
		}
	}
	return ips
}

// CIDRRange is the usable range of a subnet: without its first two
// addresses and its last, which BCE and the IPAM never give out.
func CIDRRange(cidr string) psts.Range {
	r := psts.PrefixRange(netip.MustParsePrefix(cidr))
	return psts.Range{First: r.First.Next().Next(), Last: r.Last.Prev()}
}

// WaitClaims waits until the IPClaims of exactly the given addresses are
// held by the pods named with them (ns/name by address), and fails on
// timeout with what it saw.
func WaitClaims(ctx context.Context, t testing.TB, f *fleet.Fleet, ns string, held map[string]string) {
	t.Helper()
	var last string
	for {
		ok := true
		last = ""
		for ip, pod := range held {
			a, err := netip.ParseAddr(ip)
			if err != nil {
				t.Fatalf("claim of %q: %v", ip, err)
			}
			c, err := f.CCE.CceV1alpha1().IPClaims().Get(ctx, cce.ClaimName(a), metav1.GetOptions{})
			switch {
			case err != nil:
				ok, last = false, fmt.Sprintf("claim %s: %v", ip, err)
			case c.Spec.Holder == nil || c.Spec.Holder.Namespace != ns || c.Spec.Holder.Name != pod:
				ok, last = false, fmt.Sprintf("claim %s held by %+v, want %s/%s", ip, c.Spec.Holder, ns, pod)
			}
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for the IPClaims of %v: %v (last: %s)", held, ctx.Err(), last)
		case <-time.After(300 * time.Millisecond):
		}
	}
}
