package main

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/cce-ipam/sharded/ipamcore/cachetrim"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	cceinformers "github.com/cce-ipam/sharded/ipamcore/generated/informers/externalversions"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/ipclaim"
)

// pstsParts are the replica's PodSubnetTopologySpread components (see
// ipamcore/ipam/PSTS.md): the IPClaim ledger every replica allocates
// exclusive-subnet addresses through, and the leader's claim keeper.
type pstsParts struct {
	// claims is every replica's cluster-wide IPClaim informer: the ledger
	// reads it on each pick. Claims are bounded by the exclusive subnets'
	// sizes.
	claims cceinformers.SharedInformerFactory
	// pstsWeps watches only the weps of PSTS pods (a field selector on the
	// selectable spec.subnetTopologyReference), for the keeper: no replica
	// holds every wep. Started at the first leadership term, it runs until
	// the process ends (a factory cannot start again once shut down).
	// allWeps drops the selector where the wep CRD is still the
	// reference's, which declares no selectable field and refuses it
	// (ipamcore/ipam/wepselect.go): the leader then watches every wep, and
	// the keeper skips those of other pods itself.
	pstsWeps cceinformers.SharedInformerFactory
	allWeps  atomic.Bool
	ledger   *ipclaim.Ledger
	keeper   *ipclaim.Keeper
	runCtx   chan context.Context // run's context, for the leader's informers
	cce      cceclient.Interface
}

func newPSTSParts(o options, clients kubeClients, log *slog.Logger, reg prometheus.Registerer) (*pstsParts, error) {
	p := &pstsParts{
		claims: cceinformers.NewSharedInformerFactoryWithOptions(clients.cce, 0, cceinformers.WithTransform(cachetrim.StripManagedFields)),
		runCtx: make(chan context.Context, 1),
		cce:    clients.cce,
	}
	p.pstsWeps = cceinformers.NewSharedInformerFactoryWithOptions(clients.cce, 0,
		cceinformers.WithTransform(cachetrim.StripManagedFields),
		cceinformers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			if !p.allWeps.Load() {
				lo.FieldSelector = "spec.subnetTopologyReference!="
			}
		}))
	p.ledger = ipclaim.New(o.claims, clients.cce, p.claims.Cce().V1alpha1().IPClaims(), clock.RealClock{},
		log.With("component", "ipclaim"), reg)
	var err error
	p.keeper, err = ipclaim.NewKeeper(o.claims, ipclaim.KeeperDeps{
		CCE:     clients.cce,
		Kube:    clients.kube,
		Claims:  p.claims.Cce().V1alpha1().IPClaims(),
		Weps:    p.pstsWeps.Cce().V1alpha1().WorkloadEndpoints(),
		Spreads: p.claims.Cce().V1alpha1().PodSubnetTopologySpreads(),
	}, log.With("component", "ipclaim-keeper"), reg)
	return p, err
}

// run starts the claim informer and blocks until ctx ends.
func (p *pstsParts) run(ctx context.Context) error {
	p.runCtx <- ctx
	p.claims.Start(ctx.Done())
	<-ctx.Done()
	p.claims.Shutdown()
	p.pstsWeps.Shutdown()
	return nil
}

// lead runs the leader's duties until leadership (ctx) ends.
func (p *pstsParts) lead(ctx context.Context, log *slog.Logger) {
	var runCtx context.Context
	select {
	case runCtx = <-p.runCtx:
		p.runCtx <- runCtx
	case <-ctx.Done():
		return
	}
	p.probeWepSelector(ctx, log)
	p.pstsWeps.Start(runCtx.Done()) // idempotent
	if err := p.keeper.Run(ctx); err != nil && ctx.Err() == nil {
		log.Error("IPClaim keeper stopped", "err", err)
	}
}

// probeWepSelector asks, before the wep watch first starts, whether the wep
// CRD accepts field selectors; a failed probe keeps the selector (the
// watch's own errors then say what is wrong).
func (p *pstsParts) probeWepSelector(ctx context.Context, log *slog.Logger) {
	ok, err := ipam.WepFieldSelectorsSupported(ctx, p.cce)
	switch {
	case err != nil:
		log.Warn("cannot tell whether the WorkloadEndpoint CRD has selectable fields", "err", err)
	case !ok && !p.allWeps.Swap(true):
		log.Warn("the WorkloadEndpoint CRD has no selectable fields (a CRD installed by the reference?): " +
			"the IPClaim keeper watches every wep until it is upgraded (see README, \"Migrating from cce-eni-ipam\")")
	}
}
