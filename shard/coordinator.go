package shard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	coordlisters "k8s.io/client-go/listers/coordination/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

// NodeServer is what the Coordinator drives: the IPAM of the nodes this
// replica serves (ipam.IPAM implements it).
type NodeServer interface {
	// ServeNodes rebuilds and serves the nodes; it returns those that failed.
	ServeNodes(ctx context.Context, names []string) map[string]error
	// StopServingNode returns once nothing more is written for the node.
	StopServingNode(name string)
}

// Addresses are how other replicas and ipamctl reach this one; they are
// published on the replica's Lease.
type Addresses struct {
	GRPC string // host:port of the CNI gRPC service (forwarded calls)
	HTTP string // host:port of /metrics and /shard/status
}

// Coordinator runs the fenced ownership (the pure Ownership) against the
// API server for one replica: it renews the replica's Lease, claims and
// releases partitions by compare-and-swap, tells the NodeServer which nodes
// to serve, and publishes the routing table and the fence (Fence).
//
// One goroutine, the loop, owns its state: the goroutines doing I/O hand
// their outcomes back as closures on results, which the loop applies. There
// is no lock: other goroutines read the published Fence snapshot.
type Coordinator struct {
	cfg        Config
	self       string
	addrs      Addresses
	kube       kubernetes.Interface
	nodes      NodeServer
	gossip     func() []string
	gossipAt   func() string
	clock      clock.WithTicker
	log        *slog.Logger
	metrics    *metrics
	budget     *budget
	fence      *Fence
	policy     *policyState
	lease      *leaseWriter
	fenceProbe func(context.Context, ipam.FenceToken) (bool, error)

	leaseInformers informers.SharedInformerFactory
	leases         coordlisters.LeaseNamespaceLister
	nodeInformer   cache.SharedIndexInformer
	nodeLister     corelisters.NodeLister

	kick     chan struct{}
	results  chan func() // outcomes of I/O, applied on the loop goroutine
	shutdown atomic.Pointer[func()]
	// balancePending is the Balancer's Pending after the loop's last step,
	// for Status (read on other goroutines).
	balancePending atomic.Bool

	// Owned by the loop goroutine. The decisions are the Ownership's; the
	// rest is what the I/O needs.
	own         *Ownership
	leaving     bool
	ring        *Ring
	live        []string
	seen        map[string]observed // other replicas' leases as observed
	claims      []Claim             // the claims as of the last look (watch + our own writes)
	written     map[int]writtenClaim
	serving     nodeServing
	inFlight    inFlight
	prefetch    prefetchState
	stepped     bool
	readyReason string
	loggedHold  string // the Ownership's hold as last logged
	balance     *Balancer
}

// inFlight counts the claim and release CASes under way.
type inFlight struct {
	io          int // claims and releases
	claims      int
	claimsSince time.Time // when the oldest claim in flight started
}

// Deps are the Coordinator's connections.
type Deps struct {
	Kube  kubernetes.Interface
	Nodes NodeServer
	// NodeInformer is a shared Node informer (the IPAM's), started by its
	// owner.
	NodeInformer cache.SharedIndexInformer
	// Fence is where the Coordinator publishes its routing table and fence
	// (the IPAM reads it too). Nil: New builds one.
	Fence *Fence
	// Budget receives this replica's share of the cloud budget; nil skips
	// the split (tests).
	Budget RateSetter
	// GlobalRate and GlobalBurst are the cluster-wide BCE budget.
	GlobalRate  float64
	GlobalBurst int64
	// Gossip lists the members this replica's gossip sees (memberlist).
	// A replica is in the ring only if gossip sees it as well as a fresh
	// Lease: one that cannot gossip with us (another key, cut off) takes no
	// partitions from us. Nil: Leases alone.
	Gossip func() []string
	// GossipAddr is this replica's gossip address (host:port), known once
	// memberlist listens; published in the replica Lease so that replicas
	// find each other without DNS (Fence.GossipSeeds). Nil or "": not
	// published.
	GossipAddr func() string
	// Clock is the Coordinator's (and the Fence's) clock. Nil: the real one.
	Clock clock.WithTicker
	// FenceProbe asks the API server, with a dry-run wep write under tok,
	// whether the fencing policy refuses tok (ipam.IPAM.ProbeFence). Nil:
	// a takeover does not wait for the policy to catch up.
	FenceProbe func(ctx context.Context, tok ipam.FenceToken) (refused bool, err error)
}

// RateSetter is the cloud client's rate limit (cloud.Client implements it).
type RateSetter interface {
	SetRate(rate float64, burst int64) error
}

