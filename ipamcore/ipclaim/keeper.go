package ipclaim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	kubescheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	ccetyped "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned/typed/cce/v1alpha1"
	cceinformers "github.com/cce-ipam/sharded/ipamcore/generated/informers/externalversions/cce/v1alpha1"
	ccelisters "github.com/cce-ipam/sharded/ipamcore/generated/listers/cce/v1alpha1"
)

// KeeperDeps are what the Keeper reads and writes. The informers come from
// the caller's factories, which the caller starts after NewKeeper.
type KeeperDeps struct {
	// CCE writes the claims and reads weps live.
	CCE cceclient.Interface
	// Kube receives the Warning events, unless Events is set; with neither,
	// no events are recorded.
	Kube kubernetes.Interface
	// Events, when set, records the events instead (tests, a shared
	// recorder). Its scheme must know the cce.io kinds.
	Events record.EventRecorder
	// Claims, Weps and Spreads are cluster-wide informers of IPClaims,
	// WorkloadEndpoints and PodSubnetTopologySpreads.
	Claims  cceinformers.IPClaimInformer
	Weps    cceinformers.WorkloadEndpointInformer
	Spreads cceinformers.PodSubnetTopologySpreadInformer
	// Clock drives the period and the ages; nil is the real clock.
	Clock clock.WithTicker
}

// Keeper is the leader's side of the ledger: it frees orphaned claims,
// creates the claims of kept PSTS weps that have none (adoption) and
// deletes the free claims of subnets no PSTS lists (sweep). Only the leader
// runs it; two Keepers at once (a leadership hand-over) are safe, every
// write being a compare-and-swap or exclusive Create, only wasteful.
type Keeper struct {
	cfg     Config
	deps    KeeperDeps
	claims  ccetyped.IPClaimInterface
	claimsL ccelisters.IPClaimLister
	wepsL   ccelisters.WorkloadEndpointLister
	spreadL ccelisters.PodSubnetTopologySpreadLister
	synced  []cache.InformerSynced
	log     *slog.Logger
	metrics *keeperMetrics
	scheme  *runtime.Scheme

	// syncState is what the passes of Sync remember (Run has its own).
	syncState *passState
}

// Report counts what one pass of the Keeper did and found.
type Report struct {
	// OrphansFreed, Adopted and Swept are the writes of the pass.
	OrphansFreed, Adopted, Swept int
	// Conflicts are kept PSTS weps whose address another pod holds;
	// Corrupt the claims nobody can trust. Both are reported, never fixed.
	Conflicts, Corrupt int
}

// minPassGap is the least time between two passes that events trigger.
const minPassGap = time.Second

// NewKeeper builds the Keeper. It registers the three informers with their
// factories; the caller starts them. The config must pass Validate.
func NewKeeper(cfg Config, deps KeeperDeps, log *slog.Logger, reg prometheus.Registerer) (*Keeper, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.CCE == nil || deps.Claims == nil || deps.Weps == nil || deps.Spreads == nil {
		return nil, errors.New("ipclaim.NewKeeper: the CCE client and the claim, wep and PSTS informers are required")
	}
	if deps.Clock == nil {
		deps.Clock = clock.RealClock{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Events name cce.io objects: the recorder needs their kinds.
	scheme := runtime.NewScheme()
	if err := kubescheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := cce.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return &Keeper{
		cfg:     cfg,
		deps:    deps,
		claims:  deps.CCE.CceV1alpha1().IPClaims(),
		claimsL: deps.Claims.Lister(),
		wepsL:   deps.Weps.Lister(),
		spreadL: deps.Spreads.Lister(),
		synced: []cache.InformerSynced{
			deps.Claims.Informer().HasSynced, deps.Weps.Informer().HasSynced, deps.Spreads.Informer().HasSynced,
		},
		log:       log,
		metrics:   newKeeperMetrics(reg),
		scheme:    scheme,
		syncState: newPassState(),
	}, nil
}

// Run waits for the caches, then passes over every claim and wep at once,
// every KeeperPeriod and after the events that may need it (a kept PSTS wep
// written, a claim deleted, a PSTS deleted or its subnets changed), at most
// one pass per second. It blocks until ctx ends and returns nil then; it
// returns after every goroutine it started has exited.
func (k *Keeper) Run(ctx context.Context) error {
	events, stopEvents := k.recorder(ctx)
	defer stopEvents()
	trigger := make(chan struct{}, 1)
	remove, err := k.watch(trigger)
	defer remove()
	if err != nil {
		return err
	}
	if !cache.WaitForCacheSync(ctx.Done(), k.synced...) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("ipclaim keeper: caches did not sync")
	}
	k.log.Info("ipclaim keeper started", "period", k.cfg.KeeperPeriod, "orphanGrace", k.cfg.OrphanGrace)
	tick := k.deps.Clock.NewTicker(k.cfg.KeeperPeriod)
	defer tick.Stop()
	st := newPassState()
	for {
		k.passAndCount(ctx, events, st)
		last := k.deps.Clock.Now()
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C():
		case <-trigger:
			if gap := minPassGap - k.deps.Clock.Since(last); gap > 0 {
				select {
				case <-ctx.Done():
					return nil
				case <-k.deps.Clock.After(gap):
				}
			}
		}
	}
}

// Sync is one pass, with the events going to KeeperDeps.Events (or
// nowhere); like Run's passes, it reports each problem once across calls.
// The caches must have synced. Calls must not overlap (Run's passes may:
// Run has its own record of what it reported).
func (k *Keeper) Sync(ctx context.Context) (Report, error) {
	for _, synced := range k.synced {
		if !synced() {
			return Report{}, errors.New("ipclaim keeper: caches not synced")
		}
	}
	var events record.EventRecorder = &record.FakeRecorder{}
	if k.deps.Events != nil {
		events = k.deps.Events
	}
	return k.pass(ctx, events, k.syncState)
}

