package supervisor

import (
	"path/filepath"
	"testing"
)

// StartT starts the child for a test, or fails it. When the test ends (also
// when it failed or panicked) the child's process group is killed; if the
// test failed, the tail of its log is logged. A test that wants a graceful
// stop calls Stop itself before it ends.
func StartT(t testing.TB, spec Spec) *Process {
	t.Helper()
	if spec.LogPath == "" {
		spec.LogPath = filepath.Join(t.TempDir(), spec.Name+".log")
	}
	p, err := Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Kill(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("==> %s log (last 40 lines) <==\n%s", p.name, p.LogTail(40))
		}
	})
	return p
}