// New builds a Coordinator for member self. It starts nothing; Run does.
func New(cfg Config, self string, addrs Addresses, deps Deps, log *slog.Logger, reg prometheus.Registerer) (*Coordinator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkMemberName(self); err != nil {
		return nil, err
	}
	if deps.Kube == nil || deps.Nodes == nil || deps.NodeInformer == nil {
		return nil, errors.New("shard: Kube, Nodes and NodeInformer are required")
	}
	if deps.Clock == nil {
		deps.Clock = clock.RealClock{}
	}
	if deps.Fence == nil {
		deps.Fence = NewFence(cfg, self, deps.Clock)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := newMetrics(reg)
	c := &Coordinator{
		cfg:          cfg,
		self:         self,
		addrs:        addrs,
		kube:         deps.Kube,
		nodes:        deps.Nodes,
		gossip:       deps.Gossip,
		gossipAt:     deps.GossipAddr,
		clock:        deps.Clock,
		log:          log,
		metrics:      m,
		fence:        deps.Fence,
		policy:       &policyState{},
		lease:        &leaseWriter{},
		fenceProbe:   deps.FenceProbe,
		nodeInformer: deps.NodeInformer,
		nodeLister:   corelisters.NewNodeLister(deps.NodeInformer.GetIndexer()),
		kick:         make(chan struct{}, 1),
		results:      make(chan func(), 1024),
		own: NewOwnership(OwnershipConfig{
			Self:            self,
			Partitions:      cfg.Ring.Partitions,
			ColdStartSettle: cfg.ColdStartSettle,
			SettleCap:       cfg.ColdStartSettle + cfg.LeaseDuration,
			Start:           deps.Clock.Now(),
		}),
		balance: NewBalancer(BalancerConfig{
			Self:       self,
			Partitions: cfg.Ring.Partitions,
			Interval:   balanceInterval,
		}),
		seen:        map[string]observed{},
		prefetch:    prefetchState{done: map[string]string{}},
		written:     map[int]writtenClaim{},
		serving:     newNodeServing(),
		readyReason: "not started",
	}
	c.budget = newBudget(budgetDeps{
		self:   self,
		setter: deps.Budget,
		global: Share{
			Rate:  deps.GlobalRate,
			Burst: deps.GlobalBurst,
		},
		leases:       deps.Kube.CoordinationV1().Leases(cfg.Namespace),
		clock:        deps.Clock,
		peers:        deps.Fence,
		period:       cfg.RenewPeriod / 2,
		followDemand: cfg.BudgetFollowDemand,
		log:          log,
		metrics:      m.budget,
	})
	c.budget.mu.Lock()
	c.budget.recordHeldLocked() // no budget to split: never gated for want of a share
	c.budget.mu.Unlock()
	c.leaseInformers = informers.NewSharedInformerFactoryWithOptions(deps.Kube, 0,
		informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = labelKind }))
	c.leases = c.leaseInformers.Coordination().V1().Leases().Lister().Leases(cfg.Namespace)
	return c, nil
}

// Self is this replica's member name.
func (c *Coordinator) Self() string { return c.self }

// Fence is where this Coordinator publishes its routing table and fence.
func (c *Coordinator) Fence() *Fence { return c.fence }

// Kick makes the loop look again now (a membership change, say).
func (c *Coordinator) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Ready returns nil when the replica holds its lease and serves every node
// of the partitions it holds; otherwise why not.
func (c *Coordinator) Ready() error { return c.fence.ready() }

// LeaseValid reports whether this replica's lease is valid now.
func (c *Coordinator) LeaseValid() bool { return c.fence.LeaseValid() }

// MayAct is Fence.MayAct.
func (c *Coordinator) MayAct(node string) (time.Time, error) { return c.fence.MayAct(node) }

// FenceToken is Fence.FenceToken.
func (c *Coordinator) FenceToken(node string) (ipam.FenceToken, time.Time, error) {
	return c.fence.FenceToken(node)
}

// RouteOf is Fence.RouteOf.
func (c *Coordinator) RouteOf(node string) Route { return c.fence.RouteOf(node) }

// Budget returns this replica's current share.
func (c *Coordinator) Budget() Share { return c.budget.current() }

// Run creates and renews the replica Lease and runs the ownership loop until
// ctx ends; then it hands its partitions over (Leave) within LeaveTimeout.
func (c *Coordinator) Run(ctx context.Context) error {
	infCtx, err := c.startInformers(ctx)
	if err != nil {
		return err
	}
	// The loop outlives ctx by the graceful leave.
	loopCtx, stopLoop := context.WithCancel(context.Background())
	defer stopLoop()
	if c.cfg.FencingPolicy != "" {
		c.checkPolicy(ctx) // before the first claim
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		if c.cfg.FencingPolicy != "" {
			c.policyLoop(loopCtx)
		}
	}()
	go func() { defer wg.Done(); c.renewLoop(loopCtx) }()
	go func() { defer wg.Done(); c.budget.loop(loopCtx) }()

	err = c.loop(ctx, loopCtx)
	stopLoop()
	wg.Wait()
	// Keep observing other replicas' leases (not claiming anything) so
	// routing stays right until Close.
	go c.observeUntil(infCtx)
	return err
}

