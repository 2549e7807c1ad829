package shard

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A deterministic simulation of replicas running the pure parts of the
// driver (Balancer, Ownership, planNodes) against a CAS store (the API
// server), with crashes, pauses longer than the lease, replicas cut off from
// the API server, watches that lag behind after a pause or a cut-off, joins
// and graceful leaves, nodes added and deleted, and nodes that fail to be
// served (ownership_sim_faults_test.go). I1 is checked at every tick: no
// partition is servable by two replicas at once; so are the nodes
// (ownership_sim_nodes_test.go) and the balance publisher
// (ownership_sim_balance_test.go). After the faults stop, every replica must
// balance to one table, every partition must be served by exactly its owner
// in that table, and every node by that owner (liveness). Scripted runs on
// the same harness check the hold of a cold start (the replicas split the
// nodes once; the wait is capped; a join into a running cluster does not
// wait; nothing is claimed without a budget share), the release of claims a
// fenced stop left behind, and the publication of the balance.

const (
	simTick          = 100 * time.Millisecond
	simRenewEvery    = time.Second
	simRenewDeadline = 5 * time.Second
	simLeaseDuration = 8 * time.Second
	simSettle        = 2 * time.Second
	simPartitions    = 31
	simNodes         = 60 // the nodes a simulation starts with
)

// simRing is the default ring over simPartitions.
var simRing = func() RingConfig {
	c := DefaultRingConfig()
	c.Partitions = simPartitions
	return c
}()

type simClaim struct {
	holder  string
	version int
}

// simLease is a replica's Lease in the store: renewed means "changed".
type simLease struct {
	renewals int
}

type simReplica struct {
	name      string
	own       *Ownership
	crashed   bool
	leaving   bool
	pausedTo  time.Time // no steps, no renewals before this
	cutOffTo  time.Time // no API access before this
	staleTo   time.Time // the claims watch shows nothing new before this
	noBudget  time.Time // no share of the cloud budget before this
	lastRenew time.Time
	// view: the claims as this replica's watch shows them, with its own
	// writes applied at once.
	view []simClaim
	// seen: another replica's lease renewals count and when it last changed,
	// by this replica's observation.
	seenCount map[string]int
	seenAt    map[string]time.Time
	naiveOwns []bool // naive mode only
	// firstClaim is when this replica first won a claim.
	firstClaim time.Time
	// bal decides the balance publication; balSeen is the balance Lease as
	// this replica's watch shows it (it lags like the claims'); pub is the
	// publication in flight.
	bal     *Balancer
	balSeen simBalance
	pub     *simPublication
	// nodes are the nodes this replica serves, as the driver records them;
	// batch is the batch being served, stops the nodes stopping and when
	// they will have stopped.
	nodes nodeServing
	batch *simBatch
	stops map[string]time.Time
}

type sim struct {
	t *testing.T
	// naive replaces Ownership by "serve what my ring view says" (no
	// claims, no lease fence), to prove the I1 check can fail.
	naive    bool
	violated bool
	rng      *rand.Rand
	now      time.Time
	claims   []simClaim
	leases   map[string]*simLease
	replicas []*simReplica
	nextID   int
	log      []string
	rings    map[string]*Ring // by member set, built once
	// won counts the claims won, all replicas together.
	won int
	// phantom, when set, is a replica every one sees by its Lease but never
	// as a ring member, and whose Lease flaps (it is in view every other
	// second).
	phantom bool
	// nodes are the BCC nodes that exist; failing: a batch fails some of
	// its nodes (only while faults are injected).
	nodes    []string
	nextNode int
	failing  bool
	// balance is the balance Lease; published counts the publications.
	balance   simBalance
	published int
}

func newSim(t *testing.T, seed uint64, n int) *sim {
	s := &sim{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), now: time.Unix(1_000_000, 0),
		claims: make([]simClaim, simPartitions), leases: map[string]*simLease{}, rings: map[string]*Ring{}}
	s.addNodes(simNodes)
	for range n {
		s.join()
	}
	return s
}

func (s *sim) join() *simReplica {
	s.nextID++
	name := "r" + strconv.Itoa(s.nextID)
	r := &simReplica{
		name: name,
		own: NewOwnership(OwnershipConfig{
			Self:            name,
			Partitions:      simPartitions,
			ColdStartSettle: simSettle,
			SettleCap:       simSettle + simLeaseDuration,
			Start:           s.now,
		}),
		lastRenew: s.now,
		view:      slices.Clone(s.claims),
		seenCount: map[string]int{},
		seenAt:    map[string]time.Time{},
		bal: NewBalancer(BalancerConfig{
			Self:       name,
			Partitions: simPartitions,
			Interval:   balanceInterval,
		}),
		balSeen: s.balance,
		nodes:   newNodeServing(),
		stops:   map[string]time.Time{},
	}
	r.own.Renewed(s.now, s.now.Add(simRenewDeadline)) // the Lease is created first
	s.replicas = append(s.replicas, r)
	s.leases[name] = &simLease{}
	s.logf("join %s", name)
	return r
}

