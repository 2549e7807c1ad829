package cloud

import (
	"context"
	"errors"
	"testing"
)

func TestLimiter_SetRateKeepsSpentTokens(t *testing.T) {
	l, err := NewLimiter(0.001, 3)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if d, err := l.Wait(context.Background()); err != nil || d != 0 {
			t.Fatalf("token within burst waited %v, %v", d, err)
		}
	}
	// The bucket is empty; a new rate must not hand out a fresh burst.
	if err := l.SetRate(0.002, 10); err != nil {
		t.Fatal(err)
	}
	if got := l.bucket.Available(); got > 0 {
		t.Fatalf("after SetRate %d tokens available, want 0", got)
	}
	if r, b := l.Rate(); r != 0.002 || b != 10 {
		t.Fatalf("Rate() = %v, %v", r, b)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait on an empty bucket with a canceled context: %v", err)
	}
}

func TestLimiter_SetRateCapsAtNewBurst(t *testing.T) {
	l, _ := NewLimiter(1, 100)
	if err := l.SetRate(1, 5); err != nil {
		t.Fatal(err)
	}
	if got := l.bucket.Available(); got != 5 {
		t.Fatalf("available = %d, want the new burst 5", got)
	}
}

func TestLimiter_RejectsBadRates(t *testing.T) {
	for _, c := range []struct {
		rate  float64
		burst int64
	}{{0, 1}, {-1, 1}, {1, 0}, {2e9, 1}} {
		if _, err := NewLimiter(c.rate, c.burst); err == nil {
			t.Errorf("NewLimiter(%v, %d) accepted", c.rate, c.burst)
		}
	}
	l, _ := NewLimiter(1, 1)
	if err := l.SetRate(0, 1); err == nil {
		t.Error("SetRate(0, 1) accepted")
	}
	// The residue of a budget share computed as 50 - (16.67 + 33.33): the
	// token bucket library panics on it ("cannot find suitable quantum"),
	// which took a replica down in the chaos suite.
	if err := l.SetRate(7.105427357601002e-15, 1); err == nil {
		t.Error("SetRate(7.1e-15, 1) accepted")
	}
	if _, err := NewLimiter(1e-12, 1); err == nil {
		t.Error("NewLimiter(1e-12, 1) accepted")
	}
}

// FuzzLimiterRate: any rate and burst is an error or a working limiter,
// never a panic.
func FuzzLimiterRate(f *testing.F) {
	f.Add(7.105427357601002e-15, int64(1))
	f.Add(1.0, int64(1))
	f.Add(1e9, int64(1<<40))
	f.Fuzz(func(t *testing.T, rate float64, burst int64) {
		l, err := NewLimiter(1, 1)
		if err != nil {
			t.Fatal(err)
		}
		_ = l.SetRate(rate, burst)
		_, _ = NewLimiter(rate, burst)
	})
}
