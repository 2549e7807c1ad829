package kubeletsim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// Deps are the simulator's connections to the outside.
type Deps struct {
	// Kube is required.
	Kube kubernetes.Interface
	// CCE writes the node agent's IPPools; optional.
	CCE cceclient.Interface
	// Instances and ENIs are needed by RegisterNodes only.
	Instances InstanceAdder
	ENIs      ENIAPI
}

// Simulator plays the kubelet and the CNI plugin of every node labelled
// LabelSimulator=Config.Name. Create it with New, add nodes with
// RegisterNodes (before or while it runs), and start it with Run.
type Simulator struct {
	cfg     Config
	deps    Deps
	log     *slog.Logger
	metrics *metrics
	counts  counters

	// mu guards placement and pods (the map; a podState is only touched by
	// the worker holding its key, which the queue makes exclusive).
	mu    sync.Mutex
	place *placement
	pods  map[string]*podState

	synced  chan struct{}
	started atomic.Bool
}

// New builds a Simulator; it starts nothing (Run does, once).
func New(cfg Config, deps Deps, log *slog.Logger, reg prometheus.Registerer) (*Simulator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kubeletsim config: %w", err)
	}
	if deps.Kube == nil {
		return nil, errors.New("kubeletsim: Deps.Kube is required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Simulator{
		cfg: cfg, deps: deps, log: log, metrics: newMetrics(reg),
		place: newPlacement(cfg.MaxPodsPerNode), pods: map[string]*podState{},
		synced: make(chan struct{}),
	}
	return s, nil
}

// Synced is closed once Run's informers have synced.
func (s *Simulator) Synced() <-chan struct{} { return s.synced }

// Stats returns a snapshot of the counters.
func (s *Simulator) Stats() Stats {
	c := &s.counts
	c.mu.Lock()
	lastAlloc, lastRel := c.lastAllocErr, c.lastRelErr
	c.mu.Unlock()
	return Stats{
		LastAllocationError: lastAlloc, LastReleaseError: lastRel,
		Binds: c.binds.Load(), BindErrors: c.bindErrors.Load(),
		Allocations: c.allocs.Load(), AllocationErrors: c.allocErrors.Load(),
		Releases: c.releases.Load(), ReleaseErrors: c.releaseErrors.Load(),
		StatusErrors: c.statusErrors.Load(), PodsStarted: c.started.Load(), PodsDeleted: c.deleted.Load(),
		Sandboxes:       int(c.sandboxes.Load()),
		AllocateLatency: c.allocLatency.summary(), StartupLatency: c.startupLatency.summary(),
	}
}

// NodeLoad returns the pods the simulator counts on node.
func (s *Simulator) NodeLoad(node string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.place.load(node)
}

const nodeIndex = "spec.nodeName"

// run-time handles shared by the workers; built by Run.
type runState struct {
	events record.EventRecorder
	cni    rpc.CNIBackendClient
	pods   corelisters.PodLister
	index  cache.Indexer
	queue  workqueue.TypedRateLimitingInterface[string]
}

// Run watches pods and simulated nodes and drives every pod through bind,
// ADD, Running and, on deletion, DEL and removal, with Config.Workers
// workers. It blocks until ctx ends and returns after every goroutine it
// started has exited. Call it once per Simulator.
func (s *Simulator) Run(ctx context.Context) error {
	endpoints := s.cfg.endpoints()
	if len(endpoints) == 0 {
		return errors.New("kubeletsim: Config.CNIEndpoint or CNIEndpoints is required")
	}
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("kubeletsim: Run called twice")
	}
	clients, closeConns, err := dialCNI(endpoints, s.cfg.CNIConnectionPerCall)
	if err != nil {
		return err
	}
	defer closeConns()

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: s.deps.Kube.CoreV1().Events("")})
	defer broadcaster.Shutdown()

	inf, err := s.newInformers()
	if err != nil {
		return err
	}
	rt := &runState{
		events: broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet"}),
		cni:    clients.client(),
		pods:   inf.podFactory.Core().V1().Pods().Lister(),
		index:  inf.pods.GetIndexer(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](s.cfg.RetryBase, s.cfg.RetryMax),
			workqueue.TypedRateLimitingQueueConfig[string]{}),
	}
	defer rt.queue.ShutDown()
	if err := s.addHandlers(rt, inf); err != nil {
		return err
	}

	inf.podFactory.Start(ctx.Done())
	inf.nodeFactory.Start(ctx.Done())
	defer inf.podFactory.Shutdown()
	defer inf.nodeFactory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.pods.HasSynced, inf.nodes.HasSynced) {
		return nil // ctx ended first
	}
	close(s.synced)
	s.log.Info("kubelet simulator running", "name", s.cfg.Name, "cni", endpoints, "workers", s.cfg.Workers)
	s.runWorkers(ctx, rt)
	return nil
}

