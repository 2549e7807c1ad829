package cachetrim

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestStripManagedFields(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}}}
	out, err := StripManagedFields(pod)
	if err != nil || out != pod || pod.ManagedFields != nil || pod.Name != "p" {
		t.Fatalf("got %v, %v; managed fields %v", out, err, pod.ManagedFields)
	}
	// A tombstone or any object without metadata passes unchanged.
	if out, err := StripManagedFields("not an object"); err != nil || out != "not an object" {
		t.Fatalf("got %v, %v", out, err)
	}
}
