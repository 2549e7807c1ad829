package ipam

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
)

// A cluster that ran the reference keeps the reference's WorkloadEndpoint
// CRD: schema-less (x-kubernetes-preserve-unknown-fields) and without our
// selectable field spec.node. Helm skips crds/ when a CRD exists, so after
// `helm install` that CRD is still there, and the API server refuses a list
// with the field selector spec.node=<node> (400 BadRequest). The replica
// then falls back rather than failing every rebuild:
//
//   - one node's weps are read as every wep, in pages of one quorum
//     snapshot, filtered here (the reference's weps carry no node label a
//     label selector could use). A full scan per node: a takeover of more
//     than one node then reads all weps once (see rebuild), and the ENI
//     sync's adoption read is rare;
//   - the field selector is tried again after wepSelectorRetry, so a CRD
//     upgraded while the replica runs (README, "Migrating from
//     cce-eni-ipam") brings the cheap path back without a restart.
//
// Upgrading the CRDs is the operator's step, not the replica's: applying
// CRDs needs cluster-wide write access to customresourcedefinitions, which
// a replica should not hold, and the upgrade is safe to do at any time (our
// schema keeps every field the reference writes; the reference runs on it).

// wepSelectorRetry is how long the replica reads weps the slow way before it
// tries the field selector again.
const wepSelectorRetry = 10 * time.Minute

// wepSelector remembers whether the WorkloadEndpoint CRD supports the
// spec.node field selector. Zero: supported, or not yet known.
type wepSelector struct {
	unsupportedAt atomic.Int64 // Unix nanoseconds of the last refusal; 0: none
}

// useField reports whether to try the field selector at now.
func (s *wepSelector) useField(now time.Time) bool {
	at := s.unsupportedAt.Load()
	return at == 0 || now.Sub(time.Unix(0, at)) >= wepSelectorRetry
}

// refused records a refusal of the field selector at now and reports
// whether it is news (the first refusal, or the first after the selector
// worked again), so the caller logs once.
func (s *wepSelector) refused(now time.Time) bool {
	return s.unsupportedAt.Swap(now.UnixNano()) == 0
}

// worked records that the field selector was accepted and reports whether
// it had been refused before.
func (s *wepSelector) worked() bool { return s.unsupportedAt.Swap(0) != 0 }

// unsupported reports whether the field selector is known to be refused at now.
func (s *wepSelector) unsupported(now time.Time) bool { return !s.useField(now) }

// IsFieldSelectorUnsupported reports whether err is the API server's refusal
// of a field selector the resource does not declare (a CRD without that
// selectable field): 400 BadRequest, "field label not supported".
func IsFieldSelectorUnsupported(err error) bool {
	if !apierrors.IsBadRequest(err) {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "field label not supported") || strings.Contains(msg, "not a known field selector")
}

// WepFieldSelectorsSupported asks the API server (one list of at most one
// wep) whether the WorkloadEndpoint CRD declares the selectable field
// spec.node, as ours does and the reference's does not. Callers that start
// a field-selected wep watch use it to choose between that watch and an
// unfiltered one.
func WepFieldSelectorsSupported(ctx context.Context, cs versioned.Interface) (bool, error) {
	_, err := cs.CceV1alpha1().WorkloadEndpoints(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.node", "").String(),
		Limit:         1,
	})
	switch {
	case err == nil:
		return true, nil
	case IsFieldSelectorUnsupported(err):
		return false, nil
	default:
		return false, err
	}
}