func (k *Keeper) passAndCount(ctx context.Context, events record.EventRecorder, st *passState) {
	r, err := k.pass(ctx, events, st)
	if err != nil && ctx.Err() == nil {
		k.metrics.passes.WithLabelValues("error").Inc()
		k.log.Warn("ipclaim keeper: pass incomplete; the next one retries", "err", err)
		return
	}
	k.metrics.passes.WithLabelValues("ok").Inc()
	if r != (Report{}) {
		k.log.Debug("ipclaim keeper: pass", "report", r)
	}
}

// recorder is KeeperDeps.Events, or a recorder to KeeperDeps.Kube that
// lives as long as Run, or none.
func (k *Keeper) recorder(ctx context.Context) (record.EventRecorder, func()) {
	if k.deps.Events != nil {
		return k.deps.Events, func() {}
	}
	if k.deps.Kube == nil {
		return &record.FakeRecorder{}, func() {}
	}
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: k.deps.Kube.CoreV1().Events("")})
	return b.NewRecorder(k.scheme, corev1.EventSource{Component: "cce-ipam-ipclaim"}), b.Shutdown
}

// watch pokes trigger on the events that may need a pass before the next
// period; remove takes the handlers off again.
func (k *Keeper) watch(trigger chan<- struct{}) (remove func(), err error) {
	poke := func() {
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	type reg struct {
		inf cache.SharedIndexInformer
		r   cache.ResourceEventHandlerRegistration
	}
	var regs []reg
	remove = func() {
		for _, r := range regs {
			_ = r.inf.RemoveEventHandler(r.r)
		}
	}
	add := func(inf cache.SharedIndexInformer, h cache.ResourceEventHandler) error {
		r, err := inf.AddEventHandler(h)
		if err != nil {
			return fmt.Errorf("ipclaim keeper: watch: %w", err)
		}
		regs = append(regs, reg{inf, r})
		return nil
	}
	keptWep := func(obj any) {
		if w, ok := obj.(*cce.WorkloadEndpoint); ok && kept(w) {
			poke()
		}
	}
	err = errors.Join(
		add(k.deps.Weps.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc: keptWep, UpdateFunc: func(_, obj any) { keptWep(obj) },
		}),
		add(k.deps.Claims.Informer(), cache.ResourceEventHandlerFuncs{DeleteFunc: func(any) { poke() }}),
		add(k.deps.Spreads.Informer(), cache.ResourceEventHandlerFuncs{
			UpdateFunc: func(old, obj any) {
				o, ok1 := old.(*cce.PodSubnetTopologySpread)
				n, ok2 := obj.(*cce.PodSubnetTopologySpread)
				if !ok1 || !ok2 || !slices.Equal(slices.Sorted(maps.Keys(o.Spec.Subnets)), slices.Sorted(maps.Keys(n.Spec.Subnets))) {
					poke()
				}
			},
			DeleteFunc: func(any) { poke() },
		}),
	)
	return remove, err
}

// kept reports whether a wep is a PSTS wep whose pod keeps its address
// (Fixed, or Custom with reuse): the weps the Keeper adopts.
func kept(w *cce.WorkloadEndpoint) bool {
	return w.Spec.SubnetTopologyReference != "" && (w.IsFixedStatefulSet() || w.IsCustomReuse())
}

// pass is one go over the caches: report corrupt claims, free orphans,
// adopt kept weps, sweep unlisted subnets. Every write is a
// compare-and-swap (or an exclusive Create, or a Delete with a UID and
// resourceVersion precondition) on what the cache showed, so a stale cache
// costs a refused request, never a wrong write.
func (k *Keeper) pass(ctx context.Context, events record.EventRecorder, st *passState) (Report, error) {
	claims, err := k.claimsL.List(labels.Everything())
	if err != nil {
		return Report{}, err
	}
	weps, err := k.wepsL.List(labels.Everything())
	if err != nil {
		return Report{}, err
	}
	spreads, err := k.spreadL.List(labels.Everything())
	if err != nil {
		return Report{}, err
	}
	now := k.deps.Clock.Now()
	var r Report
	r.Corrupt = k.reportCorrupt(claims, events, st)
	errs := []error{
		k.freeOrphans(ctx, claims, now, &r),
		k.adopt(ctx, weps, now, events, st, &r),
		k.sweep(ctx, claims, spreads, now, &r),
	}
	k.metrics.conflicts.Set(float64(r.Conflicts))
	k.metrics.corrupt.Set(float64(r.Corrupt))
	return r, errors.Join(errs...)
}

// passState is what passes remember: the problems already reported, so that
// each is logged and made an event once, not every period.
type passState struct {
	corrupt   map[string]string // claim name -> the problem reported
	conflicts map[string]string // wep namespace/name -> the conflict reported
}

func newPassState() *passState {
	return &passState{corrupt: map[string]string{}, conflicts: map[string]string{}}
}

// report records a problem under key in seen and says whether it is new;
// keys not in current (this pass's problems) are forgotten by forget.
func report(seen map[string]string, key, problem string) bool {
	if seen[key] == problem {
		return false
	}
	seen[key] = problem
	return true
}

func forget(seen map[string]string, current map[string]bool) {
	for key := range seen {
		if !current[key] {
			delete(seen, key)
		}
	}
}
