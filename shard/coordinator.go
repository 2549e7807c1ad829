package shard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	coordlisters "k8s.io/client-go/listers/coordination/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

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
// to serve, and answers the routing and fencing questions of the CNI path.
type Coordinator struct {
	cfg     Config
	self    string
	addrs   Addresses
	kube    kubernetes.Interface
	nodes   NodeServer
	gossip  func() []string
	clock   clock.WithTicker
	log     *slog.Logger
	metrics *metrics
	budget  *budget

	leaseInformers informers.SharedInformerFactory
	leases         coordlisters.LeaseNamespaceLister
	nodeInformer   cache.SharedIndexInformer
	nodeLister     corelisters.NodeLister

	kick    chan struct{}
	results chan func() // outcomes of I/O, applied on the loop goroutine

	mu              sync.Mutex
	own             *Ownership
	leaseValidUntil time.Time
	myLease         *coordv1.Lease // as last written
	leaving         bool
	ring            *Ring
	live            []string
	seen            map[string]observed // other replicas' leases as observed
	written         map[int]writtenClaim
	wantedSince     map[int]time.Time // partition became ours in the ring, not yet served
	nodeState       map[string]nodeState
	starting        bool
	pendingIO       int // claims and releases in flight
	claimsInFlight  int
	releasing       map[int]bool // orphaned claims being released
	claims          []Claim      // the claims as of the last look (watch + our own writes)
	closeOnce       func()
	claimsSince     time.Time // when the oldest claim in flight started
	retryAt         map[string]time.Time
	retryDelay      map[string]time.Duration // a failing node's current backoff (see serveBackoff)
	stepped         bool
	readyReason     string
	startedAt       time.Time // by our clock, for the cold-start settle's cap
	settleKey       string    // the replicas in view, as of settleSince
	settleSince     time.Time
	holdReason      string // why claims are held back ("" when they are not)
	balance         balanceState
	fenceProbe      func(context.Context, ipam.FenceToken) (bool, error)
	policyPresent   bool   // the fencing policy and its binding exist
	policyDetail    string // why not
	policyChecked   bool
}

// balanceState is what this replica knows of the balance Lease, and the
// table it balances to.
type balanceState struct {
	version    string // the counts annotation as last read ("" no Lease)
	counts     []int  // the published node counts; nil: none or unreadable
	publishing bool
	lastCheck  time.Time
	lastTry    time.Time
	table      Table // the ring balanced with counts, for tableRing
	tableRing  *Ring
	tableVer   string
}

// observed is what this replica last saw of another replica's Lease, and
// since when by its own clock: expiry is judged on local time only.
type observed struct {
	version string // "" while absent
	since   time.Time
	leaving bool
	grpc    string
	http    string
}

// writtenClaim is a claim this replica wrote, kept until the watch shows it:
// replaced is the version the write superseded.
type writtenClaim struct {
	claim    Claim
	replaced string
}

type nodeState uint8

const (
	nodeAbsent nodeState = iota
	nodeStarting
	nodeUp
	nodeStopping
)

// Deps are the Coordinator's connections.
type Deps struct {
	Kube  kubernetes.Interface
	Nodes NodeServer
	// NodeInformer is a shared Node informer (the IPAM's), started by its
	// owner.
	NodeInformer cache.SharedIndexInformer
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
	Clock  clock.WithTicker
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
	cfg.defaults()
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
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Coordinator{
		cfg: cfg, self: self, addrs: addrs, kube: deps.Kube, nodes: deps.Nodes, gossip: deps.Gossip, clock: deps.Clock, log: log,
		metrics:      newMetrics(reg),
		nodeInformer: deps.NodeInformer,
		nodeLister:   corelisters.NewNodeLister(deps.NodeInformer.GetIndexer()),
		kick:         make(chan struct{}, 1),
		results:      make(chan func(), 1024),
		own:          NewOwnership(self, cfg.Ring.Partitions),
		seen:         map[string]observed{},
		written:      map[int]writtenClaim{},
		wantedSince:  map[int]time.Time{},
		nodeState:    map[string]nodeState{},
		retryAt:      map[string]time.Time{},
		retryDelay:   map[string]time.Duration{},
		releasing:    map[int]bool{},
		readyReason:  "not started",
		startedAt:    deps.Clock.Now(),
		fenceProbe:   deps.FenceProbe,
	}
	c.budget = newBudget(c, deps.Budget, deps.GlobalRate, deps.GlobalBurst)
	c.leaseInformers = informers.NewSharedInformerFactoryWithOptions(deps.Kube, 0,
		informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = labelKind }))
	c.leases = c.leaseInformers.Coordination().V1().Leases().Lister().Leases(cfg.Namespace)
	return c, nil
}

