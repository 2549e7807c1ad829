package membership

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// fastConfig is the LAN profile with shorter timings so that failure
// detection takes well under a second on loopback.
func fastConfig(name string, seeds ...string) Config {
	c := DefaultConfig()
	c.BindAddr = "127.0.0.1"
	c.BindPort = 0 // any free port
	c.NamePrefix = name
	c.JoinSeeds = seeds
	c.JoinInterval = 200 * time.Millisecond
	c.ProbeInterval = 100 * time.Millisecond
	c.ProbeTimeout = 50 * time.Millisecond
	c.SuspicionMult = 2
	c.GossipInterval = 20 * time.Millisecond
	c.PushPullInterval = 2 * time.Second
	c.TCPTimeout = time.Second
	c.LeaveTimeout = 2 * time.Second
	c.GRPCAddr = "127.0.0.1:9090"
	c.Version = "test"
	return c
}

// testNode is one Membership running in the test process.
type testNode struct {
	t      *testing.T
	m      *Membership
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error

	mu       sync.Mutex
	events   []Event
	consumed chan struct{} // closed when the event channel is closed
	once     sync.Once
}

// start runs a Membership until the test ends. consume=false leaves the
// event channel unread until consume() is called.
func start(t *testing.T, cfg Config, consume bool) *testNode {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := New(cfg, time.Now(), nil, reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &testNode{
		t:        t,
		m:        m,
		reg:      reg,
		cancel:   cancel,
		done:     make(chan error, 1),
		consumed: make(chan struct{}),
	}
	go func() { n.done <- m.Run(ctx) }()
	select {
	case <-m.Started():
	case err := <-n.done:
		t.Fatalf("Run: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("gossip did not start")
	}
	if consume {
		n.consume()
	}
	t.Cleanup(func() { n.stop() })
	return n
}

func (n *testNode) consume() {
	n.once.Do(func() {
		go func() {
			defer close(n.consumed)
			for ev := range n.m.Events() {
				n.mu.Lock()
				n.events = append(n.events, ev)
				n.mu.Unlock()
			}
		}()
	})
}

// stop cancels Run and waits for it and the consumer; Run must return in time.
func (n *testNode) stop() {
	n.t.Helper()
	n.cancel()
	select {
	case err, ok := <-n.done:
		if ok && err != nil {
			n.t.Errorf("Run of %s: %v", n.m.Name(), err)
		}
		if ok {
			close(n.done)
		}
	case <-time.After(10 * time.Second):
		n.t.Errorf("Run of %s did not return", n.m.Name())
		return
	}
	n.consume() // the channel is closed now; drain it
	<-n.consumed
}

// crash ends Run without Leave: the others must detect the failure.
func (n *testNode) crash() {
	n.m.abandon.Store(true)
	n.stop()
}

func (n *testNode) Events() []Event {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Event(nil), n.events...)
}

func (n *testNode) memberNames() map[string]bool {
	out := map[string]bool{}
	for _, m := range n.m.Members() {
		out[m.Name] = true
	}
	return out
}

// sees reports whether n's live members are exactly the given nodes.
func (n *testNode) sees(nodes ...*testNode) bool {
	got := n.memberNames()
	if len(got) != len(nodes) {
		return false
	}
	for _, o := range nodes {
		if !got[o.m.Name()] {
			return false
		}
	}
	return true
}

// eventually polls cond until it holds or the deadline passes (gossip
// convergence has no event to wait on from outside).
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// counter reads a counter or gauge.
func counter(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

func portOf(t *testing.T, n *testNode) int {
	t.Helper()
	_, port, err := splitHostPort(n.m.LocalAddr(), 0)
	if err != nil {
		t.Fatalf("local address %q: %v", n.m.LocalAddr(), err)
	}
	return port
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func writeRaw(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func writeKey(t *testing.T, dir, name, key string) string {
	return writeRaw(t, dir, name, b64(key)+"\n")
}
