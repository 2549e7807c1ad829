package ipam

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/watchlist"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// The node watch keeps slim pods: everything the IPAM decides on must
// survive the slimming, and the bulk must not.
func TestSlimPodKeepsWhatTheIPAMReads(t *testing.T) {
	yes := true
	now := metav1.Now()
	full := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web-0", Namespace: "ns", UID: "u-1", ResourceVersion: "42", DeletionTimestamp: &now,
			OwnerReferences: []metav1.OwnerReference{{Kind: "StatefulSet", Name: "web", Controller: &yes}},
			Annotations: map[string]string{
				cce.AnnotationStsEnableFixIP:                       cce.EnableFixIPTrue,
				cce.AnnotationStsPodFixIPDeletePolicy:              cce.FixIPDeletePolicyNever,
				cce.AnnotationPodSubnetTopologySpread:              "spread",
				"kubectl.kubernetes.io/last-applied-configuration": "{...}",
			},
			Labels:            map[string]string{"app": "web"},
			CreationTimestamp: metav1.NewTime(now.Add(-time.Hour)),
			ManagedFields:     []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
		},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1", PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}},
			HostIP: "192.168.0.1", Conditions: []corev1.PodCondition{{Type: corev1.PodReady}}},
	}
	slim := slimPod(full).(*corev1.Pod)
	if slim.Name != "web-0" || slim.Namespace != "ns" || slim.UID != "u-1" || slim.ResourceVersion != "42" ||
		slim.DeletionTimestamp == nil || slim.Spec.NodeName != "n1" {
		t.Fatalf("identity, node or deletion lost: %+v", slim.ObjectMeta)
	}
	if !isFixedIPPod(slim) || slim.Annotations[cce.AnnotationStsPodFixIPDeletePolicy] != cce.FixIPDeletePolicyNever {
		t.Fatalf("fixed-IP annotations or controller lost: %v %v", slim.Annotations, slim.OwnerReferences)
	}
	// A PSTS pod's annotation, and the labels and age its PSTS selector is
	// matched against when the webhook did not annotate it.
	if slim.Annotations[cce.AnnotationPodSubnetTopologySpread] != "spread" || slim.Labels["app"] != "web" ||
		!slim.CreationTimestamp.Equal(&full.CreationTimestamp) {
		t.Fatalf("PSTS annotation, labels or creation time lost: %+v", slim.ObjectMeta)
	}
	if len(slim.Annotations) != 3 || slim.ManagedFields != nil ||
		len(slim.Spec.Containers) != 0 || slim.Status.HostIP != "" || slim.Status.Conditions != nil {
		t.Fatalf("bulk kept: %+v", slim)
	}
	// The podIP guard's reads: whether the pod runs, with which addresses.
	if slim.Status.Phase != corev1.PodRunning || slim.Status.PodIP != "10.0.0.1" || len(slim.Status.PodIPs) != 1 {
		t.Fatalf("phase or pod IPs lost: %+v", slim.Status)
	}
	if plain := slimPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}}).(*corev1.Pod); plain.Annotations != nil {
		t.Fatalf("annotations invented: %v", plain.Annotations)
	}
	if w := (&cce.WorkloadEndpoint{}); slimPod(w) != any(w) {
		t.Fatal("a non-pod must pass through unchanged")
	}
}