// Self is this replica's member name.
func (c *Coordinator) Self() string { return c.self }

// Kick makes the loop look again now (a membership change, say).
func (c *Coordinator) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run creates and renews the replica Lease and runs the ownership loop until
// ctx ends; then it hands its partitions over (Leave) within LeaveTimeout.
func (c *Coordinator) Run(ctx context.Context) error {
	inf := c.leaseInformers.Coordination().V1().Leases().Informer()
	kick := func(any) { c.Kick() }
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kick, DeleteFunc: kick, UpdateFunc: func(_, o any) { c.Kick() },
	}); err != nil {
		return err
	}
	if _, err := c.nodeInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kick, DeleteFunc: kick, UpdateFunc: func(_, o any) { c.Kick() },
	}); err != nil {
		return err
	}
	// The informers outlive Run: after a graceful leave, calls still in
	// flight here are forwarded to the new owners, which needs a current
	// view of the claims and leases until Close.
	infCtx, stopInformers := context.WithCancel(context.Background())
	c.leaseInformers.Start(infCtx.Done())
	c.mu.Lock()
	c.closeOnce = sync.OnceFunc(func() {
		stopInformers()
		c.leaseInformers.Shutdown()
	})
	c.mu.Unlock()
	for typ, ok := range c.leaseInformers.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("shard: cache of %v did not sync", typ)
		}
	}
	if !cache.WaitForCacheSync(ctx.Done(), c.nodeInformer.HasSynced) {
		return ctx.Err()
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

	err := c.loop(ctx, loopCtx)
	stopLoop()
	wg.Wait()
	// Keep observing other replicas' leases (not claiming anything) so
	// routing stays right until Close.
	go c.observeUntil(infCtx)
	return err
}

// observeUntil keeps the view of other replicas fresh after the loop ended.
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
		c.mu.Lock()
		c.applyWrittenLocked(claims)
		c.observe(present, c.clock.Now())
		c.mu.Unlock()
	}
}

