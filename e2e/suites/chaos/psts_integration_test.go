//go:build integration

package chaos_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	k8snet "k8s.io/utils/net"

	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/suites/suite"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/psts"
)

// PSTS workloads of the chaos run (the nodes' subnet is 10.20.0.0/16):
//   - pelastic: bare pods of an Elastic PSTS churned like the ordinary
//     churn (the cloud picks addresses of a shared subnet);
//   - pfixed: a StatefulSet of a Fixed PSTS (exclusive subnet, a /27
//     range), placed by the test like the fixed-IP set, so that a deleted
//     pod comes back on a node of another replica, with its address;
//   - preuse: bare pods of a Custom PSTS that reuses addresses (exclusive
//     subnet, a custom range), deleted and created again under their
//     names by the test, also on another replica's node, with their
//     addresses.
const (
	pstsElastic, pstsElasticCIDR = "pelastic", "10.61.0.0/24"
	pstsFixed, pstsFixedCIDR     = "pfixed", "10.62.0.0/24"
	pstsFixedRange               = "10.62.0.32/27"
	pstsReuse, pstsReuseCIDR     = "preuse", "10.63.0.0/24"
	pstsFixedReplicas            = 4
	pstsReusePods                = 3
)

var pstsReuseRange = psts.Range{First: netip.MustParseAddr("10.63.0.100"), Last: netip.MustParseAddr("10.63.0.131")}

type pstsWorkloads struct {
	fixed, reuse *fixedSet
	elastic      *suite.Churn
}

// startPSTS creates the PSTS subnets (bce-sim and Subnet resources, as the
// validating webhook leaves them), the three PSTS objects and their
// workloads, and waits until the placed ones run.
func startPSTS(ctx context.Context, t *testing.T, f *fleet.Fleet, ns string, seed uint64) *pstsWorkloads {
	t.Helper()
	subnet := func(name string) string { return "sbn-" + f.Options().Name + "-" + name }
	suite.CreatePSTSSubnet(ctx, t, f, subnet(pstsElastic), pstsElasticCIDR, false)
	suite.CreatePSTSSubnet(ctx, t, f, subnet(pstsFixed), pstsFixedCIDR, true)
	suite.CreatePSTSSubnet(ctx, t, f, subnet(pstsReuse), pstsReuseCIDR, true)
	suite.CreatePSTS(ctx, t, f, ns, pstsElastic, cce.IPAllocationStrategy{Type: cce.IPAllocTypeElastic},
		map[string]cce.SubnetAllocation{subnet(pstsElastic): {}})
	suite.CreatePSTS(ctx, t, f, ns, pstsFixed, cce.IPAllocationStrategy{Type: cce.IPAllocTypeFixed},
		map[string]cce.SubnetAllocation{subnet(pstsFixed): {IPv4Range: []string{pstsFixedRange}}})
	suite.CreatePSTS(ctx, t, f, ns, pstsReuse, cce.IPAllocationStrategy{Type: cce.IPAllocTypeCustom, EnableReuseIPAddress: true},
		map[string]cce.SubnetAllocation{subnet(pstsReuse): {Custom: []cce.CustomAllocation{{Family: k8snet.IPv4,
			CustomIPRange: []cce.CustomIPRange{{Start: pstsReuseRange.First.String(), End: pstsReuseRange.Last.String()}}}}}})

	w := &pstsWorkloads{
		fixed: newSet(f, ns, pstsFixed, pstsFixedReplicas, seed+1),
		reuse: newSet(f, ns, pstsReuse, pstsReusePods, seed+2),
		elastic: &suite.Churn{Namespace: ns, Name: pstsElastic, PSTS: pstsElastic, Min: 5, Max: 20,
			Period: 500 * time.Millisecond, Batch: 3},
	}
	for _, s := range []*fixedSet{w.fixed, w.reuse} {
		s.mustKeep = true
		s.template = func(tpl *corev1.PodTemplateSpec) { suite.PSTSMutate(&tpl.ObjectMeta, &tpl.Spec, s.name) }
	}
	w.reuse.bare = true
	w.fixed.create(ctx, t)
	w.reuse.create(ctx, t)
	return w
}

// roll deletes PSTS pods to come back elsewhere: 1-2 of the Fixed set and
// one reuse pod.
func (w *pstsWorkloads) roll(ctx context.Context, rng *rand.Rand) ([]string, error) {
	a, err := w.fixed.roll(ctx, rng, 1+rng.IntN(2))
	if err != nil {
		return a, err
	}
	b, err := w.reuse.roll(ctx, rng, 1)
	return append(a, b...), err
}

// checkRanges fails the test unless every PSTS pod's address is in its
// PSTS's range.
func (w *pstsWorkloads) checkRanges(t *testing.T, fixed, reuse, elastic []corev1.Pod) {
	t.Helper()
	suite.InRanges(t, fixed, psts.PrefixRange(netip.MustParsePrefix(pstsFixedRange)))
	suite.InRanges(t, reuse, pstsReuseRange)
	suite.InRanges(t, elastic, suite.CIDRRange(pstsElasticCIDR))
}

func (w *pstsWorkloads) String() string {
	return fmt.Sprintf("PSTS Elastic pods churned: %s; PSTS Fixed: %s; PSTS reuse: %s", w.elastic.Stats(), w.fixed, w.reuse)
}
