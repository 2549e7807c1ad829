package ipam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/ipamcore/cachetrim"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	ccescheme "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned/scheme"
	cceinformers "github.com/cce-ipam/sharded/ipamcore/generated/informers/externalversions"
	ccelisters "github.com/cce-ipam/sharded/ipamcore/generated/listers/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/podip"
	"github.com/cce-ipam/sharded/ipamcore/pool"
)

// Deps are the IPAM's connections to the outside.
type Deps struct {
	Kube  kubernetes.Interface
	CCE   cceclient.Interface
	Cloud cloud.Provider
	// Clock defaults to the real clock; tests pass a fake.
	Clock clock.WithTicker
	// Fence, when set, is asked before every write for a node (a
	// WorkloadEndpoint, an IPPool status, a cloud mutation): the shard layer
	// answers no once this replica may no longer act for the node. Nil means
	// a single replica that always may.
	Fence Fence
	// IsLeader, when set, gates the cluster-wide GC duties (IPPools of
	// deleted nodes) to one replica. Nil means always.
	IsLeader func() bool
	// FixedIPMover, when set, frees a fixed IP on its old node when that
	// node is served by another replica (the shard router forwards the
	// call to the node's owner). Nil: a single replica serving every node.
	FixedIPMover FixedIPMover
	// Claims, when set, is the exclusive-subnet address ledger that PSTS
	// pods of the Fixed, Manual and Custom strategies take their addresses
	// through (PSTS.md, I7). Without it those strategies are refused;
	// Elastic needs none.
	Claims ClaimLedger
	// WatchKube, when set, carries the served nodes' pod watches (one per
	// node), so that starting them on a takeover does not spend the CNI
	// path's client-side rate limit. Default: Kube.
	WatchKube kubernetes.Interface
}

// Fence is the shard layer's answer to "may this replica still write for
// this node, and until when". It must be cheap: it is on the allocation path.
type Fence interface {
	MayAct(node string) (until time.Time, err error)
}

// ErrFenced wraps a Fence's refusal. It is a podip.ErrNotHere: the node's
// owner may be another replica now.
var ErrFenced = podip.NotHere("fenced: this replica may no longer act for the node")

// ErrNodeNotServed is returned for a pod whose node this IPAM does not serve
// (yet): the caller routes the request to the node's owner or retries. It is
// a podip.ErrNotHere.
var ErrNodeNotServed = podip.NotHere("node not served by this replica")

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
	known   *knownWEPs // the weps this replica wrote last, for the CNI path (known.go)
	// finishing holds the slots of the releases finished after their DEL was
	// answered (pendingFinish); finishPendingMax bounds those pending per node.
	finishing        chan struct{}
	finishPendingMax int

	kubeInformers informers.SharedInformerFactory
	cceInformers  cceinformers.SharedInformerFactory
	nodes         corelisters.NodeLister
	statefulSets  appslisters.StatefulSetLister
	subnets       ccelisters.SubnetLister
	spreads       ccelisters.PodSubnetTopologySpreadLister

	gcMu         sync.Mutex
	leakSuspects map[netip.Addr]time.Time // first seen assigned without a wep
	ghostHeld    map[netip.Addr]string    // address → node, held for a ghost wep (ghost.go); under gcMu

	wepSel wepSelector // whether the wep CRD has the spec.node selectable field (wepselect.go)

	prefetched prefetchSlot // a takeover's ENI list read ahead (prefetch.go)

	// createWithAddrsRefused: the cloud refused an ENI created with
	// secondary addresses as an invalid request; new ENIs bring none.
	createWithAddrsRefused atomic.Bool

	broadcaster record.EventBroadcaster
	events      record.EventRecorder

	mu      sync.Mutex
	runCtx  context.Context // set once Run's caches have synced
	ready   chan struct{}
	served  map[string]*node
	workers sync.WaitGroup
}