// Close stops the informers Run started; call it once nothing routes calls
// any more (after the gRPC server stopped).
func (c *Coordinator) Close() {
	c.mu.Lock()
	f := c.closeOnce
	c.mu.Unlock()
	if f != nil {
		f()
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
				c.log.Info("leaving: handing partitions over", "timeout", c.cfg.LeaveTimeout)
				c.mu.Lock()
				c.leaving = true
				c.mu.Unlock()
				c.writeLease(loopCtx) // publish "leaving" so others drop us from the ring now
				t := c.clock.NewTimer(c.cfg.LeaveTimeout)
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

// idle reports that nothing is claimed, served or in flight.
func (c *Coordinator) idle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p := range c.cfg.Ring.Partitions {
		if c.own.State(p) != Unowned {
			return false
		}
	}
	for _, st := range c.nodeState {
		if st != nodeAbsent {
			return false
		}
	}
	return !c.starting && c.pendingIO == 0
}

// stopEverything stops serving every node (leave timed out).
func (c *Coordinator) stopEverything() {
	c.mu.Lock()
	var names []string
	for n, st := range c.nodeState {
		if st != nodeAbsent {
			names = append(names, n)
		}
	}
	c.leaseValidUntil = time.Time{}
	c.mu.Unlock()
	for _, n := range names {
		c.nodes.StopServingNode(n)
	}
}

// step compares the world with the Ownership and starts the I/O it asks for.
func (c *Coordinator) step(ctx context.Context) error {
	now := c.clock.Now()
	leases, err := c.leases.List(labels.Everything())
	if err != nil {
		return err
	}
	var gossip map[string]bool
	if c.gossip != nil {
		gossip = map[string]bool{}
		for _, m := range c.gossip() {
			gossip[m] = true
		}
	}
	claims, present, budgetLease, balanceLease := c.readLeases(leases)
	served := c.servedNodes()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.applyWrittenLocked(claims)
	c.observe(present, now)
	live := c.liveLocked(now, gossip)
	if !slices.Equal(live, c.live) || c.ring == nil && len(live) > 0 {
		c.log.Info("ring members changed", "members", live, "was", c.live)
		c.live = live
		c.ring = nil
		if len(live) > 0 {
			ring, err := NewRing(c.cfg.Ring, live)
			if err != nil {
				return err
			}
			c.ring = ring
		}
	}
	c.readBalanceLocked(balanceLease)
	c.maybePublishBalanceLocked(ctx, now, live, served)
	wanted := c.tableLocked().Owners
	if hold := c.holdClaimsLocked(now, live, claims, gossip); hold != c.holdReason {
		if hold != "" {
			c.log.Info("holding back claims", "reason", hold)
		} else {
			c.log.Info("claiming", "members", live)
		}
		c.holdReason = hold
	}
	if c.holdReason != "" {
		wanted = slices.Clone(wanted)
		for p := range wanted {
			if wanted[p] == c.self && c.own.State(p) == Unowned {
				wanted[p] = ""
			}
		}
	}
	for p := range wanted {
		if wanted[p] == c.self && c.own.State(p) != Serving {
			if _, ok := c.wantedSince[p]; !ok {
				c.wantedSince[p] = now
			}
		} else if wanted[p] != c.self {
			delete(c.wantedSince, p)
		}
	}
	acts, err := c.own.Step(View{
		Now: now, Wanted: wanted, Claims: claims, LeaseValidUntil: c.leaseValidUntil,
		Expired: func(r string) bool { return c.expiredLocked(r, now) },
	})
	if err != nil {
		return err
	}
	for _, a := range acts {
		c.startAction(ctx, a, claims[a.Partition])
	}
	c.reconcileNodesLocked(ctx, now, claims, served)
	// Per-operation limits are split over every replica with a fresh Lease,
	// ring member or not yet: at a cold start that is the safer count.
	fresh := 1
	for m, o := range c.seen {
		if o.version != "" && !c.expiredLocked(m, now) {
			fresh++
		}
	}
	c.budget.observe(budgetLease, live, max(fresh, len(live)))
	c.updateMetricsLocked()
	c.stepped = true
	return nil
}

// holdClaimsLocked says why this replica must not claim partitions yet, or
// "" when it may:
//   - without a share of the cloud budget it could not rebuild what it claims
//     (the ENI list is a cloud call), and nobody else could serve it either;
//   - at a cold start (no live replica but us holds a claim), until the
//     replicas in view, by gossip or by a fresh Lease, have been the same for
//     ColdStartSettle: replicas started together then split the nodes once.
//     The wait is capped at ColdStartSettle + LeaseDuration from our start,
//     so a replica whose Lease is fresh but that never joins gossip does not
//     hold us forever.
func (c *Coordinator) holdClaimsLocked(now time.Time, live []string, claims []Claim, gossip map[string]bool) string {
	if !c.budget.held() {
		return "waiting for a share of the BCE budget"
	}
	if c.cfg.RequireFencingPolicy && !c.policyPresent {
		return "fencing policy missing (--shard-require-fencing-policy): " + c.policyDetail
	}
	if c.cfg.ColdStartSettle <= 0 {
		return ""
	}
	for _, cl := range claims {
		if cl.Holder != "" && cl.Holder != c.self && slices.Contains(live, cl.Holder) {
			return "" // a running cluster: a join takes its part at once
		}
	}
	for p := range c.cfg.Ring.Partitions {
		if c.own.State(p) != Unowned {
			return "" // we already took part
		}
	}
	inView := slices.Clone(live)
	for m, o := range c.seen {
		if o.version != "" && !o.leaving && !c.expiredLocked(m, now) && !slices.Contains(live, m) {
			inView = append(inView, m+"(lease)")
		}
	}
	for m := range gossip {
		if !slices.Contains(live, m) {
			inView = append(inView, m+"(gossip)")
		}
	}
	sort.Strings(inView)
	if key := strings.Join(inView, ","); key != c.settleKey || c.settleSince.IsZero() {
		c.settleKey, c.settleSince = key, now
	}
	if now.Sub(c.settleSince) < c.cfg.ColdStartSettle && now.Sub(c.startedAt) < c.cfg.ColdStartSettle+c.cfg.LeaseDuration {
		return "cold start: waiting for the replicas to settle"
	}
	return ""
}

// readLeases sorts the coordination Leases: the partition claims, the
// replica Leases by member, the budget Lease and the balance Lease.
func (c *Coordinator) readLeases(leases []*coordv1.Lease) (claims []Claim, present map[string]*coordv1.Lease, budgetLease, balanceLease *coordv1.Lease) {
	claims = make([]Claim, c.cfg.Ring.Partitions)
	present = map[string]*coordv1.Lease{}
	for _, l := range leases {
		switch l.Labels[labelKind] {
		case kindReplica:
			if m := l.Annotations[annoMember]; m != "" {
				present[m] = l
			}
		case kindPartition:
			if p, ok := partitionFromLease(l.Name); ok && p < len(claims) {
				claims[p] = Claim{Holder: ptr.Deref(l.Spec.HolderIdentity, ""), Version: l.ResourceVersion,
					Epoch: int64(ptr.Deref(l.Spec.LeaseTransitions, 0))}
			}
		case kindBudget:
			budgetLease = l
		case kindBalance:
			if l.Name == balanceLeaseName {
				balanceLease = l
			}
		}
	}
	return claims, present, budgetLease, balanceLease
}

// applyWrittenLocked lets our own claim writes win over a watch that has not
// caught up with them, forgets writes the watch has shown, and keeps the
// result as the claims view that routing and status read.
func (c *Coordinator) applyWrittenLocked(claims []Claim) {
	for p, w := range c.written {
		if claims[p].Version == w.replaced {
			claims[p] = w.claim
		} else {
			delete(c.written, p)
		}
	}
	c.claims = claims
}

// observe records other replicas' Lease versions and when they changed.
func (c *Coordinator) observe(present map[string]*coordv1.Lease, now time.Time) {
	for m, l := range present {
		if m == c.self {
			continue
		}
		o := c.seen[m]
		if o.version != l.ResourceVersion {
			o.version, o.since = l.ResourceVersion, now
		}
		o.leaving = l.Annotations[annoLeaving] == "true"
		o.grpc, o.http = l.Annotations[annoGRPC], l.Annotations[annoHTTP]
		c.seen[m] = o
	}
	for m, o := range c.seen {
		if _, ok := present[m]; !ok && o.version != "" {
			o.version, o.since = "", now
			c.seen[m] = o
		}
		if _, ok := present[m]; !ok && now.Sub(o.since) > 10*c.cfg.LeaseDuration {
			delete(c.seen, m) // long gone: forget
		}
	}
}

// expiredLocked: r's Lease has not changed (or been absent) for a whole
// LeaseDuration on our clock. A replica never seen counts as expired: its
// claim can only be a leftover of a process that is gone.
func (c *Coordinator) expiredLocked(r string, now time.Time) bool {
	if r == c.self {
		return false
	}
	o, ok := c.seen[r]
	return !ok || now.Sub(o.since) >= c.cfg.LeaseDuration
}

// liveLocked lists the ring's members: replicas whose Lease is fresh, who are
// not leaving and whom gossip sees, plus this one while its lease is valid.
func (c *Coordinator) liveLocked(now time.Time, gossip map[string]bool) []string {
	var live []string
	if now.Before(c.leaseValidUntil) && !c.leaving {
		live = append(live, c.self)
	}
	for m, o := range c.seen {
		if gossip != nil && !gossip[m] {
			continue
		}
		if o.version != "" && !o.leaving && !c.expiredLocked(m, now) {
			live = append(live, m)
		}
	}
	sort.Strings(live)
	return live
}

// startAction launches the I/O of one Action; its outcome comes back through
// c.results.
func (c *Coordinator) startAction(ctx context.Context, a Action, claim Claim) {
	switch a.Kind {
	case ActClaim:
		c.pendingIO++
		if c.claimsInFlight == 0 {
			c.claimsSince = c.clock.Now()
		}
		c.claimsInFlight++
		go c.claim(ctx, a.Partition, claim)
	case ActServe:
		c.metrics.partitionsClaimed.Inc()
	case ActStop:
		// Nodes of the partition are stopped by reconcileNodesLocked; a
		// draining partition is released once they all are.
		c.log.Info("stopping partition", "partition", a.Partition, "draining", c.own.State(a.Partition) == Draining)
		if c.own.State(a.Partition) == Unowned {
			c.metrics.handovers.WithLabelValues("fenced").Inc()
		}
	case ActRelease:
		c.pendingIO++
		go func() {
			c.release(ctx, a.Partition, a.Version)
			c.results <- func() {
				c.mu.Lock()
				c.pendingIO--
				c.mu.Unlock()
			}
		}()
	}
}

// claim CASes the partition's claim to this replica.
func (c *Coordinator) claim(ctx context.Context, p int, claim Claim) {
	won, written, reason := c.claimIO(ctx, p, claim)
	c.results <- func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.pendingIO--
		c.claimsInFlight--
		if won {
			c.written[p] = writtenClaim{claim: written, replaced: claim.Version}
			c.metrics.handovers.WithLabelValues(reason).Inc()
		}
		if _, err := c.own.ClaimResult(p, won); err != nil {
			c.log.Error("claim result", "partition", p, "err", err)
		}
	}
}

