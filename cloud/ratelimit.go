package cloud

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/juju/ratelimit"
)

// Limiter is the client-side token bucket every cloud call takes a token
// from. Its rate and burst can change at run time: the shard layer hands each
// replica its share of the cluster-wide BCE budget and calls SetRate when the
// share changes. It is safe for concurrent use.
type Limiter struct {
	mu     sync.Mutex
	bucket *ratelimit.Bucket
	rate   float64
	burst  int64
	// Usage, for the shard layer's demand-following budget.
	taken  int64
	waited int64 // calls that had to wait for their token
}

// NewLimiter returns a full bucket of burst tokens refilled at rate per second.
func NewLimiter(rate float64, burst int64) (*Limiter, error) {
	if err := checkRate(rate, burst); err != nil {
		return nil, err
	}
	return &Limiter{bucket: ratelimit.NewBucketWithRate(rate, burst), rate: rate, burst: burst}, nil
}

// MinRate is the slowest rate a Limiter takes (one call per ~17 minutes).
// The token bucket cannot represent much slower ones (it panics), and a
// share computed as a difference of sums can leave a residue like 7e-15.
const MinRate = 1e-3

func checkRate(rate float64, burst int64) error {
	if !(rate >= MinRate) || math.IsInf(rate, 0) || rate > 1e9 || burst < 1 {
		return fmt.Errorf("rate limit %v/s burst %d: want %v <= rate <= 1e9 and burst >= 1", rate, burst, MinRate)
	}
	return nil
}

// SetRate replaces rate and burst. Tokens already spent stay spent: the new
// bucket starts with the old one's balance (capped at the new burst, and
// including the debt of callers still waiting), so changing the rate cannot
// mint a fresh burst.
func (l *Limiter) SetRate(rate float64, burst int64) error {
	if err := checkRate(rate, burst); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	avail := l.bucket.Available()
	nb := ratelimit.NewBucketWithRate(rate, burst)
	if debt := burst - min(avail, burst); debt > 0 {
		nb.Take(debt)
	}
	l.bucket, l.rate, l.burst = nb, rate, burst
	return nil
}

// Rate returns the current rate and burst.
func (l *Limiter) Rate() (float64, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rate, l.burst
}

// Wait takes one token, waiting for it unless ctx ends first. It returns
// how long it waited.
func (l *Limiter) Wait(ctx context.Context) (time.Duration, error) {
	l.mu.Lock()
	d := l.bucket.Take(1)
	l.taken++
	if d > 0 {
		l.waited++
	}
	l.mu.Unlock()
	if d <= 0 {
		return 0, nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	start := time.Now()
	select {
	case <-t.C:
		return d, nil
	case <-ctx.Done():
		return time.Since(start), ctx.Err()
	}
}

// TryTake takes one token if one is available now, without waiting.
func (l *Limiter) TryTake() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	ok := l.bucket.TakeAvailable(1) == 1
	if ok {
		l.taken++
	}
	return ok
}

// Usage returns how many tokens were taken so far and how many of those
// takes had to wait.
func (l *Limiter) Usage() (taken, waited int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.taken, l.waited
}