// dialCNI opens one gRPC connection per endpoint, or with perCall none:
// every call then opens its own; closeConns closes them.
func dialCNI(endpoints []string, perCall bool) (clients spreadClient, closeConns func(), err error) {
	var conns []*grpc.ClientConn
	closeConns = func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
	for _, ep := range endpoints {
		if perCall {
			clients = append(clients, perCallClient{endpoint: ep})
			continue
		}
		conn, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			closeConns()
			return nil, nil, fmt.Errorf("kubeletsim: CNI endpoint %s: %w", ep, err)
		}
		conns = append(conns, conn)
		clients = append(clients, rpc.NewCNIBackendClient(conn))
	}
	return clients, closeConns, nil
}

// simInformers watch the pods of Config.Namespace (indexed by node) and the
// nodes labelled for this simulator, without managed fields.
type simInformers struct {
	podFactory, nodeFactory informers.SharedInformerFactory
	pods, nodes             cache.SharedIndexInformer
}

func (s *Simulator) newInformers() (simInformers, error) {
	stripManaged := func(obj any) (any, error) {
		if m, err := meta.Accessor(obj); err == nil {
			m.SetManagedFields(nil)
		}
		return obj, nil
	}
	var inf simInformers
	inf.podFactory = informers.NewSharedInformerFactoryWithOptions(s.deps.Kube, 0,
		informers.WithNamespace(s.cfg.Namespace), informers.WithTransform(stripManaged))
	inf.nodeFactory = informers.NewSharedInformerFactoryWithOptions(s.deps.Kube, 0,
		informers.WithTransform(stripManaged),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = labels.Set{LabelSimulator: s.cfg.Name}.String()
		}))
	inf.pods = inf.podFactory.Core().V1().Pods().Informer()
	if err := inf.pods.AddIndexers(cache.Indexers{nodeIndex: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			return []string{p.Spec.NodeName}, nil
		}
		return nil, nil
	}}); err != nil {
		return inf, err
	}
	inf.nodes = inf.nodeFactory.Core().V1().Nodes().Informer()
	return inf, nil
}

// addHandlers queues every pod event, and tracks the simulated nodes: a
// node that appears (or is labelled) joins the placement and its pods are
// looked at again; one that goes (or loses the label) leaves it.
func (s *Simulator) addHandlers(rt *runState, inf simInformers) error {
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			rt.queue.Add(key)
		}
	}
	if _, err := inf.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		DeleteFunc: enqueue,
		UpdateFunc: func(_, cur any) { enqueue(cur) },
	}); err != nil {
		return err
	}
	nodeEvent := func(obj any, present bool) {
		n := nodeOf(obj)
		if n == nil {
			return
		}
		// The list is filtered by label; a watch may not be, and a label
		// removed by an update ends the simulation of the node.
		present = present && n.Labels[LabelSimulator] == s.cfg.Name
		name := n.Name
		s.mu.Lock()
		if present {
			s.place.addNode(name)
		} else {
			s.place.removeNode(name)
		}
		s.mu.Unlock()
		// Pods bound before the node was known were skipped: look again.
		pods, _ := rt.index.ByIndex(nodeIndex, name)
		for _, p := range pods {
			enqueue(p)
		}
	}
	_, err := inf.nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { nodeEvent(obj, true) },
		UpdateFunc: func(_, cur any) { nodeEvent(cur, nodeDeletionTimestamp(cur) == nil) },
		DeleteFunc: func(obj any) { nodeEvent(obj, false) },
	})
	return err
}

// runWorkers runs the node-lease loop and Config.Workers sync workers until
// ctx ends, then shuts the queue down and waits for them.
func (s *Simulator) runWorkers(ctx context.Context, rt *runState) {
	var wg sync.WaitGroup
	if s.cfg.NodeLeasePeriod > 0 {
		wg.Go(func() { s.leaseLoop(ctx, s.cfg.NodeLeasePeriod) })
	}
	for range s.cfg.Workers {
		wg.Go(func() {
			for s.processNext(ctx, rt) {
			}
		})
	}
	<-ctx.Done()
	rt.queue.ShutDown()
	wg.Wait()
}

func (s *Simulator) processNext(ctx context.Context, rt *runState) bool {
	key, shutdown := rt.queue.Get()
	if shutdown {
		return false
	}
	defer rt.queue.Done(key)
	after, err := s.sync(ctx, rt, key)
	switch {
	case ctx.Err() != nil:
	case err != nil:
		s.log.Debug("pod sync failed; backing off", "pod", key, "retries", rt.queue.NumRequeues(key), "err", err)
		rt.queue.AddRateLimited(key)
	case after > 0:
		rt.queue.Forget(key)
		rt.queue.AddAfter(key, after)
	default:
		rt.queue.Forget(key)
	}
	return true
}

