package ipam

import (
	"errors"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