func (s *sim) logf(format string, args ...any) {
	s.log = append(s.log, s.now.Format("15:04:05.0")+" "+fmt.Sprintf(format, args...))
}

func (r *simReplica) active(now time.Time) bool { return !r.crashed && !now.Before(r.pausedTo) }
func (r *simReplica) online(now time.Time) bool { return r.active(now) && !now.Before(r.cutOffTo) }

// expired is r's judgement of another replica's lease.
func (s *sim) expired(r *simReplica, other string) bool {
	if _, ok := s.leases[other]; !ok {
		return true // deleted by a graceful leave
	}
	at, ok := r.seenAt[other]
	return ok && s.now.Sub(at) >= simLeaseDuration
}

// liveMembers is r's view of the live replicas: leases it has not seen
// expire (the ring's input; memberlist would only make this faster).
func (s *sim) liveMembers(r *simReplica) []string {
	var out []string
	for name := range s.leases {
		if name == r.name || !s.expired(r, name) {
			out = append(out, name)
		}
	}
	if r.leaving {
		out = slices.DeleteFunc(out, func(n string) bool { return n == r.name })
	}
	slices.Sort(out)
	return out
}

func (s *sim) tick() {
	s.now = s.now.Add(simTick)
	for _, r := range s.replicas {
		if !r.online(s.now) {
			continue
		}
		s.renew(r)
		for name, l := range s.leases {
			if c, ok := r.seenCount[name]; !ok || c != l.renewals {
				r.seenCount[name], r.seenAt[name] = l.renewals, s.now
			}
		}
		if !s.now.Before(r.staleTo) {
			r.view = slices.Clone(s.claims)
			r.balSeen = s.balance
		}
		s.step(r)
	}
	s.checkI1()
	s.checkNodes()
}

// renew renews r's Lease when due. A renewal after a lapse fences; the
// fenced partitions' nodes are stopped by the step that follows.
func (s *sim) renew(r *simReplica) {
	l, ok := s.leases[r.name]
	if !ok || s.now.Sub(r.lastRenew) < simRenewEvery {
		return
	}
	l.renewals++
	r.lastRenew = s.now
	lapsed, fenced := r.own.Renewed(s.now, s.now.Add(simRenewDeadline))
	if lapsed {
		s.logf("%s renews after a lapse, fences %v", r.name, fenced)
	}
}

// step is one step of r's driver: apply the I/O outcomes due, run the
// Balancer, the Ownership and the node plan, and start their I/O.
func (s *sim) step(r *simReplica) {
	s.finishIO(r)
	members := s.liveMembers(r)
	if len(members) == 0 {
		return
	}
	owners := s.stepBalance(r, members)
	if s.naive {
		r.naiveOwns = make([]bool, simPartitions)
		for p, o := range owners {
			r.naiveOwns[p] = o == r.name
		}
		return
	}
	acts, err := r.own.Step(s.view(r, members, owners))
	if err != nil {
		s.t.Fatal(err)
	}
	s.checkBudgetHold(r, acts)
	s.apply(r, acts)
	s.serveNodes(r)
	if r.leaving && r.own.idle() && r.nodesIdle() {
		delete(s.leases, r.name)
		r.crashed = true // gone for good
		s.logf("%s left", r.name)
	}
}

// view is what r's driver shows its Ownership.
func (s *sim) view(r *simReplica, members, owners []string) View {
	v := View{
		Now: s.now, Wanted: owners, Claims: make([]Claim, simPartitions),
		Expired:    func(o string) bool { return s.expired(r, o) },
		Live:       members,
		InView:     members,
		BudgetHeld: !s.now.Before(r.noBudget),
		Busy:       r.nodes.busy(simPartitions),
	}
	if s.phantom && s.now.Unix()%2 == 0 {
		v.InView = append(slices.Clone(members), "phantom(lease)")
	}
	for p, c := range r.view {
		v.Claims[p] = Claim{Holder: c.holder, Version: strconv.Itoa(c.version)}
	}
	return v
}

