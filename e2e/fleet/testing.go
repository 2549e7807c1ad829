package fleet

import (
	"context"
	"testing"
)

// Start starts a fleet for a test or benchmark, or fails it. Everything is
// stopped by t.Cleanup, also when the test fails or panics; on failure the
// tails of every log are printed. Unless Options.Dir is set, the logs live
// in t.TempDir().
func Start(t testing.TB, opts Options) *Fleet {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	f, err := New(context.Background(), opts)
	if err != nil {
		t.Fatalf("start fleet: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fleet logs (tails) in %s:\n%s", f.Dir, f.LogTails(60))
		}
		if err := f.Close(); err != nil {
			t.Errorf("stop fleet: %v", err)
		}
	})
	return f
}
