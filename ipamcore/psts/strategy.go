package psts

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// Resolve returns the effective strategy of subnetID in p: spec.strategy, when
// set, overrides the subnet entry's; an empty type is Elastic, an empty
// release strategy is TTL, and a Custom strategy that reuses addresses
// without a TTL keeps them cce.DefaultReuseIPTTL. p is not modified (the
// reference defaults the cached object in place).
func Resolve(p *cce.PodSubnetTopologySpread, subnetID string) cce.IPAllocationStrategy {
	var s cce.IPAllocationStrategy
	if p.Spec.Strategy != nil {
		s = *p.Spec.Strategy
	} else if a, ok := p.Spec.Subnets[subnetID]; ok {
		s = a.IPAllocationStrategy
	}
	if s.Type == cce.IPAllocTypeNil {
		s.Type = cce.IPAllocTypeElastic
	}
	if s.ReleaseStrategy == "" {
		s.ReleaseStrategy = cce.ReleaseStrategyTTL
	}
	if s.TTL != nil {
		ttl := *s.TTL
		s.TTL = &ttl
	}
	if s.Type == cce.IPAllocTypeCustom && s.EnableReuseIPAddress && (s.TTL == nil || s.TTL.Duration <= 0) {
		s.TTL = &metav1.Duration{Duration: cce.DefaultReuseIPTTL}
	}
	return s
}

// TTL is how long a reused address waits for its pod after the pod is gone;
// zero when the strategy does not keep addresses for a TTL.
func TTL(s cce.IPAllocationStrategy) time.Duration {
	if s.TTL == nil || s.TTL.Duration < 0 {
		return 0
	}
	return s.TTL.Duration
}

// NeedsExclusive reports whether a strategy picks addresses itself and so
// needs a subnet nothing else allocates from (no ENIs, no Elastic pods).
func NeedsExclusive(t cce.IPAllocType) bool {
	switch t {
	case cce.IPAllocTypeFixed, cce.IPAllocTypeManual, cce.IPAllocTypeCustom:
		return true
	}
	return false
}

// Known reports whether t is one of the strategy types (empty is Elastic).
func Known(t cce.IPAllocType) bool {
	switch t {
	case cce.IPAllocTypeNil, cce.IPAllocTypeElastic, cce.IPAllocTypeFixed, cce.IPAllocTypeManual, cce.IPAllocTypeCustom:
		return true
	}
	return false
}

// KeepsAddress reports whether a pod of this strategy keeps its address when
// the pod is deleted: Fixed always (its next incarnation asks for it again),
// Custom when it reuses addresses. The address then goes by the release
// strategy (TTL after the pod is gone, or Never).
func KeepsAddress(s cce.IPAllocationStrategy) bool {
	return s.Type == cce.IPAllocTypeFixed || (s.Type == cce.IPAllocTypeCustom && s.EnableReuseIPAddress)
}