func (c *Coordinator) claimIO(ctx context.Context, p int, claim Claim) (bool, Claim, string) {
	reason := "free"
	if claim.Holder != "" && claim.Holder != c.self {
		reason = "takeover"
		// Confirm the holder's expiry with a quorum read: a stale watch
		// must not make a live replica look dead.
		c.mu.Lock()
		o := c.seen[claim.Holder]
		c.mu.Unlock()
		l, err := c.kube.CoordinationV1().Leases(c.cfg.Namespace).Get(ctx, ReplicaLeaseName(claim.Holder), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			if o.version != "" {
				return false, Claim{}, "" // gone only now: wait a duration from here
			}
		case err != nil:
			return false, Claim{}, ""
		case l.ResourceVersion != o.version:
			return false, Claim{}, "" // renewed since we looked
		}
	} else if claim.Holder == c.self {
		reason = "reclaim"
	}
	client := c.kube.CoordinationV1().Leases(c.cfg.Namespace)
	now := metav1.NewMicroTime(c.clock.Now())
	if claim.Version == "" {
		l, err := client.Create(ctx, &coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: PartitionLeaseName(p), Labels: map[string]string{labelKind: kindPartition}},
			Spec:       coordv1.LeaseSpec{HolderIdentity: ptr.To(c.self), AcquireTime: &now, LeaseTransitions: ptr.To(int32(1))},
		}, metav1.CreateOptions{})
		if err != nil {
			if !apierrors.IsAlreadyExists(err) {
				c.log.Warn("claim failed", "partition", p, "err", err)
			}
			return false, Claim{}, ""
		}
		won := Claim{Holder: c.self, Version: l.ResourceVersion, Epoch: 1}
		c.awaitFence(ctx, p, Claim{}, won)
		return true, won, reason
	}
	// Every claim CAS moves the epoch on, a reclaim of our own claim after
	// a lapse too: writes sent under the old token are refused from here on.
	epoch := claim.Epoch + 1
	l := &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: PartitionLeaseName(p), ResourceVersion: claim.Version,
			Labels: map[string]string{labelKind: kindPartition}},
		Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To(c.self), AcquireTime: &now, LeaseTransitions: ptr.To(int32(epoch))},
	}
	l, err := client.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		if !apierrors.IsConflict(err) {
			c.log.Warn("claim failed", "partition", p, "err", err)
		}
		return false, Claim{}, ""
	}
	won := Claim{Holder: c.self, Version: l.ResourceVersion, Epoch: epoch}
	// Serve only once the API server's fencing policy has seen the CAS:
	// it then refuses the old holder's writes still in flight, and accepts
	// ours.
	c.awaitFence(ctx, p, claim, won)
	return true, won, reason
}

