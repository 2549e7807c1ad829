package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/e2e/fleet"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// Item 7: PSTS allocation latency against an ordinary warm allocation.

// The PSTS objects (in podNamespace) and their subnets (outside the nodes'
// 10.16.0.0/12): an Elastic PSTS on a shared subnet, a Fixed one on an
// exclusive subnet.
const (
	pstsElasticName, pstsElasticSubnet, pstsElasticCIDR = "bench-elastic", "sbn-bench-elastic", "10.64.0.0/20"
	pstsFixedName, pstsFixedSubnet, pstsFixedCIDR       = "bench-fixed", "sbn-bench-fixed", "10.65.0.0/20"
)

// pstsResult is item 7: the three kinds' ADDs, measured in the same waves.
type pstsResult struct {
	warm, elastic, fixed *latRun
	replicas             int
}

// pstsLimitsLifted are the replicas' flags of item 7: a budget and
// per-operation limits that do not throttle (bce-sim's are lifted too), so
// the figures are the IPAM's cost of a PSTS ADD, not BCE's 5/s cap on
// cross-subnet adds.
var pstsLimitsLifted = []string{"--bce-rate", "1000", "--bce-burst", "1000", "--bce-op-limits="}

// runPSTS is item 7, on 3 replicas (as the latency item's second half).
// The running replicas restart with BCE's limits lifted
// (and again without, at the end); PSTSRepeats repeats of PSTSWaves waves
// each allocate PSTSPerNode IPs per node of each kind, one kind after the
// other at the same concurrency (Profile.Conc), each call at a random
// running replica: ordinary pods from the warm pool, PSTS Elastic pods (the
// cloud picks an address of a shared subnet and adds it to the node's ENI)
// and PSTS Fixed pods (the IPAM picks a free address of an exclusive
// subnet, reserves it in an IPClaim, and adds it). Elastic and ordinary
// pods get a fresh sandbox per wave; Fixed pods are fresh pods per wave (a
// Fixed pod's DEL keeps its address for its next sandbox, whose ADD would
// be a restart, not a pick).
func (e *env) runPSTS(ctx context.Context, nodes []string) (_ *pstsResult, err error) {
	p := e.cfg.Profile
	if err := e.atLeastReplicas(ctx, 3); err != nil {
		return nil, err
	}
	restore, err := e.liftLimits(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, restore()) }()
	if err := e.createPSTSObjects(ctx); err != nil {
		return nil, err
	}

	warm, err := e.drv.createPods(ctx, "pw", nodes, p.PSTSPerNode, 16)
	if err != nil {
		return nil, fmt.Errorf("create warm pods: %w", err)
	}
	elastic, err := e.drv.createPSTSPods(ctx, "pe", pstsElasticName, nodes, p.PSTSPerNode, 16)
	if err != nil {
		return nil, fmt.Errorf("create PSTS Elastic pods: %w", err)
	}
	waves := p.PSTSRepeats*p.PSTSWaves + 1 // and the warm-up
	fixed, err := e.drv.createPSTSPods(ctx, "pf", pstsFixedName, nodes, waves*p.PSTSPerNode, 16)
	if err != nil {
		return nil, fmt.Errorf("create PSTS Fixed pods: %w", err)
	}
	defer func() {
		all := append(append(append([]pod(nil), warm...), elastic...), fixed...)
		_ = e.drv.deletePods(context.WithoutCancel(ctx), all, 16)
	}()
	per := len(nodes) * p.PSTSPerNode
	fixedWave := func(w int) []pod { return fixed[w*per : (w+1)*per] }

	res := &pstsResult{warm: &latRun{name: "ordinary, warm pool"}, elastic: &latRun{name: "PSTS Elastic"},
		fixed: &latRun{name: "PSTS Fixed"}, replicas: len(e.running())}
	target := e.randomTarget()
	// Warm-up: connections, caches, the pools, the ledger's informer.
	for _, w := range [][]pod{warm, elastic, fixedWave(0)} {
		if _, _, _, err := e.allocWave(ctx, w, p.Conc, target); err != nil {
			return nil, err
		}
	}
	sleep(ctx, 3*time.Second) // cooling (1s) + pool check (1s)
	next := 1
	for rep := range p.PSTSRepeats {
		lat := map[*latRun][]time.Duration{}
		took := map[*latRun]time.Duration{}
		for range p.PSTSWaves {
			for _, k := range []struct {
				run  *latRun
				pods []pod
			}{{res.warm, warm}, {res.elastic, elastic}, {res.fixed, fixedWave(next)}} {
				l, el, errs, err := e.allocWave(ctx, k.pods, p.Conc, target)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", k.run.name, err)
				}
				lat[k.run], took[k.run], k.run.errors = append(lat[k.run], l...), took[k.run]+el, k.run.errors+errs
			}
			next++
			sleep(ctx, 3*time.Second)
		}
		for _, r := range []*latRun{res.warm, res.elastic, res.fixed} {
			r.repeats, r.rates = append(r.repeats, lat[r]), append(r.rates, float64(len(lat[r]))/took[r].Seconds())
		}
		w50, w99, _ := res.warm.medians()
		e50, e99, _ := res.elastic.medians()
		f50, f99, _ := res.fixed.medians()
		e.log.Info("psts repeat", "repeat", rep+1, "warm_p50_ms", w50, "warm_p99_ms", w99, "elastic_p50_ms", e50,
			"elastic_p99_ms", e99, "fixed_p50_ms", f50, "fixed_p99_ms", f99)
	}
	return res, nil
}