// New builds an IPAM; it starts nothing (Run does). The config must pass
// Validate (start from DefaultConfig).
func New(cfg Config, deps Deps, log *slog.Logger, reg prometheus.Registerer) (*IPAM, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("ipam config: %w", err)
	}
	if deps.Kube == nil || deps.CCE == nil || deps.Cloud == nil {
		return nil, errors.New("ipam: Kube, CCE and Cloud are required")
	}
	if deps.Clock == nil {
		deps.Clock = clock.RealClock{}
	}
	if deps.WatchKube == nil {
		deps.WatchKube = deps.Kube
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if CNIModeServesBBC(cfg.CNIMode) {
		log.Warn("BBC CNI mode: BCC nodes are served, BBC pods' requests are refused as an unsupported IP type",
			"cniMode", cfg.CNIMode)
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
		known:   newKnownWEPs(),
		ready:   make(chan struct{}),
		served:  map[string]*node{},

		finishing:        make(chan struct{}, finishSlots),
		finishPendingMax: maxFinishPendingPerNode,

		leakSuspects: map[netip.Addr]time.Time{},
	}
	if reg != nil {
		if err := reg.Register(newPoolCollector(i)); err != nil {
			return nil, fmt.Errorf("register pool metrics: %w", err)
		}
	}
	i.broadcaster = record.NewBroadcaster(record.WithContext(context.Background()))
	i.events = i.broadcaster.NewRecorder(eventScheme, corev1.EventSource{Component: "cce-ipam"})
	// No periodic resync: every decision re-reads what it needs, and the
	// pool workers have their own ticker. Cluster-wide informers only for
	// what every replica needs whole (nodes for the ring, StatefulSets and
	// Subnets, few and small, slimmed to what is read); pods are watched per
	// served node (nodeCache), WorkloadEndpoints read live, so memory follows
	// the replica's share.
	i.kubeInformers = informers.NewSharedInformerFactoryWithOptions(deps.Kube, 0, informers.WithTransform(slimClusterObject))
	i.cceInformers = cceinformers.NewSharedInformerFactoryWithOptions(deps.CCE, 0, cceinformers.WithTransform(cachetrim.StripManagedFields))
	i.nodes = i.kubeInformers.Core().V1().Nodes().Lister()
	i.statefulSets = i.kubeInformers.Apps().V1().StatefulSets().Lister()
	i.subnets = i.cceInformers.Cce().V1alpha1().Subnets().Lister()
	i.spreads = i.cceInformers.Cce().V1alpha1().PodSubnetTopologySpreads().Lister()
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
	stopped := make([]*node, 0, len(i.served))
	for name, n := range i.served {
		n.stop()
		stopped = append(stopped, n)
		delete(i.served, name)
	}
	i.mu.Unlock()
	i.workers.Wait()
	for _, n := range stopped {
		n.cache.stop()
	}
	return nil
}

// Ready is closed once Run's caches have synced.
func (i *IPAM) Ready() <-chan struct{} { return i.ready }

// ServeNode starts serving a node: it rebuilds the node's state from the
// cloud's ENIs and a quorum read of its WorkloadEndpoints, then starts the
// node's pool worker. Serving a node twice is a no-op.
func (i *IPAM) ServeNode(ctx context.Context, name string) error {
	return i.ServeNodes(ctx, []string{name})[name]
}

// ServeNodes serves several nodes at once, as a takeover does: the cloud's
// ENIs come from one VPC-wide paginated list (one call per 1000 ENIs, not one
// per node), each node's WorkloadEndpoints from a quorum read. It returns the
// nodes that could not be served, with why; the others are served.
func (i *IPAM) ServeNodes(ctx context.Context, names []string) map[string]error {
	errs := map[string]error{}
	select {
	case <-i.ready:
	case <-ctx.Done():
		for _, name := range names {
			errs[name] = ctx.Err()
		}
		return errs
	}
	runCtx, todo := i.unserved(names)
	if runCtx.Err() != nil {
		for _, name := range todo {
			errs[name] = ErrNotRunning
		}
		return errs
	}
	if len(todo) == 0 {
		return errs
	}
	// Nodes a list read ahead covers go first, without waiting for the
	// list the others need: the dead replica's nodes, whose pods wait,
	// beside a survivor's node the balance moved here (prefetch.go).
	listed, covered, rest := i.splitPrefetched(todo)
	if len(covered) > 0 {
		maps.Copy(errs, i.serveBatch(ctx, runCtx, covered, listed))
	}
	if len(rest) > 0 {
		maps.Copy(errs, i.serveBatch(ctx, runCtx, rest, nil))
	}
	return errs
}

