//go:build integration

package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestDemo runs `make demo` small: every process is real (control plane with
// kube-controller-manager, bce-sim, three cce-ipam replicas), and the demo's
// own checks (unique IPs, a fixed IP kept across a restart, IPs released on
// scale-down, the invariant checker) must pass. make test builds the
// binaries into bin/ first.
func TestDemo(t *testing.T) {
	binDir := os.Getenv("CCE_IPAM_BIN_DIR")
	if binDir == "" {
		binDir = "../../bin"
	}
	binDir, err := filepath.Abs(binDir) // before the Chdir below
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chdir("../.."); err != nil { // the demo reads charts/ from the repository root
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := run(ctx, options{binDir: binDir, replicas: 3, nodes: 3, pods: 24, live: true, duration: 5 * time.Second, timeout: 3 * time.Minute, removeDir: true}); err != nil {
		t.Fatal(err)
	}
}
