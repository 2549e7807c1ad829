package ipam

import (
	"errors"
	"fmt"
	"strconv"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// Which errors count as the API server's fencing refusal. The denials are
// built as the API server builds them (admission.NewForbidden around the
// policy's message, k8s.io/apiserver validating dispatcher); that the real
// API server answers so is TestIPAM_WEPWritesFencedByTheAPIServer's part.
func TestRefusedByFencingPolicy(t *testing.T) {
	weps := schema.GroupResource{Group: "cce.io", Resource: "workloadendpoints"}
	denial := func(msg string) error { return apierrors.NewForbidden(weps, "p", errors.New(msg)) }
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"stale token", denial(`ValidatingAdmissionPolicy 'rel-cce-ipam-wep-fencing' with binding ` +
			`'rel-cce-ipam-wep-fencing-7' denied request: fenced: partition 7 is claimed by "r1" at epoch 2, ` +
			`the write carries holder "r0" epoch 1`), true},
		{"no token", denial(`ValidatingAdmissionPolicy 'rel-cce-ipam-wep-fencing-token' with binding ` +
			`'rel-cce-ipam-wep-fencing-token' denied request: fenced: a wep written by cce-ipam must carry a fencing token`), true},
		{"wrapped", fmt.Errorf("create WorkloadEndpoint: %w", denial(
			`ValidatingAdmissionPolicy 'x' with binding 'x-0' denied request: fenced: partition 0`)), true},
		{"no claim Lease", denial(`policy 'rel-cce-ipam-wep-fencing' with binding 'rel-cce-ipam-wep-fencing-7' ` +
			"denied request: failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction"), false},
		{"another policy", denial(`ValidatingAdmissionPolicy 'quota' with binding 'quota' denied request: too many`), false},
		{"RBAC", denial(`User "system:serviceaccount:kube-system:cce-ipam" cannot create resource "workloadendpoints"`), false},
		{"own fence", fmt.Errorf("%w node-1: lease at risk", ErrFenced), false},
		{"the text, not Forbidden", errors.New(`ValidatingAdmissionPolicy 'x' with binding 'x-0' denied request: fenced: partition 0`), false},
		{"nil", nil, false},
	} {
		if got := refusedByFencingPolicy(tc.err); got != tc.want {
			t.Errorf("%s: refusedByFencingPolicy(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// A stamp carries the partition's group beside the partition (the chart's
// policy per group selects on it), and a wep without the group label (written
// before groups existed) has no token of ours: the known-wep DEL then stamps
// it before deleting instead of deleting it as stored, which the policy would
// refuse.
func TestFenceToken_StampAndTokenOf(t *testing.T) {
	for _, tc := range []struct{ partition, group string }{{"0", "0"}, {"15", "0"}, {"16", "1"}, {"270", "16"}} {
		p, _ := strconv.Atoi(tc.partition)
		tok := FenceToken{Partition: p, Holder: "r0-abc", Epoch: 7}
		var w cce.WorkloadEndpoint
		tok.Stamp(&w)
		if w.Labels[LabelFencePartition] != tc.partition || w.Labels[LabelFenceGroup] != tc.group ||
			w.Annotations[AnnoFenceHolder] != "r0-abc" || w.Annotations[AnnoFenceEpoch] != "7" {
			t.Errorf("%v stamps labels %v annotations %v, want partition %s group %s", tok, w.Labels, w.Annotations, tc.partition, tc.group)
		}
		if tokenOf(&w) == "" || tokenOf(&w) != stampedToken(tok) {
			t.Errorf("tokenOf(stamped by %v) = %q, want %q", tok, tokenOf(&w), stampedToken(tok))
		}
		old := w.DeepCopy()
		delete(old.Labels, LabelFenceGroup)
		if got := tokenOf(old); got != "" {
			t.Errorf("a wep without the group label has token %q, want none", got)
		}
	}
	if stampedToken(FenceToken{Partition: 1, Holder: "a", Epoch: 2}) == stampedToken(FenceToken{Partition: 1, Holder: "a", Epoch: 3}) {
		t.Error("two epochs give one token")
	}
}