// startInformers starts the Lease informers and waits for them and the
// node informer. The informers outlive Run: after a graceful leave, calls
// still in flight here are forwarded to the new owners, which needs a
// current view of the claims and leases until Close.
func (c *Coordinator) startInformers(ctx context.Context) (context.Context, error) {
	inf := c.leaseInformers.Coordination().V1().Leases().Informer()
	kick := func(any) { c.Kick() }
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    kick,
		DeleteFunc: kick,
		UpdateFunc: func(_, _ any) { c.Kick() },
	}
	if _, err := inf.AddEventHandler(handler); err != nil {
		return nil, err
	}
	if _, err := c.nodeInformer.AddEventHandler(handler); err != nil {
		return nil, err
	}
	infCtx, stopInformers := context.WithCancel(context.Background())
	c.leaseInformers.Start(infCtx.Done())
	shutdown := sync.OnceFunc(func() {
		stopInformers()
		c.leaseInformers.Shutdown()
	})
	c.shutdown.Store(&shutdown)
	for typ, ok := range c.leaseInformers.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("shard: cache of %v did not sync", typ)
		}
	}
	if !cache.WaitForCacheSync(ctx.Done(), c.nodeInformer.HasSynced) {
		return nil, ctx.Err()
	}
	return infCtx, nil
}

// observeUntil keeps the view of other replicas fresh after the loop ended
// (it is the loop's successor: the loop has returned).
func (c *Coordinator) observeUntil(ctx context.Context) {
	t := c.clock.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		leases, err := c.leases.List(labels.Everything())
		if err != nil {
			continue
		}
		claims, present, _, _ := c.readLeases(leases)
		c.applyWritten(claims)
		c.observe(present, c.clock.Now())
		c.publish()
	}
}

// Close stops the informers Run started; call it once nothing routes calls
// any more (after the gRPC server stopped).
func (c *Coordinator) Close() {
	if f := c.shutdown.Load(); f != nil {
		(*f)()
	}
}

// loop is the only goroutine that changes the Ownership.
func (c *Coordinator) loop(ctx, loopCtx context.Context) error {
	tick := c.clock.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var leaveDeadline <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			if leaveDeadline == nil {
				t := c.beginLeave(loopCtx)
				defer t.Stop()
				leaveDeadline = t.C()
				ctx = context.Background() // do not fire again
			}
		case <-leaveDeadline:
			c.log.Warn("leave timed out; remaining partitions move when our lease expires")
			c.stopEverything()
			return nil
		case f := <-c.results:
			f()
			c.applyQueued()
		case <-c.kick:
		case <-tick.C():
		}
		if err := c.step(loopCtx); err != nil {
			return err
		}
		if leaveDeadline != nil && c.idle() {
			c.log.Info("left: every partition handed over")
			c.deleteLease()
			return nil
		}
	}
}

// applyQueued applies the outcomes already queued, so that one step sees
// them all (a cold start's claims land together).
func (c *Coordinator) applyQueued() {
	for {
		select {
		case f := <-c.results:
			f()
		default:
			return
		}
	}
}

// beginLeave marks this replica as leaving and publishes it on its Lease
// (others drop it from the ring at once); the timer bounds the hand-over.
func (c *Coordinator) beginLeave(ctx context.Context) clock.Timer {
	c.log.Info("leaving: handing partitions over", "timeout", c.cfg.LeaveTimeout)
	c.leaving = true
	c.lease.leaving.Store(true)
	c.publish()
	if renewed := c.writeLease(ctx); renewed != nil {
		renewed()
	}
	return c.clock.NewTimer(c.cfg.LeaveTimeout)
}

// idle reports that nothing is claimed, served or in flight.
func (c *Coordinator) idle() bool {
	for p := range c.cfg.Ring.Partitions {
		if c.own.State(p) != Unowned {
			return false
		}
	}
	for _, st := range c.serving.state {
		if st != nodeAbsent {
			return false
		}
	}
	return !c.serving.starting && c.inFlight.io == 0
}

// stopEverything stops serving every node (leave timed out). The fence
// closes first: nothing is written for the nodes while they stop.
func (c *Coordinator) stopEverything() {
	var names []string
	for n, st := range c.serving.state {
		if st != nodeAbsent {
			names = append(names, n)
		}
	}
	c.own.DropLease()
	c.publish()
	for _, n := range names {
		c.nodes.StopServingNode(n)
	}
}

// publish builds the snapshot of the loop's state and hands it to the
// Fence. Called by the loop after every change, and before any I/O that a
// tightening (a fenced or draining partition, a dropped lease) must precede.
func (c *Coordinator) publish() {
	s := &snapshot{
		states:          c.own.States(),
		leaseValidUntil: c.own.LeaseValidUntil(),
		claims:          c.claims,
		peers:           make(map[string]observed, len(c.seen)),
		live:            c.live,
		leaving:         c.leaving,
		stepped:         c.stepped,
		readyReason:     c.readyReason,
	}
	for m, o := range c.seen {
		s.peers[m] = o
	}
	if c.ring != nil {
		s.owners = c.table().Owners
	}
	if c.claims != nil || len(c.written) > 0 {
		s.tokens = make([]Claim, c.cfg.Ring.Partitions)
		copy(s.tokens, c.claims)
		for p, w := range c.written {
			s.tokens[p] = w.claim
		}
	}
	c.fence.publish(s)
}