// ADD and DEL calls of the simulated CNI plugin.

func (s *Simulator) allocate(ctx context.Context, rt *runState, namespace, name, containerID, node string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CNITimeout)
	defer cancel()
	start := time.Now()
	reply, err := rt.cni.AllocateIP(ctx, &rpc.AllocateIPRequest{
		K8SPodName: name, K8SPodNamespace: namespace, K8SPodInfraContainerID: containerID,
		K8SNodeName: node, IPType: rpc.IPType_BCCMultiENIMultiIPType,
	})
	d := time.Since(start)
	s.metrics.duration.WithLabelValues("AllocateIP").Observe(d.Seconds())
	switch {
	case err != nil:
	case !reply.IsSuccess:
		err = errors.New(reply.ErrMsg)
	case reply.GetENIMultiIP().GetIP() == "":
		err = errors.New("AllocateIP succeeded without an IP")
	}
	if err != nil {
		s.log.Debug("CNI ADD failed", "pod", namespace+"/"+name, "container", containerID, "node", node, "duration", d, "err", err)
		s.counts.allocErrors.Add(1)
		s.counts.failed(&s.counts.lastAllocErr, err)
		s.metrics.calls.WithLabelValues("AllocateIP", "error").Inc()
		return "", err
	}
	s.log.Debug("CNI ADD", "pod", namespace+"/"+name, "container", containerID, "node", node,
		"ip", reply.GetENIMultiIP().GetIP(), "duration", d)
	s.counts.allocs.Add(1)
	s.counts.allocLatency.add(d)
	s.metrics.calls.WithLabelValues("AllocateIP", "ok").Inc()
	return reply.GetENIMultiIP().GetIP(), nil
}

func (s *Simulator) release(ctx context.Context, rt *runState, namespace, name, containerID string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CNITimeout)
	defer cancel()
	start := time.Now()
	reply, err := rt.cni.ReleaseIP(ctx, &rpc.ReleaseIPRequest{
		K8SPodName: name, K8SPodNamespace: namespace, K8SPodInfraContainerID: containerID,
		IPType: rpc.IPType_BCCMultiENIMultiIPType,
	})
	d := time.Since(start)
	s.metrics.duration.WithLabelValues("ReleaseIP").Observe(d.Seconds())
	if err == nil && !reply.IsSuccess {
		err = errors.New(reply.ErrMsg)
	}
	if err != nil {
		s.log.Debug("CNI DEL failed", "pod", namespace+"/"+name, "container", containerID, "duration", d, "err", err)
		s.counts.releaseErrors.Add(1)
		s.counts.failed(&s.counts.lastRelErr, err)
		s.metrics.calls.WithLabelValues("ReleaseIP", "error").Inc()
		return err
	}
	s.log.Debug("CNI DEL", "pod", namespace+"/"+name, "container", containerID, "duration", d)
	s.counts.releases.Add(1)
	s.metrics.calls.WithLabelValues("ReleaseIP", "ok").Inc()
	return nil
}

func nodeOf(obj any) *corev1.Node {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	n, _ := obj.(*corev1.Node)
	return n
}

func nodeDeletionTimestamp(obj any) *metav1.Time {
	if n := nodeOf(obj); n != nil {
		return n.DeletionTimestamp
	}
	return nil
}

// perCallClient opens a connection for each call and closes it after, as a
// CNI plugin process does.
type perCallClient struct{ endpoint string }

func callOnce[Req, Reply any](ctx context.Context, endpoint string, req Req,
	call func(rpc.CNIBackendClient, context.Context, Req, ...grpc.CallOption) (Reply, error), opts ...grpc.CallOption) (Reply, error) {
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		var zero Reply
		return zero, fmt.Errorf("kubeletsim: CNI endpoint %s: %w", endpoint, err)
	}
	defer func() { _ = conn.Close() }()
	return call(rpc.NewCNIBackendClient(conn), ctx, req, opts...)
}

func (p perCallClient) AllocateIP(ctx context.Context, in *rpc.AllocateIPRequest, opts ...grpc.CallOption) (*rpc.AllocateIPReply, error) {
	return callOnce(ctx, p.endpoint, in, rpc.CNIBackendClient.AllocateIP, opts...)
}

func (p perCallClient) ReleaseIP(ctx context.Context, in *rpc.ReleaseIPRequest, opts ...grpc.CallOption) (*rpc.ReleaseIPReply, error) {
	return callOnce(ctx, p.endpoint, in, rpc.CNIBackendClient.ReleaseIP, opts...)
}

func (p perCallClient) CheckIP(ctx context.Context, in *rpc.CheckIPRequest, opts ...grpc.CallOption) (*rpc.CheckIPReply, error) {
	return callOnce(ctx, p.endpoint, in, rpc.CNIBackendClient.CheckIP, opts...)
}
