package ipam

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