// release CASes a drained partition's claim to nobody; on a conflict it
// re-reads and retries while the claim still names us.
func (c *Coordinator) release(ctx context.Context, p int, version string) {
	client := c.kube.CoordinationV1().Leases(c.cfg.Namespace)
	// The epoch moves on with the release too (it never goes back, so a
	// later claim by the same holder has a token of its own).
	epoch, known := int64(0), false
	c.mu.Lock()
	if p < len(c.claims) && c.claims[p].Version == version {
		epoch, known = c.claims[p].Epoch, true
	}
	c.mu.Unlock()
	if !known {
		cur, err := client.Get(ctx, PartitionLeaseName(p), metav1.GetOptions{})
		if err != nil || ptr.Deref(cur.Spec.HolderIdentity, "") != c.self {
			return
		}
		version, epoch = cur.ResourceVersion, int64(ptr.Deref(cur.Spec.LeaseTransitions, 0))
	}
	for attempt := 0; attempt < 5 && ctx.Err() == nil; attempt++ {
		l := &coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: PartitionLeaseName(p), ResourceVersion: version,
				Labels: map[string]string{labelKind: kindPartition}},
			Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To(""), LeaseTransitions: ptr.To(int32(epoch + 1))},
		}
		out, err := client.Update(ctx, l, metav1.UpdateOptions{})
		if err == nil {
			c.results <- func() {
				c.mu.Lock()
				c.written[p] = writtenClaim{claim: Claim{Version: out.ResourceVersion, Epoch: epoch + 1}, replaced: version}
				c.mu.Unlock()
			}
			c.metrics.handovers.WithLabelValues("released").Inc()
			return
		}
		cur, gerr := client.Get(ctx, PartitionLeaseName(p), metav1.GetOptions{})
		if gerr != nil || ptr.Deref(cur.Spec.HolderIdentity, "") != c.self {
			return // gone or someone else's: nothing of ours to release
		}
		version, epoch = cur.ResourceVersion, int64(ptr.Deref(cur.Spec.LeaseTransitions, 0))
	}
}

// servedNodes lists the nodes this controller serves: BCC nodes (a cce://
// provider ID) not being deleted.
func (c *Coordinator) servedNodes() []string {
	all, _ := c.nodeLister.List(labels.Everything())
	names := make([]string, 0, len(all))
	for _, n := range all {
		if n.DeletionTimestamp == nil && strings.HasPrefix(n.Spec.ProviderID, "cce://") {
			names = append(names, n.Name)
		}
	}
	return names
}

