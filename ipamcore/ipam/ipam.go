package ipam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	cceinformers "github.com/cce-ipam/sharded/ipamcore/generated/informers/externalversions"
	ccelisters "github.com/cce-ipam/sharded/ipamcore/generated/listers/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/pool"
)

// Deps are the IPAM's connections to the outside.
type Deps struct {
	Kube  kubernetes.Interface
	CCE   cceclient.Interface
	Cloud cloud.Provider
	// Clock defaults to the real clock; tests pass a fake.
	Clock clock.WithTicker
}

// ErrNodeNotServed is returned for a pod whose node this IPAM does not serve
// (yet): the caller routes the request to the node's owner or retries.
var ErrNodeNotServed = errors.New("node not served by this replica")

// ErrNotRunning is returned by ServeNode before Run has synced its caches.
var ErrNotRunning = errors.New("ipam is not running")

// IPAM serves the nodes it is told to serve. Create it with New, start it
// with Run, then add nodes with ServeNode.
type IPAM struct {
	cfg     Config
	poolCfg pool.Config
	deps    Deps
	log     *slog.Logger
	metrics *metrics
	store   *datastore.Store
	podLock keyedMutex

	kubeInformers informers.SharedInformerFactory
	cceInformers  cceinformers.SharedInformerFactory
	pods          corelisters.PodLister
	nodes         corelisters.NodeLister
	statefulSets  appslisters.StatefulSetLister
	weps          ccelisters.WorkloadEndpointLister
	subnets       ccelisters.SubnetLister

	gcMu         sync.Mutex
	leakSuspects map[netip.Addr]time.Time // first seen assigned without a wep

	broadcaster record.EventBroadcaster
	events      record.EventRecorder

	mu      sync.Mutex
	runCtx  context.Context // set once Run's caches have synced
	ready   chan struct{}
	served  map[string]*node
	workers sync.WaitGroup
}

// New builds an IPAM; it starts nothing (Run does).
func New(cfg Config, deps Deps, log *slog.Logger, reg prometheus.Registerer) (*IPAM, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("ipam config: %w", err)
	}
	if deps.Kube == nil || deps.CCE == nil || deps.Cloud == nil {
		return nil, errors.New("ipam: Kube, CCE and Cloud are required")
	}
	if deps.Clock == nil {
		deps.Clock = clock.RealClock{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	store, err := datastore.New(datastore.Config{Cooldown: cfg.Cooldown})
	if err != nil {
		return nil, err
	}
	i := &IPAM{
		cfg:     cfg,
		poolCfg: cfg.poolConfig(),
		deps:    deps,
		log:     log,
		metrics: newMetrics(reg),
		store:   store,
		ready:   make(chan struct{}),
		served:  map[string]*node{},

		leakSuspects: map[netip.Addr]time.Time{},
	}
	if reg != nil {
		if err := reg.Register(newPoolCollector(i)); err != nil {
			return nil, fmt.Errorf("register pool metrics: %w", err)
		}
	}
	i.broadcaster = record.NewBroadcaster(record.WithContext(context.Background()))
	i.events = i.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "cce-ipam"})
	// No periodic resync: every decision re-reads what it needs, and the
	// pool workers have their own ticker.
	i.kubeInformers = informers.NewSharedInformerFactory(deps.Kube, 0)
	i.cceInformers = cceinformers.NewSharedInformerFactory(deps.CCE, 0)
	i.pods = i.kubeInformers.Core().V1().Pods().Lister()
	i.nodes = i.kubeInformers.Core().V1().Nodes().Lister()
	i.statefulSets = i.kubeInformers.Apps().V1().StatefulSets().Lister()
	i.weps = i.cceInformers.Cce().V1alpha1().WorkloadEndpoints().Lister()
	i.subnets = i.cceInformers.Cce().V1alpha1().Subnets().Lister()
	return i, nil
}