// serveBatch rebuilds and serves todo from listed, the ENIs by instance
// (nil: listed now, one VPC-wide list for all).
func (i *IPAM) serveBatch(ctx, runCtx context.Context, todo []string, listed map[string][]cloud.ENI) map[string]error {
	errs := map[string]error{}
	start := i.deps.Clock.Now()
	byInstance, claims, err := i.takeoverReads(ctx, todo, listed)
	if err != nil {
		for _, name := range todo {
			i.metrics.rebuilds.WithLabelValues("error").Inc()
			errs[name] = fmt.Errorf("serve node %s: %w", name, err)
		}
		return errs
	}
	errs = i.rebuildAll(ctx, runCtx, todo, byInstance, claims, start)
	var served []string
	for _, name := range todo {
		if errs[name] == nil {
			served = append(served, name)
		}
	}
	if len(served) > 0 {
		i.workers.Add(1)
		go func() {
			defer i.workers.Done()
			i.settleTakeover(runCtx, served, start)
		}()
	}
	return errs
}

// unserved returns Run's context and those of names not served yet.
func (i *IPAM) unserved(names []string) (context.Context, []string) {
	i.mu.Lock()
	defer i.mu.Unlock()
	var todo []string
	for _, name := range names {
		if _, ok := i.served[name]; !ok {
			todo = append(todo, name)
		}
	}
	return i.runCtx, todo
}

// takeoverReads reads what the nodes are rebuilt from: their ENIs by
// instance (unless listed, a list read ahead, holds them), and (for many
// nodes) their wep claims in one bulk read; nil claims mean each node reads
// its own.
func (i *IPAM) takeoverReads(ctx context.Context, todo []string,
	listed map[string][]cloud.ENI) (map[string][]cloud.ENI, map[string][]datastore.Claim, error) {
	// The weps must be read now, after the caller won the nodes, so that
	// they hold every commit of the previous owner. The ENI list is trusted
	// for no more than a lagging read (prefetch.go), so one read ahead of
	// the takeover will do; otherwise both run side by side (at 3,000 nodes
	// each takes seconds: the ENI list paced at ListENIs' 1/s, the weps 90
	// pages).
	var (
		byInstance = listed
		listErr    error
		claims     map[string][]datastore.Claim
		reads      sync.WaitGroup
	)
	if byInstance == nil {
		reads.Add(1)
		go func() {
			defer reads.Done()
			// One list for all. Pods wait on it: it goes ahead of this
			// replica's share of the ListENIs limit (see cloud.Urgent).
			var enis []cloud.ENI
			enis, listErr = i.deps.Cloud.ListENIs(cloud.Urgent(ctx), cloud.ListENIsOptions{VPCID: i.cfg.VPCID,
				NamePrefix: i.cfg.ClusterID + "/", Instances: i.instancesOf(todo)})
			byInstance = byInstanceOf(enis)
		}()
	}
	// The weps likewise: for many nodes one read of them all, rather than
	// a server-side scan per node.
	// Without the spec.node field selector (a reference CRD) a per-node
	// read is a full scan too: then any takeover of several nodes reads once.
	if len(todo) >= bulkRebuildNodes || (len(todo) > 1 && i.wepSel.unsupported(i.deps.Clock.Now())) {
		set := make(map[string]bool, len(todo))
		for _, name := range todo {
			set[name] = true
		}
		var err error
		if claims, err = i.bulkClaims(ctx, set); err != nil {
			i.log.Warn("bulk read of WorkloadEndpoints failed; reading them node by node", "nodes", len(todo), "err", err)
			claims = nil
		}
	}
	reads.Wait()
	if listErr != nil {
		return nil, nil, fmt.Errorf("list ENIs: %w", listErr)
	}
	return byInstance, claims, nil
}

