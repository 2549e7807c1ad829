package shard

import (
	"flag"
	"strconv"
	"testing"
	"time"
)

// The simulation under random faults (the harness is ownership_sim_test.go):
// I1 and the other checks at every tick, then liveness once the faults stop;
// and proof that the I1 check can fail.

// fault injects one random event. A replica back from a pause or a cut-off
// renews at once, but its claims watch catches up only a little later.
func (s *sim) fault() {
	live := s.live()
	switch k := s.rng.IntN(8); {
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
	case k == 5:
		s.addNodes(1 + s.rng.IntN(40))
	case k == 6:
		s.deleteNodes(1 + s.rng.IntN(30))
	default:
		s.join()
	}
}

// Other seeds of the simulation: go test ./shard/ -run Simulation_I1 -sim.first=1000 -sim.seeds=200
var (
	simSeeds = flag.Int("sim.seeds", 30, "how many seeds TestOwnership_Simulation_I1 runs (at most 5 with -short)")
	simFirst = flag.Uint64("sim.first", 0, "the first seed TestOwnership_Simulation_I1 runs")
)

func TestOwnership_Simulation_I1(t *testing.T) {
	seeds := *simSeeds
	if testing.Short() {
		seeds = min(seeds, 5)
	}
	for seed := *simFirst; seed < *simFirst+uint64(seeds); seed++ {
		t.Run("seed="+strconv.FormatUint(seed, 10), func(t *testing.T) {
			s := newSim(t, seed, 3)
			// Faults for 2 simulated minutes, one every ~3s on average.
			s.failing = true
			for range 1200 {
				if s.rng.IntN(30) == 0 {
					s.fault()
				}
				s.tick()
			}
			s.failing = false
			if len(s.live()) == 0 {
				s.join()
			}
			s.settle()
		})
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
