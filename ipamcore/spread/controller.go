package spread

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/cachetrim"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	ccescheme "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned/scheme"
	cceinformers "github.com/cce-ipam/sharded/ipamcore/generated/informers/externalversions"
	ccelisters "github.com/cce-ipam/sharded/ipamcore/generated/listers/cce/v1alpha1"
)

// Deps are the clients the controllers use.
type Deps struct {
	// Kube writes events.
	Kube kubernetes.Interface
	// CCE reads and writes the cce.io objects.
	CCE cceclient.Interface
	// Metadata watches the pods' metadata (the PSTS annotation).
	Metadata metadata.Interface
}

// Controller runs the PSTS status and the PSTT controllers.
type Controller struct {
	cfg     Config
	deps    Deps
	log     *slog.Logger
	metrics *metrics
}

// New builds the controllers; Run starts them. It starts nothing and may be
// Run again after a Run returned (a new term of leadership).
func New(cfg Config, deps Deps, log *slog.Logger, reg prometheus.Registerer) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Kube == nil || deps.CCE == nil || deps.Metadata == nil {
		return nil, errors.New("spread: Kube, CCE and Metadata clients are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Controller{cfg: cfg, deps: deps, log: log, metrics: newMetrics(reg)}, nil
}

// run is one Run: the caches, queues and recorder of a term of leadership.
type run struct {
	*Controller
	events record.EventRecorder

	spreads   ccelisters.PodSubnetTopologySpreadLister
	spreadIdx cache.Indexer
	tables    ccelisters.PodSubnetTopologySpreadTableLister
	tableIdx  cache.Indexer
	subnets   ccelisters.SubnetLister
	weps      cache.Indexer
	pods      cache.Indexer

	statusQ workqueue.TypedRateLimitingInterface[string]
	tableQ  workqueue.TypedRateLimitingInterface[string]
}

// Run starts the informers, waits for their caches, reconciles every PSTS
// and table (informer adds, then events and every ResyncPeriod) and blocks
// until ctx ends; it returns after every goroutine it started has exited.
// Only one replica runs it: the leader.
func (c *Controller) Run(ctx context.Context) error {
	// Not stopped by ctx: a reconcile ending after ctx may still record;
	// the broadcaster stops once every worker has returned.
	broadcaster := record.NewBroadcaster(record.WithContext(context.WithoutCancel(ctx)))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.deps.Kube.CoreV1().Events("")})
	defer broadcaster.Shutdown()

	r := &run{
		Controller: c,
		events:     broadcaster.NewRecorder(ccescheme.Scheme, corev1.EventSource{Component: "cce-ipam-spread"}),
		statusQ: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "psts-status"}),
		tableQ: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "pstt"}),
	}

	factory := cceinformers.NewSharedInformerFactoryWithOptions(c.deps.CCE, 0, cceinformers.WithTransform(cachetrim.StripManagedFields))
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stop()
		r.statusQ.ShutDown()
		r.tableQ.ShutDown()
		wg.Wait()
		factory.Shutdown()
	}()
	informers, own, err := r.informers(factory)
	if err != nil {
		return err
	}
	factory.Start(runCtx.Done())
	for _, inf := range own {
		wg.Go(func() { inf.RunWithContext(runCtx) })
	}
	for _, inf := range informers {
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			c.log.Info("spread controllers stopped before their caches synced")
			return nil
		}
	}
	c.log.Info("spread controllers started", "workers", c.cfg.Workers)

	for range c.cfg.Workers {
		wg.Go(func() { r.work(runCtx, controllerStatus, r.statusQ, r.syncStatus) })
		wg.Go(func() { r.work(runCtx, controllerTable, r.tableQ, r.syncTable) })
	}
	wg.Go(func() { r.resync(runCtx) })
	<-ctx.Done()
	return nil
}