// rebuildAll rebuilds and serves the nodes, rebuildConcurrency at a time,
// and returns those that failed.
func (i *IPAM) rebuildAll(ctx, runCtx context.Context, todo []string, byInstance map[string][]cloud.ENI,
	claims map[string][]datastore.Claim, start time.Time) map[string]error {
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		sem  = make(chan struct{}, rebuildConcurrency)
		errs = map[string]error{}
	)
	for _, name := range todo {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := i.serveRebuilt(ctx, runCtx, name, byInstance, claims[name], start)
			if err != nil {
				mu.Lock()
				errs[name] = err
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errs
}

// rebuildConcurrency bounds the quorum reads of a takeover.
const rebuildConcurrency = 8

// bulkRebuildNodes is the takeover size from which the weps are read in one
// bulk read rather than per node. A per-node read makes the server scan
// every wep but sends only the node's; the bulk read sends them all once.
// Roughly where the two cost the same with ~30 pods per node.
const bulkRebuildNodes = 32

func (i *IPAM) serveRebuilt(ctx, runCtx context.Context, name string, byInstance map[string][]cloud.ENI,
	claims []datastore.Claim, start time.Time) error {
	n, err := i.rebuild(ctx, name, byInstance, claims, start)
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
	n.cache = startNodeCache(runCtx, name, i.deps.WatchKube)
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

// StopServingNode stops taking calls for the node, waits for the work in
// flight on it (CNI calls, GC and the ENI sync's work for it, whose contexts
// it ends: see acquireWork) and the pool worker, and drops the node's state.
// Other nodes are untouched. Stopping an unserved node is a no-op. After it returns this
// replica writes nothing more for the node, so another may take it over.
func (i *IPAM) StopServingNode(name string) {
	i.mu.Lock()
	n, ok := i.served[name]
	delete(i.served, name)
	i.mu.Unlock()
	if !ok {
		return
	}
	n.stop()
	n.inflight.Wait()
	<-n.done
	n.cache.stop()
	_, _ = i.store.RemoveNode(name)
	i.known.forgetNode(name)
	i.log.Info("stopped serving node", "node", name)
}

// acquire returns a served node for one CNI call and registers the call, so
// that StopServingNode waits for it; done must be called.
func (i *IPAM) acquire(name string) (*node, func(), bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	n, ok := i.served[name]
	if !ok {
		return nil, nil, false
	}
	n.inflight.Add(1)
	return n, n.inflight.Done, true
}

// mayAct asks the fence (if any) whether a write for the node may go ahead.
func (i *IPAM) mayAct(node string) error {
	_, err := i.mayActUntil(node)
	return err
}

// mayActUntil also returns when the permission ends (zero: never), for
// writes that must not be sent after it.
func (i *IPAM) mayActUntil(node string) (time.Time, error) {
	if i.deps.Fence == nil {
		return time.Time{}, nil
	}
	until, err := i.deps.Fence.MayAct(node)
	if err != nil {
		i.metrics.fencedByReplica.Inc()
		// The fence's reason is text: callers branch on ErrFenced, and the
		// shard layer's own errors do not leak through the IPAM.
		return time.Time{}, fmt.Errorf("%w %s: %v", ErrFenced, node, err) //nolint:errorlint // see above
	}
	return until, nil
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

// PodFromCache returns the pod as the served node's watch has it (for
// diagnostics and tests of cache lag); ok=false when the node is not served
// or its watch has not seen the pod.
func (i *IPAM) PodFromCache(node, namespace, name string) (*corev1.Pod, bool) {
	n, ok := i.node(node)
	if !ok {
		return nil, false
	}
	return n.cache.pod(namespace, name)
}

// cachedPod looks a pod up in the watch of the node it is said to be on.
func (i *IPAM) cachedPod(node, namespace, name string) (*corev1.Pod, bool) {
	if node == "" {
		return nil, false
	}
	return i.PodFromCache(node, namespace, name)
}

// NodeInformer is the IPAM's shared Node informer, for the shard layer to
// follow the same cache (started by Run).
func (i *IPAM) NodeInformer() cache.SharedIndexInformer {
	return i.kubeInformers.Core().V1().Nodes().Informer()
}

// eventScheme knows the objects the IPAM's Events are about: Pods and Nodes,
// and the cce.io resources (a Subnet the cloud says is full). The recorder
// drops an Event about a kind its scheme does not know.
var eventScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(scheme.AddToScheme(s))
	utilruntime.Must(ccescheme.AddToScheme(s))
	return s
}()
