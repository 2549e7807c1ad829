package datastore

import (
	"flag"
	"math/rand/v2"
	"testing"
	"time"
)

var (
	propSeed  = flag.Uint64("datastore.seed", 0, "seed for TestStore_Property (0: time-based)")
	propSteps = flag.Int("datastore.steps", 20000, "operations per TestStore_Property run")
)

// TestStore_Property drives the Store and the reference model with the
// same random operations across three nodes and six ENIs, and after every
// step checks the invariants and that both agree exactly. Rerun a failure
// with -datastore.seed=N.
func TestStore_Property(t *testing.T) {
	seed := *propSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -datastore.seed=%d)", seed, seed)
	h := newHarness(t, randSource{rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))})
	for range *propSteps {
		h.step()
	}
	t.Logf("cooldown %s, %d ops: %v", h.s.Cooldown(), h.total(), h.counts)
	if h.counts["Allocate"] == 0 || h.counts["Restore"] == 0 {
		t.Fatalf("op mix degenerate: %v", h.counts)
	}
}
