package shard

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A deterministic simulation of replicas running Ownership against a CAS
// store (the API server), with crashes, pauses longer than the lease,
// replicas cut off from the API server, watches that lag behind after a
// pause or a cut-off, joins and graceful leaves. I1 is checked at every
// tick: no partition is servable by two replicas at once. After the faults
// stop, every partition must be served by exactly its ring owner
// (liveness). Scripted runs on the same harness check the hold of a cold
// start (the replicas split the nodes once; the wait is capped; a join into
// a running cluster does not wait; nothing is claimed without a budget
// share) and the release of claims a fenced stop left behind.

const (
	simTick          = 100 * time.Millisecond
	simRenewEvery    = time.Second
	simRenewDeadline = 5 * time.Second
	simLeaseDuration = 8 * time.Second
	simSettle        = 2 * time.Second
	simPartitions    = 31
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
	// stopping partitions have nodes that finish stopping at the given time.
	stopping map[int]time.Time
	// firstClaim is when this replica first won a claim.
	firstClaim time.Time
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
	rings    map[string][]string // member set → owners, built once
	// won counts the claims won, all replicas together.
	won int
	// phantom, when set, is a replica every one sees by its Lease but never
	// as a ring member, and whose Lease flaps (it is in view every other
	// second).
	phantom bool
}

func newSim(t *testing.T, seed uint64, n int) *sim {
	s := &sim{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), now: time.Unix(1_000_000, 0),
		claims: make([]simClaim, simPartitions), leases: map[string]*simLease{}, rings: map[string][]string{}}
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
		stopping:  map[int]time.Time{},
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
		}
		s.step(r)
	}
	s.checkI1()
}

// renew renews r's Lease when due. A renewal after a lapse fences, and the
// fenced partitions' nodes take a moment to stop.
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
	for _, p := range fenced {
		r.stopping[p] = s.now.Add(time.Duration(s.rng.IntN(5)) * simTick)
	}
}

func (s *sim) step(r *simReplica) {
	members := s.liveMembers(r)
	if len(members) == 0 {
		return
	}
	owners := s.owners(members)
	if s.naive {
		r.naiveOwns = make([]bool, simPartitions)
		for p, o := range owners {
			r.naiveOwns[p] = o == r.name
		}
		return
	}
	// Nodes that finished stopping. Sorted, so that a seed replays the
	// same run.
	for _, p := range slices.Sorted(maps.Keys(r.stopping)) {
		if !s.now.Before(r.stopping[p]) {
			delete(r.stopping, p)
		}
	}
	acts, err := r.own.Step(s.view(r, members, owners))
	if err != nil {
		s.t.Fatal(err)
	}
	s.checkBudgetHold(r, acts)
	s.apply(r, acts)
	if r.leaving && r.own.idle() && len(r.stopping) == 0 {
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
		Busy:       func(p int) bool { _, ok := r.stopping[p]; return ok },
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
			// In-flight calls take a little while to drain.
			r.stopping[a.Partition] = s.now.Add(time.Duration(s.rng.IntN(5)) * simTick)
		case ActRelease, ActReleaseOrphan:
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

// owners returns the ring's table for a member set, cached: the ring is
// deterministic for a set, and building it every tick dominates the run.
func (s *sim) owners(members []string) []string {
	key := strings.Join(members, ",")
	if o, ok := s.rings[key]; ok {
		return o
	}
	ring, err := NewRing(simRing, members)
	if err != nil {
		s.t.Fatal(err)
	}
	s.rings[key] = ring.Table().Owners
	return s.rings[key]
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

// fault injects one random event. A replica back from a pause or a cut-off
// renews at once, but its claims watch catches up only a little later.
func (s *sim) fault() {
	live := s.live()
	switch k := s.rng.IntN(6); {
	case k == 0 || len(live) < 2:
		s.join()
	case k == 1:
		r := live[s.rng.IntN(len(live))]
		r.crashed = true
		s.logf("crash %s", r.name)
	case k == 2:
		r := live[s.rng.IntN(len(live))]
		r.pausedTo = s.now.Add(time.Duration(5+s.rng.IntN(150)) * simTick) // up to 15s: past the lease
		r.staleTo = r.pausedTo.Add(time.Duration(s.rng.IntN(30)) * simTick)
		s.logf("pause %s until %s", r.name, r.pausedTo.Format("15:04:05.0"))
	case k == 3:
		r := live[s.rng.IntN(len(live))]
		r.cutOffTo = s.now.Add(time.Duration(5+s.rng.IntN(150)) * simTick)
		r.staleTo = r.cutOffTo.Add(time.Duration(s.rng.IntN(30)) * simTick)
		s.logf("cut off %s until %s", r.name, r.cutOffTo.Format("15:04:05.0"))
	case k == 4:
		r := live[s.rng.IntN(len(live))]
		r.leaving = true
		s.logf("%s leaving", r.name)
	default:
		s.join()
	}
}

func TestOwnership_Simulation_I1(t *testing.T) {
	seeds := 30
	if testing.Short() {
		seeds = 5
	}
	for seed := range uint64(seeds) {
		t.Run("seed="+strconv.FormatUint(seed, 10), func(t *testing.T) {
			s := newSim(t, seed, 3)
			// Faults for 2 simulated minutes, one every ~3s on average.
			for range 1200 {
				if s.rng.IntN(30) == 0 {
					s.fault()
				}
				s.tick()
			}
			if len(s.live()) == 0 {
				s.join()
			}
			s.settle()
		})
	}
}

// settle runs without faults (paused and cut-off replicas come back), then
// checks that every partition is served by exactly the ring owner of the
// live replicas.
func (s *sim) settle() {
	for range 400 {
		s.tick()
	}
	var names []string
	for _, r := range s.live() {
		names = append(names, r.name)
	}
	slices.Sort(names)
	owners := s.owners(names)
	for p := range simPartitions {
		want := owners[p]
		for _, r := range s.live() {
			serving := r.own.CanServe(p, s.now)
			if serving != (r.name == want) {
				s.t.Fatalf("after settling, partition %d: %s serving=%v, ring owner %s\n%s", p, r.name, serving, want, s.tail(40))
			}
		}
	}
}

// The simulation must be able to fail: replicas that serve whatever their
// own ring view says, without claims or a lease fence, are caught.
func TestOwnership_Simulation_CatchesUnfencedOwners(t *testing.T) {
	for seed := range uint64(20) {
		s := newSim(t, seed, 3)
		s.naive = true
		for range 1200 {
			if s.rng.IntN(30) == 0 {
				s.fault()
			}
			s.tick()
			if s.violated {
				t.Logf("seed %d: caught at %s", seed, s.now.Format("15:04:05.0"))
				return
			}
		}
	}
	t.Fatal("the I1 check never caught replicas that serve without fencing")
}