// checkBudgetHold: a replica without a budget share claims nothing.
func (s *sim) checkBudgetHold(r *simReplica, acts []Action) {
	if !s.now.Before(r.noBudget) {
		return
	}
	for _, a := range acts {
		if a.Kind == ActClaim {
			s.t.Fatalf("%s claims partition %d at %s without a share of the budget", r.name, a.Partition, s.now.Format("15:04:05.0"))
		}
	}
}

// apply carries out r's actions against the store.
func (s *sim) apply(r *simReplica, acts []Action) {
	for len(acts) > 0 {
		a := acts[0]
		acts = acts[1:]
		switch a.Kind {
		case ActClaim:
			won := s.cas(r, a.Partition, a.Version, r.name)
			if won {
				s.won++
				if r.firstClaim.IsZero() {
					r.firstClaim = s.now
				}
				s.logf("%s claims p%d", r.name, a.Partition)
			}
			more, err := r.own.ClaimResult(a.Partition, won)
			if err != nil {
				s.t.Fatal(err)
			}
			acts = append(acts, more...)
		case ActStop:
			// The node plan that follows stops the partition's nodes.
		case ActRelease, ActReleaseOrphan:
			s.checkRelease(r, a)
			if s.claims[a.Partition].holder == r.name && s.cas(r, a.Partition, a.Version, "") {
				s.logf("%s releases p%d (%s)", r.name, a.Partition, a.Kind)
			}
			if a.Kind == ActReleaseOrphan {
				r.own.OrphanReleased(a.Partition)
			}
		case ActServe:
		}
	}
}

// cas writes holder into p's claim if it is still at version; the writer's
// own view shows its write at once.
func (s *sim) cas(r *simReplica, p int, version, holder string) bool {
	c := &s.claims[p]
	if strconv.Itoa(c.version) != version {
		return false
	}
	c.holder, c.version = holder, c.version+1
	r.view[p] = *c
	return true
}

// idle: nothing claimed, served or draining (the sim's leave is complete).
func (o *Ownership) idle() bool {
	for _, st := range o.states {
		if st != Unowned {
			return false
		}
	}
	return !o.Releasing()
}

// ring returns the ring over a member set, cached: the ring is
// deterministic for a set, building it every tick dominates the run, and
// the Balancer keeps its table for as long as the ring is the same.
func (s *sim) ring(members []string) *Ring {
	key := strings.Join(members, ",")
	if r, ok := s.rings[key]; ok {
		return r
	}
	ring, err := NewRing(simRing, members)
	if err != nil {
		s.t.Fatal(err)
	}
	s.rings[key] = ring
	return ring
}

// checkI1: at no instant may two replicas be able to serve one partition. A
// paused replica counts: it could resume at any moment and allocate before
// stepping, so its CanServe (by its own lease clock) must already be false.
func (s *sim) checkI1() {
	for p := range simPartitions {
		var servers []string
		for _, r := range s.replicas {
			can := r.own.CanServe(p, s.now)
			if s.naive {
				can = r.naiveOwns != nil && r.naiveOwns[p]
			}
			if !r.crashed && can {
				servers = append(servers, r.name)
			}
		}
		if len(servers) > 1 && s.naive {
			s.violated = true
			return
		}
		if len(servers) > 1 {
			s.t.Fatalf("I1 violated at %s: partition %d servable by %v\nlast events:\n%s",
				s.now.Format("15:04:05.0"), p, servers, s.tail(30))
		}
	}
}

func (s *sim) tail(n int) string {
	out := ""
	for _, l := range s.log[max(0, len(s.log)-n):] {
		out += l + "\n"
	}
	return out
}

func (s *sim) live() []*simReplica {
	var out []*simReplica
	for _, r := range s.replicas {
		if !r.crashed && !r.leaving {
			out = append(out, r)
		}
	}
	return out
}

// settle runs without faults (paused and cut-off replicas come back), then
// checks that every live replica balances to the table of the published
// counts, that every partition is served by exactly its owner in that table,
// and every node of it by that owner alone.
func (s *sim) settle() {
	for range 400 {
		s.tick()
	}
	var names []string
	for _, r := range s.live() {
		names = append(names, r.name)
	}
	slices.Sort(names)
	owners := s.settledTable(names)
	for p := range simPartitions {
		want := owners[p]
		for _, r := range s.live() {
			serving := r.own.CanServe(p, s.now)
			if serving != (r.name == want) {
				s.t.Fatalf("after settling, partition %d: %s serving=%v, owner %s\n%s", p, r.name, serving, want, s.tail(40))
			}
		}
	}
	s.settledNodes()
}
