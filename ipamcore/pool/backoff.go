package pool

import (
	"fmt"
	"time"
)

// BackoffPolicy paces an ENI that failed with "subnet has no more IP" or
// "VM memory cannot attach more IP": the first retry waits Initial, each
// further failure doubles the wait, up to Max.
//
// Unlike the reference, nothing sleeps: PlanGrow skips an ENI whose backoff
// has not expired and tries the others, so the reference's cap of
// 60s ÷ number-of-ENIs (which bounded a sleeping CNI call) is not needed;
// Max is a plain cap. There is no jitter, to keep plans deterministic; a
// caller that wants jitter can stretch Until itself.
type BackoffPolicy struct {
	Initial time.Duration
	Max     time.Duration
}

// DefaultBackoffPolicy: 2s doubling up to 60s, as in the reference.
func DefaultBackoffPolicy() BackoffPolicy {
	return BackoffPolicy{
		Initial: 2 * time.Second,
		Max:     60 * time.Second,
	}
}

// Validate checks the policy.
func (p BackoffPolicy) Validate() error {
	if p.Initial <= 0 || p.Max < p.Initial {
		return fmt.Errorf("backoff initial %s, max %s: want 0 < initial <= max", p.Initial, p.Max)
	}
	return nil
}

// Backoff is one ENI's state. The zero value means "no backoff". The
// caller keeps one per ENI and drops it (or sets it to the zero value) when
// an add on that ENI succeeds, the ENI is re-synced, or it is detached.
type Backoff struct {
	Failures int       // consecutive capacity failures
	Until    time.Time // no adds on the ENI before this
	// MaxBatch limits the next add once Until has passed: half of the
	// batch that failed, at least 1 (the reference halved 4 → 2 → 1, as
	// the ENI may have room for fewer addresses).
	MaxBatch int
}

// Active reports whether the ENI must be skipped at now.
func (b Backoff) Active(now time.Time) bool { return now.Before(b.Until) }

// Fail returns the state after an add of attempted addresses failed with
// a capacity error at now.
func (p BackoffPolicy) Fail(prev Backoff, attempted int, now time.Time) Backoff {
	f := prev.Failures + 1
	d := p.Initial
	for i := 1; i < f && d < p.Max; i++ {
		if d > p.Max/2 { // doubling would pass Max (or overflow)
			d = p.Max
			break
		}
		d *= 2
	}
	d = min(d, p.Max)
	return Backoff{
		Failures: f,
		Until:    now.Add(d),
		MaxBatch: max(1, attempted/2),
	}
}