// Every replica caches all Nodes and StatefulSets: what rebuild, createENI,
// the ring and the fixed-IP GC read must survive the transform, the bulk
// must not.
func TestSlimClusterObjectKeepsWhatIsRead(t *testing.T) {
	now := metav1.Now()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: "n1", UID: "u-n1", ResourceVersion: "7", DeletionTimestamp: &now,
			Labels: map[string]string{"topology.kubernetes.io/zone": "zoneA"},
			Annotations: map[string]string{
				cce.AnnotationMaxIPPerENI:          "8",
				corev1.LastAppliedConfigAnnotation: "{...}",
			},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}},
		},
		Spec: corev1.NodeSpec{ProviderID: "cce://i-1", Unschedulable: true},
		Status: corev1.NodeStatus{
			Images: []corev1.ContainerImage{{Names: []string{"registry/app:v1"}, SizeBytes: 1 << 30}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Message: "bulk"},
				{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Message: "kubelet is posting ready status"}},
		},
	}
	out, err := slimClusterObject(node)
	if err != nil {
		t.Fatal(err)
	}
	n := out.(*corev1.Node)
	if n.Name != "n1" || n.UID != "u-n1" || n.ResourceVersion != "7" || n.DeletionTimestamp == nil ||
		n.Spec.ProviderID != "cce://i-1" || !n.Spec.Unschedulable || n.Labels["topology.kubernetes.io/zone"] != "zoneA" ||
		n.Annotations[cce.AnnotationMaxIPPerENI] != "8" {
		t.Fatalf("node lost what is read: %+v", n)
	}
	// Only the Ready condition's status stays (ENIs ahead of demand skip
	// nodes that are not Ready).
	if c := n.Status.Conditions; len(c) != 1 || c[0].Type != corev1.NodeReady || c[0].Status != corev1.ConditionTrue {
		t.Fatalf("node conditions kept: %+v, want Ready=True alone", c)
	}
	if n.Status.Images != nil || n.Status.Conditions[0].Message != "" || n.ManagedFields != nil || len(n.Annotations) != 1 {
		t.Fatalf("node bulk kept: %+v", n)
	}

	replicas := int32(3)
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Spec: appsv1.StatefulSetSpec{Replicas: &replicas, Template: corev1.PodTemplateSpec{
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "app"}}}}},
		Status: appsv1.StatefulSetStatus{Replicas: 3},
	}
	out, _ = slimClusterObject(sts)
	s := out.(*appsv1.StatefulSet)
	if s.Name != "web" || s.Namespace != "ns" || s.Spec.Replicas == nil || *s.Spec.Replicas != 3 {
		t.Fatalf("statefulset lost what is read: %+v", s)
	}
	if s.Spec.Template.Spec.Containers != nil || s.Status.Replicas != 0 || s.ManagedFields != nil {
		t.Fatalf("statefulset bulk kept: %+v", s)
	}

	// Anything else passes through, managed fields stripped.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{ManagedFields: []metav1.ManagedFieldsEntry{{}}}, Data: map[string]string{"k": "v"}}
	if out, _ := slimClusterObject(cm); out != any(cm) || cm.ManagedFields != nil || cm.Data["k"] != "v" {
		t.Fatalf("other object: %+v", out)
	}
	if out, err := slimClusterObject("not an object"); err != nil || out != "not an object" {
		t.Fatalf("non-object: %v, %v", out, err)
	}
}

// A node's pod watch starts with a list (served from the API server's
// spec.nodeName index), never a streamed initial list (which walks every
// pod of the cluster per node).
func TestNodeCache_ListsThenWatches(t *testing.T) {
	if !watchlist.DoesClientNotSupportWatchListSemantics(nodePodsListWatch(fake.NewClientset(), "n1")) {
		t.Fatal("the node's ListWatch lets the reflector stream its initial list")
	}
	kube := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns"}, Spec: corev1.PodSpec{NodeName: "n1"}})
	c := startNodeCache(context.Background(), "n1", kube)
	defer c.stop()
	deadline := time.Now().Add(10 * time.Second)
	for !c.synced() {
		if time.Now().After(deadline) {
			t.Fatal("the node cache did not sync")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var listed bool
	for _, a := range kube.Actions() {
		switch a := a.(type) {
		case k8stesting.ListAction:
			listed = listed || a.GetListRestrictions().Fields.String() == "spec.nodeName=n1"
		case k8stesting.WatchAction:
			if a.GetWatchRestrictions().Fields.String() != "spec.nodeName=n1" {
				t.Errorf("watch with fields %q", a.GetWatchRestrictions().Fields)
			}
		}
	}
	if !listed {
		t.Fatalf("no list of the node's pods; actions: %v", kube.Actions())
	}
}