// liftLimits restarts the replicas with pstsLimitsLifted and lifts
// bce-sim's limits; restore puts both back (unless ctx was cancelled: the
// run ends then).
func (e *env) liftLimits(ctx context.Context) (restore func() error, err error) {
	if err := e.restartWith(ctx, pstsLimitsLifted...); err != nil {
		return nil, err
	}
	restore = func() error {
		if ctx.Err() != nil {
			return nil
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		return errors.Join(e.simLimits(rctx, true), e.restartWith(rctx))
	}
	if err := e.simLimits(ctx, false); err != nil {
		return nil, errors.Join(err, restore())
	}
	return restore, nil
}

// restartWith restarts every running replica with these phase flags and
// waits until the cluster settles again. All of them leave first, then
// they start one after the other: a replica started with a lower --bce-rate
// than its live peers finds no room in the budget they share out and
// never becomes ready, so a rolling restart cannot lower the budget.
func (e *env) restartWith(ctx context.Context, args ...string) error {
	e.setPhaseArgs(args...)
	run := e.running()
	errs := make([]error, len(run))
	var wg sync.WaitGroup
	for i, r := range run {
		wg.Go(func() { errs[i] = r.Terminate() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, r := range run {
		if err := r.Start(ctx); err != nil {
			return err
		}
	}
	_, err := e.settle(ctx, len(e.f.Nodes()), 3*time.Minute)
	return err
}

// createPSTSObjects creates item 7's subnets in bce-sim, their Subnet
// resources (as the PSTS validating webhook leaves them: enabled, the Fixed
// one exclusive) and the two PSTS objects; what exists is kept.
func (e *env) createPSTSObjects(ctx context.Context) error {
	for _, sn := range []struct {
		id, cidr  string
		exclusive bool
	}{{pstsElasticSubnet, pstsElasticCIDR, false}, {pstsFixedSubnet, pstsFixedCIDR, true}} {
		world, err := e.f.SimWorld(ctx)
		if err != nil {
			return err
		}
		found := false
		for _, s := range world.Subnets {
			found = found || s.SubnetID == sn.id
		}
		if !found {
			if err := e.f.AddSubnet(ctx, sn.id, sn.cidr); err != nil {
				return fmt.Errorf("create subnet %s: %w", sn.id, err)
			}
		}
		pfx := netip.MustParsePrefix(sn.cidr)
		_, err = e.cce.CceV1alpha1().Subnets(cce.SubnetNamespace).Create(ctx, &cce.Subnet{
			ObjectMeta: metav1.ObjectMeta{Name: sn.id, Namespace: cce.SubnetNamespace},
			Spec:       cce.SubnetSpec{ID: sn.id, Name: sn.id, AvailabilityZone: fleet.Zone, CIDR: sn.cidr, Exclusive: sn.exclusive},
			Status:     cce.SubnetStatus{Enable: true, AvailableIPNum: 1<<(32-pfx.Bits()) - 3},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create Subnet %s: %w", sn.id, err)
		}
	}
	for _, ps := range []struct {
		name, subnet string
		typ          cce.IPAllocType
	}{{pstsElasticName, pstsElasticSubnet, cce.IPAllocTypeElastic}, {pstsFixedName, pstsFixedSubnet, cce.IPAllocTypeFixed}} {
		_, err := e.cce.CceV1alpha1().PodSubnetTopologySpreads(podNamespace).Create(ctx, &cce.PodSubnetTopologySpread{
			ObjectMeta: metav1.ObjectMeta{Name: ps.name},
			Spec: cce.PodSubnetTopologySpreadSpec{Name: ps.name, Strategy: &cce.IPAllocationStrategy{Type: ps.typ},
				Subnets: map[string]cce.SubnetAllocation{ps.subnet: {}}},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create PodSubnetTopologySpread %s: %w", ps.name, err)
		}
	}
	return nil
}
