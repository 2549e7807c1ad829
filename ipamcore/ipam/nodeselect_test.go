package ipam_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

func TestServesNode(t *testing.T) {
	node := func(providerID string, labels map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels}, Spec: corev1.NodeSpec{ProviderID: providerID}}
	}
	beta := func(v string) map[string]string { return map[string]string{ipam.LabelInstanceTypeBeta: v} }
	deleting := node("cce://i-1", beta("BCC"))
	deleting.DeletionTimestamp = &metav1.Time{}
	for name, tc := range map[string]struct {
		node *corev1.Node
		want bool
		why  string
	}{
		"BCC":                      {node("cce://i-1", beta("BCC")), true, ""},
		"GPU":                      {node("cce://i-1", beta("GPU")), true, ""},
		"DCC":                      {node("cce://i-1", beta("DCC")), true, ""},
		"lower-case bcc":           {node("cce://i-1", beta("bcc")), true, ""},
		"unlabelled (old node)":    {node("cce://i-1", nil), true, ""},
		"GA label BCC":             {node("cce://i-1", map[string]string{ipam.LabelInstanceType: "BCC"}), true, ""},
		"BBC":                      {node("cce://i-1", beta("BBC")), false, `beta.kubernetes.io/instance-type="BBC"`},
		"GA label BBC":             {node("cce://i-1", map[string]string{ipam.LabelInstanceType: "BBC"}), false, `node.kubernetes.io/instance-type="BBC"`},
		"beta label wins over GA":  {node("cce://i-1", map[string]string{ipam.LabelInstanceTypeBeta: "BBC", ipam.LabelInstanceType: "BCC"}), false, "BBC"},
		"empty label":              {node("cce://i-1", beta("")), false, `=""`},
		"no providerID":            {node("", beta("BCC")), false, "not cce://"},
		"other cloud's providerID": {node("aws:///us-east-1a/i-1", nil), false, "not cce://"},
		"being deleted":            {deleting, false, "being deleted"},
	} {
		got, why := ipam.ServesNode(tc.node)
		if got != tc.want || !strings.Contains(why, tc.why) || (got && why != "") {
			t.Errorf("%s: ServesNode = %v, %q; want %v, a reason with %q", name, got, why, tc.want, tc.why)
		}
	}
}