// reconcileNodesLocked starts and stops nodes so that exactly the BCC nodes
// of Serving partitions are served, and completes the drain of partitions
// whose nodes have all stopped.
func (c *Coordinator) reconcileNodesLocked(ctx context.Context, now time.Time, claims []Claim, served []string) {
	exists := make(map[string]bool, len(served))
	var start []string
	for _, name := range served {
		exists[name] = true
		p := PartitionOf(c.cfg.Ring.Partitions, name)
		if c.own.State(p) == Serving && c.nodeState[name] == nodeAbsent && !now.Before(c.retryAt[name]) {
			start = append(start, name)
		}
	}
	busy := map[int]bool{} // partitions with nodes not yet stopped
	for name, st := range c.nodeState {
		p := PartitionOf(c.cfg.Ring.Partitions, name)
		if st != nodeAbsent {
			busy[p] = true
		}
		if st == nodeUp && (c.own.State(p) != Serving || !exists[name]) {
			c.nodeState[name] = nodeStopping
			go func() {
				c.nodes.StopServingNode(name)
				c.results <- func() {
					c.mu.Lock()
					c.nodeState[name] = nodeAbsent
					c.mu.Unlock()
				}
			}()
		}
		if st == nodeAbsent {
			delete(c.nodeState, name)
		}
	}
	for p := range c.cfg.Ring.Partitions {
		if c.own.State(p) == Draining && !busy[p] {
			acts, err := c.own.Stopped(p, claims[p].Version)
			if err != nil {
				c.log.Error("stopped", "partition", p, "err", err)
				continue
			}
			for _, a := range acts {
				c.startAction(ctx, a, claims[p])
			}
		}
	}
	c.releaseOrphansLocked(ctx, now, claims, busy)
	// Claims won together are served together: one ENI list and one wep
	// read for all (the cloud allows ListENIs about once a second for the
	// whole cluster). Nodes whose claims land after a batch started wait
	// for it to finish and then pay for both reads again (a 3,000-node
	// takeover: 257 late nodes took 21 s more), so a batch waits for the
	// claims in flight, up to claimSettle.
	settling := c.claimsInFlight > 0 && now.Sub(c.claimsSince) < claimSettle
	if len(start) > 0 && !c.starting && !settling {
		sort.Strings(start)
		c.starting = true
		for _, n := range start {
			c.nodeState[n] = nodeStarting
		}
		go c.serve(ctx, start)
	}
	c.updateReadyLocked(now, exists)
}

// claimSettle bounds how long nodes already won wait for the claims still
// in flight before they are served. A cold start's 271 claims at the
// default 50 API calls/s (burst 100) take ~3.5 s.
const claimSettle = 4 * time.Second

// releaseOrphansLocked releases claims that still name this replica although
// it does not serve them: a fenced stop (a lapsed lease, a lost CAS race)
// leaves the claim in place, and if the ring has meanwhile given the
// partition to another replica, nobody else may take it while our lease is
// fresh. Released only once the partition's nodes have stopped.
func (c *Coordinator) releaseOrphansLocked(ctx context.Context, now time.Time, claims []Claim, busy map[int]bool) {
	if !now.Before(c.leaseValidUntil) || c.releasing == nil {
		return
	}
	var owners []string
	if c.ring != nil {
		owners = c.tableLocked().Owners
	}
	for p, cl := range claims {
		if cl.Holder != c.self || c.own.State(p) != Unowned || busy[p] || c.releasing[p] || (owners != nil && owners[p] == c.self) {
			continue
		}
		c.releasing[p] = true
		c.pendingIO++
		c.log.Info("releasing a claim this replica no longer serves", "partition", p)
		go func() {
			c.release(ctx, p, cl.Version)
			c.results <- func() {
				c.mu.Lock()
				c.pendingIO--
				delete(c.releasing, p)
				c.mu.Unlock()
			}
		}()
	}
}

// serve rebuilds a batch of nodes in one ServeNodes (one VPC-wide ENI list).
func (c *Coordinator) serve(ctx context.Context, names []string) {
	start := c.clock.Now()
	errs := c.nodes.ServeNodes(ctx, names)
	took := c.clock.Since(start)
	c.results <- func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.starting = false
		now := c.clock.Now()
		for _, n := range names {
			if err, failed := errs[n]; failed {
				c.nodeState[n] = nodeAbsent
				delay := serveBackoff(c.retryDelay[n])
				c.retryDelay[n] = delay
				wait := serveJitter(delay)
				c.retryAt[n] = now.Add(wait)
				c.log.Warn("serving node failed; backing off", "node", n, "retry_in", wait.Round(time.Millisecond),
					"backoff", delay, "err", err)
				continue
			}
			c.nodeState[n] = nodeUp
			delete(c.retryAt, n)
			delete(c.retryDelay, n)
		}
		// Hand-over duration: from when the ring gave us a partition until
		// its nodes are served.
		for p, since := range c.wantedSince {
			if c.own.State(p) == Serving {
				c.metrics.handoverDuration.Observe(now.Sub(since).Seconds())
				delete(c.wantedSince, p)
			}
		}
		c.log.Info("served nodes", "count", len(names)-len(errs), "failed", len(errs), "duration", took)
	}
}

