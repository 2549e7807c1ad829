package cluster

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// modulePath identifies this repository's go.mod when looking for bin/.
const modulePath = "github.com/cce-ipam/sharded"

// RunTests starts a control plane, stores it in *out, runs the package's
// tests, stops the control plane and returns the exit code for os.Exit.
// A control plane that does not start fails the package (it never skips).
func RunTests(m *testing.M, opts Options, out **Cluster) int {
	c, err := Start(context.Background(), opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "start control plane: %v\n", err)
		return 1
	}
	*out = c
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "control-plane logs (tails):\n%s", c.Logs(20))
	}
	if err := c.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "stop control plane: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Namespace creates a fresh namespace for one test and deletes it when the
// test ends, so tests that share a control plane do not see each other.
func (c *Cluster) Namespace(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(prefix) > 40 {
		prefix = prefix[:40]
	}
	ns, err := c.CreateNamespace(ctx, strings.Trim(prefix, "-"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.DeleteNamespace(ctx, ns); err != nil {
			t.Errorf("delete namespace %s: %v", ns, err)
		}
	})
	return ns
}

// moduleRoot walks up from the working directory to this module's go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if isModuleRoot(filepath.Join(dir, "go.mod")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod of " + modulePath + " above the working directory")
		}
		dir = parent
	}
}

func isModuleRoot(goMod string) bool {
	f, err := os.Open(goMod)
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if line := strings.TrimSpace(s.Text()); strings.HasPrefix(line, "module ") {
			return strings.TrimSpace(strings.TrimPrefix(line, "module ")) == modulePath
		}
	}
	return false
}

// insecureTLS is used only to poll /readyz before the API server has written
// the certificate that clients later verify.
func insecureTLS() *tls.Config {
	return &tls.Config{InsecureSkipVerify: true} //nolint:gosec // readiness probe only
}
