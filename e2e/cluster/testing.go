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
	"sync"
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

// Pool is a set of control planes that the tests of one package take in
// turn. A test that runs cce-ipam replicas needs a control plane to itself:
// the replicas watch every Node, so a fleet would see (and try to serve)
// another test's nodes. With several control planes such tests run in
// parallel (t.Parallel), one per control plane at a time.
type Pool struct {
	free chan *Cluster
}

// Get blocks until one of the pool's control planes is free, gives it to t
// and takes it back when t ends.
func (p *Pool) Get(t testing.TB) *Cluster {
	t.Helper()
	c := <-p.free
	t.Cleanup(func() { p.free <- c })
	return c
}

// RunTestsOnPool is RunTests with n control planes (started at once) in a
// Pool stored in *out. Any that fails to start fails the package.
func RunTestsOnPool(m *testing.M, opts Options, n int, out **Pool) int {
	started := make([]*Cluster, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() { started[k], errs[k] = Start(context.Background(), opts) })
	}
	wg.Wait()
	pool := &Pool{free: make(chan *Cluster, n)}
	code := 0
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintf(os.Stderr, "start control planes: %v\n", err)
		code = 1
	} else {
		for _, c := range started {
			pool.free <- c
		}
		*out = pool
		code = m.Run()
	}
	for k, c := range started {
		if c == nil {
			continue
		}
		if code != 0 {
			fmt.Fprintf(os.Stderr, "control plane %d, logs (tails):\n%s", k, c.Logs(20))
		}
		if err := c.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "stop control plane %d: %v\n", k, err)
			if code == 0 {
				code = 1
			}
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
