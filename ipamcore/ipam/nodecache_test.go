package ipam

import (
	"context"
	"testing"
	"time"

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
				"kubectl.kubernetes.io/last-applied-configuration": "{...}",
			},
			Labels:        map[string]string{"app": "web"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
		},
		Spec:   corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1"},
	}
	slim := slimPod(full).(*corev1.Pod)
	if slim.Name != "web-0" || slim.Namespace != "ns" || slim.UID != "u-1" || slim.ResourceVersion != "42" ||
		slim.DeletionTimestamp == nil || slim.Spec.NodeName != "n1" {
		t.Fatalf("identity, node or deletion lost: %+v", slim.ObjectMeta)
	}
	if !isFixedIPPod(slim) || slim.Annotations[cce.AnnotationStsPodFixIPDeletePolicy] != cce.FixIPDeletePolicyNever {
		t.Fatalf("fixed-IP annotations or controller lost: %v %v", slim.Annotations, slim.OwnerReferences)
	}
	if len(slim.Annotations) != 2 || slim.Labels != nil || slim.ManagedFields != nil ||
		len(slim.Spec.Containers) != 0 || slim.Status.PodIP != "" {
		t.Fatalf("bulk kept: %+v", slim)
	}
	if plain := slimPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}}).(*corev1.Pod); plain.Annotations != nil {
		t.Fatalf("annotations invented: %v", plain.Annotations)
	}
	if w := (&cce.WorkloadEndpoint{}); slimPod(w) != any(w) {
		t.Fatal("a non-pod must pass through unchanged")
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