// A node that cannot be served is retried after serveRetryMin, doubling on
// each failure up to serveRetryMax; a success resets it. A node that never
// rebuilds (a bad providerID, a cloud reply it cannot use) must not cost an
// urgent VPC-wide ENI list every second: that starves the periodic ENI sync
// and spends the cluster's ListENIs budget.
const (
	serveRetryMin = time.Second
	serveRetryMax = 2 * time.Minute
)

// serveBackoff returns the backoff after one more failure.
func serveBackoff(prev time.Duration) time.Duration {
	return min(max(2*prev, serveRetryMin), serveRetryMax)
}

// serveJitter spreads d over [0.8d, 1.2d), so that nodes failing together
// (one batch) do not retry in lockstep for ever.
func serveJitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// updateReadyLocked: ready once the lease is held, a step has run, and every
// node of our Serving partitions is up.
func (c *Coordinator) updateReadyLocked(now time.Time, exists map[string]bool) {
	switch {
	case !now.Before(c.leaseValidUntil):
		c.readyReason = "replica lease not held"
	case c.holdReason != "":
		c.readyReason = c.holdReason
	case c.starting:
		c.readyReason = "building the state of owned nodes"
	default:
		// A claim in flight is a partition the replica is about to serve:
		// ready now would let a rolling update stop the next replica
		// before this one has taken its share.
		c.readyReason = ""
		for p := range c.cfg.Ring.Partitions {
			if c.own.State(p) == Claiming {
				c.readyReason = fmt.Sprintf("claiming partition %d", p)
				return
			}
		}
		for name := range exists {
			if c.own.State(PartitionOf(c.cfg.Ring.Partitions, name)) == Serving && c.nodeState[name] != nodeUp {
				c.readyReason = "node " + name + " not served yet"
				break
			}
		}
	}
}

// Ready returns nil when the replica holds its lease and serves every node
// of the partitions it holds; otherwise why not.
func (c *Coordinator) Ready() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.stepped {
		return errors.New("ownership loop not started")
	}
	if c.readyReason != "" {
		return errors.New(c.readyReason)
	}
	return nil
}

// renewLoop keeps the replica Lease fresh. The lease is valid until
// RenewDeadline after the moment the successful write was *sent*.
func (c *Coordinator) renewLoop(ctx context.Context) {
	for ctx.Err() == nil {
		c.writeLease(ctx)
		select {
		case <-ctx.Done():
		case <-c.clock.After(c.cfg.RenewPeriod):
		}
	}
}

// writeLease creates or renews the replica Lease.
func (c *Coordinator) writeLease(ctx context.Context) {
	sent := c.clock.Now()
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RenewDeadline)
	defer cancel()
	client := c.kube.CoordinationV1().Leases(c.cfg.Namespace)
	c.mu.Lock()
	cur, leaving := c.myLease, c.leaving
	c.mu.Unlock()
	want := &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:   ReplicaLeaseName(c.self),
			Labels: map[string]string{labelKind: kindReplica},
			Annotations: map[string]string{
				annoMember: c.self, annoGRPC: c.addrs.GRPC, annoHTTP: c.addrs.HTTP,
				annoLeaving: fmt.Sprint(leaving),
			},
		},
		Spec: coordv1.LeaseSpec{
			HolderIdentity:       ptr.To(c.self),
			LeaseDurationSeconds: ptr.To(int32((c.cfg.LeaseDuration + time.Second - 1) / time.Second)),
			RenewTime:            ptr.To(metav1.NewMicroTime(sent)),
		},
	}
	var (
		out *coordv1.Lease
		err error
	)
	if cur == nil {
		want.Spec.AcquireTime = want.Spec.RenewTime
		out, err = client.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			// A restart of this very process is impossible (names are
			// unique per process); adopt the object only if it names us.
			var got *coordv1.Lease
			if got, err = client.Get(ctx, want.Name, metav1.GetOptions{}); err == nil {
				if ptr.Deref(got.Spec.HolderIdentity, "") != c.self {
					err = fmt.Errorf("replica lease %s is held by %q", want.Name, ptr.Deref(got.Spec.HolderIdentity, ""))
				} else {
					want.ResourceVersion = got.ResourceVersion
					out, err = client.Update(ctx, want, metav1.UpdateOptions{})
				}
			}
		}
	} else {
		want.ResourceVersion = cur.ResourceVersion
		want.Spec.AcquireTime = cur.Spec.AcquireTime
		out, err = client.Update(ctx, want, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			c.mu.Lock()
			c.myLease = nil // re-create or re-read next time
			c.mu.Unlock()
		}
	}
	if err != nil {
		c.metrics.renewFailures.Inc()
		c.log.Warn("renewing the replica lease failed", "err", err)
		return
	}
	until := sent.Add(c.cfg.RenewDeadline)
	c.mu.Lock()
	c.myLease = out
	lapsed := !c.leaseValidUntil.IsZero() && !sent.Before(c.leaseValidUntil)
	if !lapsed && until.After(c.leaseValidUntil) { // the first lease, or a timely renewal
		c.leaseValidUntil = until
	}
	c.mu.Unlock()
	if lapsed {
		// The lease lapsed (a pause, a cut-off): others may have taken our
		// partitions while our caches still say they are ours. Everything
		// is fenced off first, on the loop, and only then is the lease
		// valid again, so nothing is served on the old claims: each must be
		// won again by CAS, which fails if anyone took it meanwhile.
		c.results <- func() { c.relapse(until) }
	}
	c.Kick()
}

