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
// replicas cut off from the API server, joins and graceful leaves. I1 is
// checked at every tick: no partition is servable by two replicas at once.
// After the faults stop, every partition must be served by exactly its
// ring owner (liveness).

const (
	simTick          = 100 * time.Millisecond
	simRenewEvery    = time.Second
	simRenewDeadline = 5 * time.Second
	simLeaseDuration = 8 * time.Second
	simPartitions    = 31
)

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
	lastRenew time.Time
	// seen: another replica's lease renewals count and when it last changed,
	// by this replica's observation.
	seenCount map[string]int
	seenAt    map[string]time.Time
	naiveOwns []bool // naive mode only
	// stopping partitions finish draining at the given time.
	stopping map[int]time.Time
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
}

func newSim(t *testing.T, seed uint64, n int) *sim {
	s := &sim{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), now: time.Unix(1_000_000, 0),
		claims: make([]simClaim, simPartitions), leases: map[string]*simLease{}, rings: map[string][]string{}}
	for range n {
		s.join()
	}
	return s
}

func (s *sim) join() {
	s.nextID++
	name := "r" + strconv.Itoa(s.nextID)
	s.replicas = append(s.replicas, &simReplica{
		name: name, own: NewOwnership(name, simPartitions), lastRenew: s.now,
		seenCount: map[string]int{}, seenAt: map[string]time.Time{}, stopping: map[int]time.Time{},
	})
	s.leases[name] = &simLease{}
	s.logf("join %s", name)
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
		// Renew, and observe the others' leases.
		if s.now.Sub(r.lastRenew) >= simRenewEvery {
			if l, ok := s.leases[r.name]; ok {
				l.renewals++
				r.lastRenew = s.now
			}
		}
		for name, l := range s.leases {
			if c, ok := r.seenCount[name]; !ok || c != l.renewals {
				r.seenCount[name], r.seenAt[name] = l.renewals, s.now
			}
		}
		s.step(r)
	}
	s.checkI1()
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
	view := View{
		Now: s.now, Wanted: owners, Claims: make([]Claim, simPartitions),
		Expired:         func(o string) bool { return s.expired(r, o) },
		LeaseValidUntil: r.lastRenew.Add(simRenewDeadline),
	}
	for p, c := range s.claims {
		view.Claims[p] = Claim{Holder: c.holder, Version: strconv.Itoa(c.version)}
	}
	acts, err := r.own.Step(view)
	if err != nil {
		s.t.Fatal(err)
	}
	// Drains that finished.
	// Sorted, so that a seed replays the same run.
	for _, p := range slices.Sorted(maps.Keys(r.stopping)) {
		if at := r.stopping[p]; !s.now.Before(at) {
			delete(r.stopping, p)
			more, err := r.own.Stopped(p, strconv.Itoa(s.claims[p].version))
			if err != nil {
				s.t.Fatal(err)
			}
			acts = append(acts, more...)
		}
	}
	for len(acts) > 0 {
		a := acts[0]
		acts = acts[1:]
		switch a.Kind {
		case ActClaim:
			c := &s.claims[a.Partition]
			won := strconv.Itoa(c.version) == a.Version
			if won {
				c.holder, c.version = r.name, c.version+1
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
		case ActRelease:
			c := &s.claims[a.Partition]
			if strconv.Itoa(c.version) == a.Version && c.holder == r.name {
				c.holder, c.version = "", c.version+1
				s.logf("%s releases p%d", r.name, a.Partition)
			}
		case ActServe:
		}
	}
	if r.leaving && len(r.own.Serving()) == 0 && len(r.stopping) == 0 {
		delete(s.leases, r.name)
		r.crashed = true // gone for good
		s.logf("%s left", r.name)
	}
}

// owners returns the ring's table for a member set, cached: the ring is
// deterministic for a set, and building it every tick dominates the run.
func (s *sim) owners(members []string) []string {
	key := strings.Join(members, ",")
	if o, ok := s.rings[key]; ok {
		return o
	}
	ring, err := NewRing(RingConfig{Partitions: simPartitions}, members)
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
			can := r.own.CanServe(p, s.now, r.lastRenew.Add(simRenewDeadline))
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

// fault injects one random event.
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
		s.logf("pause %s until %s", r.name, r.pausedTo.Format("15:04:05.0"))
	case k == 3:
		r := live[s.rng.IntN(len(live))]
		r.cutOffTo = s.now.Add(time.Duration(5+s.rng.IntN(150)) * simTick)
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
			// Settle: no faults; paused and cut-off replicas come back.
			for range 400 {
				s.tick()
			}
			s.checkSettled()
		})
	}
}

// checkSettled: every partition is served by exactly the ring owner of the
// live replicas.
func (s *sim) checkSettled() {
	var names []string
	for _, r := range s.live() {
		names = append(names, r.name)
	}
	slices.Sort(names)
	owners := s.owners(names)
	for p := range simPartitions {
		want := owners[p]
		for _, r := range s.live() {
			serving := r.own.CanServe(p, s.now, r.lastRenew.Add(simRenewDeadline))
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
