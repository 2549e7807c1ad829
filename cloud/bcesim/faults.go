package bcesim

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Faults is the injectable misbehaviour, set through the admin API or
// Server.SetFaults. Map keys are operation names; "*" applies to every
// operation without its own entry.
type Faults struct {
	// LatencyMs delays each call before it is handled. Above the SDK's client
	// timeout (20 s upstream) the caller sees a non-retried timeout.
	LatencyMs map[Op]int `json:"latencyMs,omitempty"`
	// ErrorRate answers this fraction of calls with 500 InternalError before
	// touching the world (the SDK retries these).
	ErrorRate map[Op]float64 `json:"errorRate,omitempty"`
	// FailAfterMutation makes the next N successful mutations of an operation
	// answer 500 after the world changed. The SDK re-sends the identical
	// request, so without a clientToken the mutation is applied again.
	FailAfterMutation map[Op]int `json:"failAfterMutation,omitempty"`
	// ReplicaLagMs makes ENI reads show the state of that long ago, and makes
	// releasing an address younger than that fail as "not found".
	ReplicaLagMs int `json:"replicaLagMs,omitempty"`
}

func (f *Faults) validate() error {
	for op, ms := range f.LatencyMs {
		if ms < 0 || ms > 600_000 {
			return fmt.Errorf("latencyMs[%s]=%d: want 0..600000", op, ms)
		}
	}
	for op, r := range f.ErrorRate {
		if !(r >= 0 && r <= 1) {
			return fmt.Errorf("errorRate[%s]=%v: want 0..1", op, r)
		}
	}
	for op, n := range f.FailAfterMutation {
		if n < 0 || !op.Mutating() {
			return fmt.Errorf("failAfterMutation[%s]=%d: want a count >= 0 on a mutating operation", op, n)
		}
	}
	if f.ReplicaLagMs < 0 || f.ReplicaLagMs > 600_000 {
		return fmt.Errorf("replicaLagMs=%d: want 0..600000", f.ReplicaLagMs)
	}
	return nil
}

// faultState applies Faults; its random source is seeded so a run with the
// same seed and the same call order injects the same errors.
type faultState struct {
	mu  sync.Mutex
	f   Faults
	rng *rand.Rand
}

func newFaultState(seed uint64) *faultState {
	return &faultState{rng: rand.New(rand.NewPCG(seed, seed+1))}
}

func lookup[V any](m map[Op]V, op Op) (V, bool) {
	if v, ok := m[op]; ok {
		return v, true
	}
	v, ok := m["*"]
	return v, ok
}

func (s *faultState) set(f Faults) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.f = f
}

func (s *faultState) get() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.f
}

func (s *faultState) latency(op Op) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	ms, _ := lookup(s.f.LatencyMs, op)
	return time.Duration(ms) * time.Millisecond
}

func (s *faultState) lag() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Duration(s.f.ReplicaLagMs) * time.Millisecond
}

// injectError decides whether this call fails before it is handled.
func (s *faultState) injectError(op Op) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := lookup(s.f.ErrorRate, op)
	return ok && r > 0 && s.rng.Float64() < r
}

// failAfter consumes one armed post-mutation failure for op.
func (s *faultState) failAfter(op Op) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f.FailAfterMutation[op] > 0 {
		s.f.FailAfterMutation[op]--
		return true
	}
	return false
}