// Run starts the informers, marks the IPAM ready once they have synced, and
// blocks until ctx ends; then it stops every pool worker and returns.
func (i *IPAM) Run(ctx context.Context) error {
	i.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: i.deps.Kube.CoreV1().Events("")})
	defer i.broadcaster.Shutdown()
	i.kubeInformers.Start(ctx.Done())
	i.cceInformers.Start(ctx.Done())
	defer i.kubeInformers.Shutdown()
	defer i.cceInformers.Shutdown()
	for typ, ok := range i.kubeInformers.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("ipam: cache of %v did not sync", typ)
		}
	}
	for typ, ok := range i.cceInformers.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("ipam: cache of %v did not sync", typ)
		}
	}
	i.mu.Lock()
	i.runCtx = ctx
	close(i.ready)
	i.mu.Unlock()
	i.log.Info("ipam caches synced")

	i.workers.Add(2)
	go func() {
		defer i.workers.Done()
		i.gcLoop(ctx)
	}()
	go func() {
		defer i.workers.Done()
		i.syncLoop(ctx)
	}()
	<-ctx.Done()
	i.mu.Lock()
	for name, n := range i.served {
		n.stop()
		delete(i.served, name)
	}
	i.mu.Unlock()
	i.workers.Wait()
	return nil
}

// Ready is closed once Run's caches have synced.
func (i *IPAM) Ready() <-chan struct{} { return i.ready }

// ServeNode starts serving a node: it rebuilds the node's state from the
// cloud's ENIs and a quorum read of its WorkloadEndpoints, then starts the
// node's pool worker. Serving a node twice is a no-op.
func (i *IPAM) ServeNode(ctx context.Context, name string) error {
	select {
	case <-i.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	i.mu.Lock()
	if _, ok := i.served[name]; ok {
		i.mu.Unlock()
		return nil
	}
	runCtx := i.runCtx
	i.mu.Unlock()
	if runCtx.Err() != nil {
		return ErrNotRunning
	}

	start := i.deps.Clock.Now()
	n, err := i.rebuild(ctx, name)
	if err != nil {
		i.metrics.rebuilds.WithLabelValues("error").Inc()
		return fmt.Errorf("serve node %s: %w", name, err)
	}
	i.metrics.rebuilds.WithLabelValues("ok").Inc()

	i.mu.Lock()
	defer i.mu.Unlock()
	if _, ok := i.served[name]; ok || runCtx.Err() != nil {
		// Lost a race with another ServeNode, or Run is stopping.
		_, _ = i.store.RemoveNode(name)
		return nil
	}
	i.served[name] = n
	workerCtx, cancel := context.WithCancel(runCtx)
	n.cancel = cancel
	i.workers.Add(1)
	go func() {
		defer i.workers.Done()
		defer close(n.done)
		i.poolWorker(workerCtx, n)
	}()
	i.log.Info("serving node", "node", name, "instance", n.instanceID, "enis", len(i.nodeENIs(name)),
		"duration", i.deps.Clock.Since(start))
	return nil
}

// StopServingNode stops the node's pool worker, waits for it, and drops the
// node's state. Other nodes are untouched. Stopping an unserved node is a
// no-op.
func (i *IPAM) StopServingNode(name string) {
	i.mu.Lock()
	n, ok := i.served[name]
	delete(i.served, name)
	i.mu.Unlock()
	if !ok {
		return
	}
	n.stop()
	<-n.done
	_, _ = i.store.RemoveNode(name)
	i.log.Info("stopped serving node", "node", name)
}

// ServedNodes returns the names of the nodes being served.
func (i *IPAM) ServedNodes() []string {
	i.mu.Lock()
	defer i.mu.Unlock()
	out := make([]string, 0, len(i.served))
	for name := range i.served {
		out = append(out, name)
	}
	return out
}

// Stats returns a served node's pool counters.
func (i *IPAM) Stats(nodeName string) (datastore.NodeStats, error) {
	return i.store.Stats(nodeName, i.deps.Clock.Now())
}

func (i *IPAM) node(name string) (*node, bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	n, ok := i.served[name]
	return n, ok
}

// PodFromCache returns the pod as the IPAM's informer cache has it (for
// diagnostics and tests of cache lag).
func (i *IPAM) PodFromCache(namespace, name string) (*corev1.Pod, error) {
	return i.pods.Pods(namespace).Get(name)
}