// relapse fences every partition after a lapsed lease, then accepts the new
// lease validity.
func (c *Coordinator) relapse(until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fenced := 0
	for p := range c.cfg.Ring.Partitions {
		if st := c.own.State(p); st == Serving || st == Draining {
			if err := c.own.fence(p); err == nil {
				fenced++
			}
		}
	}
	// Our budget entry may have been dropped as an expired replica's: win
	// it back by CAS before calling the cloud again.
	c.budget.revoke()
	if fenced > 0 {
		c.metrics.handovers.WithLabelValues("fenced").Add(float64(fenced))
		c.log.Warn("lease lapsed: stopped serving every partition; each must be claimed again", "partitions", fenced)
	}
	if until.After(c.leaseValidUntil) {
		c.leaseValidUntil = until
	}
}

// deleteLease removes the replica Lease after a complete leave, so others
// drop this replica at once.
func (c *Coordinator) deleteLease() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := c.kube.CoordinationV1().Leases(c.cfg.Namespace).Delete(ctx, ReplicaLeaseName(c.self), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		c.log.Warn("deleting the replica lease failed; others drop us when it expires", "err", err)
	}
}

// LeaseValid reports whether this replica's lease is valid now: the gate of
// every cloud call and write.
func (c *Coordinator) LeaseValid() bool {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	return now.Before(c.leaseValidUntil)
}

// ErrNotOwner is the (retryable) refusal of a call for a node this replica
// does not serve; its text travels in forwarded replies.
var ErrNotOwner = errors.New("not the owner of the node")

// MayAct implements ipam.Fence: writes for the node may go ahead while its
// partition is Serving or Draining (in-flight work finishing) here and our
// lease is valid now.
func (c *Coordinator) MayAct(node string) (time.Time, error) {
	p := PartitionOf(c.cfg.Ring.Partitions, node)
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.own.State(p)
	switch {
	case st != Serving && st != Draining:
		return time.Time{}, fmt.Errorf("%w: partition %d is %s here", ErrNotOwner, p, st)
	case !now.Before(c.leaseValidUntil):
		return time.Time{}, fmt.Errorf("%w: replica lease not renewed within %s", ErrNotOwner, c.cfg.RenewDeadline)
	}
	return c.leaseValidUntil, nil
}

// Route is where a call for a node goes now.
type Route struct {
	Partition int
	// Local: this replica serves the node's partition.
	Local bool
	// Owner and GRPC name the replica holding the claim, when another live
	// one does; empty when the node has no owner at the moment.
	Owner string
	GRPC  string
}

// RouteOf answers the router: local, another replica, or nobody yet.
func (c *Coordinator) RouteOf(node string) Route {
	p := PartitionOf(c.cfg.Ring.Partitions, node)
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	r := Route{Partition: p}
	if c.own.State(p) == Serving && now.Before(c.leaseValidUntil) {
		r.Local = true
		return r
	}
	if p >= len(c.claims) {
		return r // no look taken yet
	}
	holder := c.claims[p].Holder
	if holder == "" || holder == c.self || c.expiredLocked(holder, now) {
		return r
	}
	if o, ok := c.seen[holder]; ok && o.grpc != "" {
		r.Owner, r.GRPC = holder, o.grpc
	}
	return r
}
