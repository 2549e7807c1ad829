//go:build integration

package migration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/cce-ipam/sharded/e2e/cluster"
	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/suites/suite"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

var (
	cp         *cluster.Cluster
	installRef sync.Once
	installErr error
)

// No kube-controller-manager: the tests use bare pods, bound by the kubelet
// simulator.
func TestMain(m *testing.M) { os.Exit(cluster.RunTests(m, cluster.Options{}, &cp)) }

// referenceCRDs installs the reference's schema-less CRDs, once.
func referenceCRDs(t testing.TB) {
	t.Helper()
	installRef.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		installErr = cp.InstallCRDs(ctx, filepath.Join("testdata", "reference-crds"))
	})
	if installErr != nil {
		t.Fatal(installErr)
	}
}

// The fact the replica's fallback answers: with the reference's CRDs the API
// server refuses the field selectors our CRD declares (spec.node for a
// node's weps, spec.subnetTopologyReference for the PSTS weps), and the
// probe and the error test of ipamcore/ipam say so.
func TestReferenceCRDs_RefuseFieldSelectors(t *testing.T) {
	referenceCRDs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := cp.Namespace(t)
	cs := versioned.NewForConfigOrDie(cp.Config)
	createRaw(ctx, t, cs.CceV1alpha1().RESTClient(), ns, "workloadendpoints", referenceWEP(ns, refPod{
		name: "web-0", node: "n-1", ip: "10.20.0.7", containerID: fmt.Sprintf("%064x", 7), eniID: "eni-a", mac: "02:00:00:00:00:01",
		instanceID: "i-n-1", subnetID: "sbn-a",
	}))
	for _, sel := range []string{"spec.node=n-1", "spec.subnetTopologyReference!="} {
		_, err := cs.CceV1alpha1().WorkloadEndpoints(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err == nil || !ipam.IsFieldSelectorUnsupported(err) {
			t.Errorf("list weps with %q on the reference's CRD: %v, want the refusal IsFieldSelectorUnsupported knows", sel, err)
		}
	}
	if ok, err := ipam.WepFieldSelectorsSupported(ctx, cs); err != nil || ok {
		t.Errorf("WepFieldSelectorsSupported on the reference's CRD = %v, %v; want false, nil", ok, err)
	}
	// A typed read of the reference's object works: same group, names, fields.
	w, err := cs.CceV1alpha1().WorkloadEndpoints(ns).Get(ctx, "web-0", metav1.GetOptions{})
	if err != nil || w.Spec.Node != "n-1" || w.Spec.IP != "10.20.0.7" || w.Labels[cce.LabelSubnetID] != "sbn-a" {
		t.Errorf("typed read of a reference wep: %+v, %v", w, err)
	}
}

// refPod is a pod the reference served: its IP on its node's ENI.
type refPod struct {
	name, node, ip, containerID, eniID, mac, instanceID, subnetID string
}

// referenceWEP is a WorkloadEndpoint in the reference's exact JSON (spec
// appendix): labels cce.io/subnet-id and cce.io/instance-type, the finalizer
// cce-cni.cce.io, updateAt at the epoch for an ordinary allocation, empty
// strings omitted, no status.
func referenceWEP(ns string, p refPod) map[string]any {
	return map[string]any{
		"apiVersion": "cce.io/v1alpha1",
		"kind":       "WorkloadEndpoint",
		"metadata": map[string]any{
			"name": p.name, "namespace": ns,
			"labels":     map[string]any{"cce.io/subnet-id": p.subnetID, "cce.io/instance-type": "bcc"},
			"finalizers": []any{"cce-cni.cce.io"},
		},
		"spec": map[string]any{
			"containerID": p.containerID, "ip": p.ip, "type": "Pod", "mac": p.mac, "eniID": p.eniID, "node": p.node,
			"instanceID": p.instanceID, "subnetID": p.subnetID, "enableFixIP": "False",
			"updateAt": "1970-01-01T00:00:00Z", "phase": "podRunning",
		},
	}
}

// referenceSubnet is a Subnet resource as the reference's Subnet controller
// writes it (spec and status in one object: no status subresource).
func referenceSubnet(id, zone, cidr string, available int) map[string]any {
	return map[string]any{
		"apiVersion": "cce.io/v1alpha1",
		"kind":       "Subnet",
		"metadata":   map[string]any{"name": id, "namespace": cce.IPPoolNamespace},
		"spec":       map[string]any{"id": id, "name": id, "availabilityZone": zone, "cidr": cidr, "exclusive": false},
		"status":     map[string]any{"availableIPNum": available, "enable": true, "hasNoMoreIP": false},
	}
}

func createRaw(ctx context.Context, t testing.TB, rc rest.Interface, ns, resource string, obj map[string]any) {
	t.Helper()
	body, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Post().Namespace(ns).Resource(resource).Body(body).SetHeader("Content-Type", "application/json").
		Do(ctx).Error(); err != nil {
		t.Fatalf("create %s: %v", resource, err)
	}
}

func mergePatchRaw(ctx context.Context, t testing.TB, rc rest.Interface, ns, resource, name string, patch map[string]any) {
	t.Helper()
	body, err := json.Marshal(patch)
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Patch(types.MergePatchType).Namespace(ns).Resource(resource).Name(name).Body(body).Do(ctx).Error(); err != nil {
		t.Fatalf("patch %s %s: %v", resource, name, err)
	}
}

// runningPod is a pod the reference's CNI set up: bound, Running, its IP in
// the status and its sandbox ID where the kubelet simulator reads it back.
func runningPod(ns string, f *fleet.Fleet, p refPod) (*corev1.Pod, corev1.PodStatus) {
	spec := suite.PodSpec(f)
	spec.NodeName = p.node
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: ns, Labels: map[string]string{"app": "ref"}}, Spec: spec}
	now := metav1.Now()
	st := corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: p.ip, PodIPs: []corev1.PodIP{{IP: p.ip}}, StartTime: &now,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: "app", Image: spec.Containers[0].Image, Ready: true, ContainerID: "kubelet-sim://" + p.containerID,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		}},
	}
	return pod, st
}