// informers builds the informers and their indexes, and routes their
// events to the queues. It returns them all, and among them those the
// factory does not run (the filtered wep and pod informers).
func (r *run) informers(factory cceinformers.SharedInformerFactory) (all, own []cache.SharedIndexInformer, _ error) {
	v1 := factory.Cce().V1alpha1()
	spreads := v1.PodSubnetTopologySpreads()
	tables := v1.PodSubnetTopologySpreadTables()
	subnets := v1.Subnets()
	weps := cache.NewSharedIndexInformerWithOptions(wepListWatch(r.deps.CCE), &cce.WorkloadEndpoint{},
		cache.SharedIndexInformerOptions{Indexers: cache.Indexers{byPSTS: indexByPSTS}})
	pods := cache.NewSharedIndexInformerWithOptions(podListWatch(r.deps.Metadata), &metav1.PartialObjectMetadata{},
		cache.SharedIndexInformerOptions{Indexers: cache.Indexers{byPSTS: indexByPSTS}})
	if err := errors.Join(
		spreads.Informer().AddIndexers(cache.Indexers{bySubnet: indexPSTSBySubnet, byOwner: indexPSTSByOwner}),
		tables.Informer().AddIndexers(cache.Indexers{byEntry: indexTableByEntry}),
		weps.SetTransform(stripWEP),
		pods.SetTransform(stripPod),
	); err != nil {
		return nil, nil, fmt.Errorf("spread: informers: %w", err)
	}
	r.spreads, r.spreadIdx = spreads.Lister(), spreads.Informer().GetIndexer()
	r.tables, r.tableIdx = tables.Lister(), tables.Informer().GetIndexer()
	r.subnets = subnets.Lister()
	r.weps, r.pods = weps.GetIndexer(), pods.GetIndexer()

	handlers := []struct {
		inf cache.SharedIndexInformer
		on  func(obj any)
	}{
		{spreads.Informer(), r.onSpread},
		{tables.Informer(), r.onTable},
		{subnets.Informer(), r.onSubnet},
		{weps, r.onPSTSMember},
		{pods, r.onPSTSMember},
	}
	for _, h := range handlers {
		on := h.on
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(obj any) { on(obj) },
			UpdateFunc: func(old, obj any) {
				on(old)
				on(obj)
			},
			DeleteFunc: func(obj any) { on(unwrap(obj)) },
		}); err != nil {
			return nil, nil, fmt.Errorf("spread: event handler: %w", err)
		}
		all = append(all, h.inf)
	}
	return all, []cache.SharedIndexInformer{weps, pods}, nil
}

// onSpread: a PSTS's status is its own, and the tables that own it or
// list its name show it.
func (r *run) onSpread(obj any) {
	p, ok := obj.(*cce.PodSubnetTopologySpread)
	if !ok {
		return
	}
	key := p.Namespace + "/" + p.Name
	r.statusQ.Add(key)
	if ref := tableRef(p); ref != nil {
		r.tableQ.Add(p.Namespace + "/" + ref.Name)
	}
	tables, _ := r.tableIdx.IndexKeys(byEntry, key)
	for _, t := range tables {
		r.tableQ.Add(t)
	}
}

func (r *run) onTable(obj any) {
	if t, ok := obj.(*cce.PodSubnetTopologySpreadTable); ok {
		r.tableQ.Add(t.Namespace + "/" + t.Name)
	}
}

// onSubnet requeues the PSTS objects that list the subnet.
func (r *run) onSubnet(obj any) {
	sn, ok := obj.(*cce.Subnet)
	if !ok || sn.Namespace != cce.SubnetNamespace {
		return
	}
	keys, _ := r.spreadIdx.IndexKeys(bySubnet, sn.Name)
	for _, k := range keys {
		r.statusQ.Add(k)
	}
}

// onPSTSMember requeues the PSTS a wep or pod names.
func (r *run) onPSTSMember(obj any) {
	if k := pstsKey(obj); k != "" {
		r.statusQ.Add(k)
	}
}

// resync requeues every PSTS and table each ResyncPeriod.
func (r *run) resync(ctx context.Context) {
	t := time.NewTicker(r.cfg.ResyncPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		spreads, _ := r.spreads.List(labels.Everything())
		for _, p := range spreads {
			r.statusQ.Add(p.Namespace + "/" + p.Name)
		}
		tables, _ := r.tables.List(labels.Everything())
		for _, t := range tables {
			r.tableQ.Add(t.Namespace + "/" + t.Name)
		}
	}
}

// work reconciles keys of q until q shuts down: an error requeues the key
// with backoff, success forgets its failures.
func (r *run) work(ctx context.Context, controller string, q workqueue.TypedRateLimitingInterface[string],
	reconcile func(context.Context, string) error) {
	for {
		key, quit := q.Get()
		if quit {
			return
		}
		start := time.Now()
		err := r.reconcileSafely(key, func() error { return reconcile(ctx, key) })
		r.metrics.observe(controller, err, time.Since(start))
		switch {
		case err == nil || ctx.Err() != nil:
			q.Forget(key)
		default:
			level := slog.LevelWarn
			if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
				level = slog.LevelDebug // the caches are behind a write: retried once they caught up
			}
			r.log.Log(ctx, level, "reconcile failed; retrying", "controller", controller, "key", key,
				"retries", q.NumRequeues(key), "err", err)
			q.AddRateLimited(key)
		}
		q.Done(key)
	}
}

// reconcileSafely turns a panic of one reconcile into its error, so that a
// bug met by one object does not stop the leader's controllers.
func (r *run) reconcileSafely(key string, reconcile func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("reconcile panicked", "key", key, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("reconcile of %s panicked: %v", key, p)
		}
	}()
	return reconcile()
}
