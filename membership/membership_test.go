package membership

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/cce-ipam/sharded/e2e/freeport"
)

func TestMembership_FindEachOtherFromOneSeed(t *testing.T) {
	seed := start(t, fastConfig("ipam-0"), true)
	nodes := []*testNode{seed}
	for i := 1; i < 4; i++ {
		cfg := fastConfig(fmt.Sprintf("ipam-%d", i), seed.m.LocalAddr())
		cfg.GRPCAddr = fmt.Sprintf("10.0.0.%d:9090", i)
		nodes = append(nodes, start(t, cfg, true))
	}
	for _, n := range nodes {
		eventually(t, 10*time.Second, n.m.Name()+" sees all 4", func() bool { return n.sees(nodes...) })
	}
	if portOf(t, seed) == 0 {
		t.Fatalf("local address %q does not carry the picked port", seed.m.LocalAddr())
	}
	// Meta carries each replica's gRPC address, version and start time.
	for _, mem := range seed.m.Members() {
		want := "127.0.0.1:9090"
		for i, n := range nodes {
			if n.m.Name() == mem.Name && i > 0 {
				want = fmt.Sprintf("10.0.0.%d:9090", i)
			}
		}
		if mem.Meta.GRPCAddr != want || mem.Meta.Version != "test" || mem.Meta.StartTime.IsZero() || mem.Meta.Leaving {
			t.Errorf("member %s meta = %+v, want gRPC %s", mem.Name, mem.Meta, want)
		}
		if !strings.HasPrefix(mem.Name, "ipam-") {
			t.Errorf("member name %q lost its prefix", mem.Name)
		}
	}
	// The members gauge follows.
	eventually(t, 5*time.Second, "members gauge = 4", func() bool { return counter(seed.m.metrics.members) == 4 })
	if got := gauge(t, seed, "cce_ipam_membership_members"); got != 4 {
		t.Errorf("registered cce_ipam_membership_members = %v, want 4", got)
	}
}

func TestNew_UniqueNamesForOnePrefix(t *testing.T) {
	seen := map[string]bool{}
	for range 50 {
		m, err := New(fastConfig("ipam-0"), time.Now(), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if seen[m.Name()] || !strings.HasPrefix(m.Name(), "ipam-0-") {
			t.Fatalf("name %q repeated or without prefix", m.Name())
		}
		seen[m.Name()] = true
	}
}

func TestMembership_JoinThroughDNSName(t *testing.T) {
	a := start(t, fastConfig("ipam-a"), true)
	port := portOf(t, a)
	cfg := fastConfig("ipam-b")
	cfg.JoinDNS = fmt.Sprintf("localhost:%d", port) // resolved on every attempt
	b := start(t, cfg, true)
	eventually(t, 10*time.Second, "b joins a through DNS", func() bool { return a.sees(a, b) && b.sees(a, b) })
}

func TestMembership_CrashIsDetectedAsFailure(t *testing.T) {
	a := start(t, fastConfig("ipam-a"), true)
	b := start(t, fastConfig("ipam-b", a.m.LocalAddr()), true)
	c := start(t, fastConfig("ipam-c", a.m.LocalAddr()), true)
	for _, n := range []*testNode{a, b, c} {
		eventually(t, 10*time.Second, "3 members", func() bool { return n.sees(a, b, c) })
	}
	crashed := c.m.Name()
	c.crash() // Shutdown without Leave
	for _, n := range []*testNode{a, b} {
		eventually(t, 10*time.Second, n.m.Name()+" drops the crashed member", func() bool { return n.sees(a, b) })
		eventually(t, 5*time.Second, n.m.Name()+" gets a failed leave", func() bool {
			ev, ok := lastEventOf(n.Events(), crashed)
			return ok && ev.Type == EventLeave
		})
		ev, _ := lastEventOf(n.Events(), crashed)
		if !ev.Failed {
			t.Errorf("%s: crash of %s delivered as a graceful leave: %+v", n.m.Name(), crashed, ev)
		}
		if counter(n.m.metrics.events.WithLabelValues("fail")) < 1 {
			t.Errorf("%s: fail events counter not incremented", n.m.Name())
		}
	}
}

func TestMembership_GracefulLeave(t *testing.T) {
	a := start(t, fastConfig("ipam-a"), true)
	b := start(t, fastConfig("ipam-b", a.m.LocalAddr()), true)
	c := start(t, fastConfig("ipam-c", a.m.LocalAddr()), true)
	for _, n := range []*testNode{a, b, c} {
		eventually(t, 10*time.Second, "3 members", func() bool { return n.sees(a, b, c) })
	}
	leaving := c.m.Name()
	began := time.Now()
	c.stop() // Leave, then Shutdown
	if took := time.Since(began); took > 3*time.Second {
		t.Errorf("Run took %v to return after cancel (leave timeout 2s)", took)
	}
	for _, n := range []*testNode{a, b} {
		// A leave is seen at once: well before a probe-based failure.
		eventually(t, 2*time.Second, n.m.Name()+" drops the leaving member", func() bool { return n.sees(a, b) })
		eventually(t, 2*time.Second, n.m.Name()+" gets the leave", func() bool {
			ev, ok := lastEventOf(n.Events(), leaving)
			return ok && ev.Type == EventLeave
		})
		var types []string
		for _, ev := range n.Events() {
			if ev.Member.Name == leaving {
				types = append(types, fmt.Sprintf("%s(leaving=%v,failed=%v)", ev.Type, ev.Member.Meta.Leaving, ev.Failed))
			}
		}
		want := "join(leaving=false,failed=false) update(leaving=true,failed=false) leave(leaving=true,failed=false)"
		if got := strings.Join(types, " "); got != want {
			t.Errorf("%s saw %s as\n  %s\nwant\n  %s", n.m.Name(), leaving, got, want)
		}
	}
}

// TestMembership_EventsInOrderWhileConsumerStalls: memberlist's callbacks
// never wait for the consumer, and the consumer gets every change, in order,
// numbered without gaps, once it reads.
func TestMembership_EventsInOrderWhileConsumerStalls(t *testing.T) {
	// Probes slower than fastConfig's: with a 50 ms probe timeout a loaded
	// machine declares live members dead and they rejoin, which is correct
	// memberlist behaviour but not what this test is about.
	cfg := func(name string, seeds ...string) Config {
		c := fastConfig(name, seeds...)
		c.ProbeInterval = 300 * time.Millisecond
		c.ProbeTimeout = 250 * time.Millisecond
		c.SuspicionMult = 3
		return c
	}
	a := start(t, cfg("ipam-a"), false) // nobody reads a's events yet
	b := start(t, cfg("ipam-b", a.m.LocalAddr()), true)
	c := start(t, cfg("ipam-c", a.m.LocalAddr()), true)
	d := start(t, cfg("ipam-d", a.m.LocalAddr()), true)
	e := start(t, cfg("ipam-e", a.m.LocalAddr()), true)
	eventually(t, 10*time.Second, "a sees 5 while its consumer stalls", func() bool { return a.sees(a, b, c, d, e) })
	names := map[string]string{a.m.Name(): "a", b.m.Name(): "b", c.m.Name(): "c", d.m.Name(): "d", e.m.Name(): "e"}
	c.stop()
	eventually(t, 10*time.Second, "a drops c while its consumer stalls", func() bool { return a.sees(a, b, d, e) })
	d.crash()
	eventually(t, 10*time.Second, "a drops d while its consumer stalls", func() bool { return a.sees(a, b, e) })
	// At least 7 changes: 5 joins, c's leave (after its "leaving" update
	// unless the leave overtook it), d's failure; the dispatcher holds one of
	// them, waiting for the consumer.
	if q := counter(a.m.metrics.queue); q < 6 {
		t.Fatalf("event queue length %v while the consumer stalls, want ≥ 6", q)
	}
	e.stop()
	eventually(t, 5*time.Second, "a drops e", func() bool { return a.sees(a, b) })

	a.consume()
	var evs []Event
	// a already dropped e, so e's leave is queued; whether a also saw e's
	// "leaving" update first depends on which gossip arrived first (a
	// loaded CI machine delivered the leave alone), so wait for the leave,
	// not for a count of events.
	drained := func() bool {
		evs = a.Events()
		last, ok := lastEventOf(evs, e.m.Name())
		return counter(a.m.metrics.queue) == 0 && ok && last.Type == EventLeave
	}
	deadline := time.Now().Add(10 * time.Second)
	for !drained() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !drained() {
		t.Fatalf("a's consumer did not drain the queue within 10s: queue %v, %d events %v",
			counter(a.m.metrics.queue), len(evs), evs)
	}
	if len(evs) < 8 { // 5 joins, c's leave, d's failure, e's leave at the least
		t.Fatalf("%d events after the drain, want ≥ 8: %v", len(evs), evs)
	}
	if evs[0].Type != EventJoin || evs[0].Member.Name != a.m.Name() {
		t.Errorf("first event %+v, want a's own join", evs[0])
	}
	// Seq counts without gaps; per member, the changes follow the member's
	// life: join, updates, leave. Names are unique, so nothing follows a
	// graceful leave; a member wrongly declared failed may refute and join
	// again, which memberlist allows.
	failed := map[string]bool{}
	state := map[string]EventType{}
	var trace []string
	for i, ev := range evs {
		trace = append(trace, fmt.Sprintf("%d:%s:%s", ev.Seq, names[ev.Member.Name], ev.Type))
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has Seq %d: %v", i, ev.Seq, trace)
		}
		prev, seen := state[ev.Member.Name]
		switch {
		case ev.Type == EventJoin && seen && (prev != EventLeave || !failed[ev.Member.Name]):
			t.Errorf("second join of %s: %v", names[ev.Member.Name], trace)
		case ev.Type != EventJoin && (!seen || prev == EventLeave):
			t.Errorf("%s of %s outside its membership: %v", ev.Type, names[ev.Member.Name], trace)
		}
		state[ev.Member.Name] = ev.Type
		failed[ev.Member.Name] = ev.Failed
	}
	for n, want := range map[*testNode]EventType{
		b: EventJoin,
		c: EventLeave,
		d: EventLeave,
		e: EventLeave,
	} {
		if state[n.m.Name()] != want {
			t.Errorf("last event of %s = %v, want %v: %v", names[n.m.Name()], state[n.m.Name()], want, trace)
		}
	}
	if ev, _ := lastEventOf(evs, d.m.Name()); !ev.Failed {
		t.Errorf("crash of d not marked failed: %v", trace)
	}
	// Whether c's leave is marked graceful is TestMembership_GracefulLeave's
	// business: on a loaded machine a leave broadcast can be lost, and c is
	// then declared failed by probes, which changes nothing here.
}

func TestMembership_WrongGossipKeyCannotJoin(t *testing.T) {
	dir := t.TempDir()
	key1 := writeKey(t, dir, "k1", strings.Repeat("a", 32))
	key2 := writeKey(t, dir, "k2", strings.Repeat("b", 32))

	cfgA := fastConfig("ipam-a")
	cfgA.GossipKeyFile = key1
	a := start(t, cfgA, true)
	cfgB := fastConfig("ipam-b", a.m.LocalAddr())
	cfgB.GossipKeyFile = key1
	b := start(t, cfgB, true)
	cfgC := fastConfig("ipam-c", a.m.LocalAddr())
	cfgC.GossipKeyFile = key2
	c := start(t, cfgC, true)
	d := start(t, fastConfig("ipam-d", a.m.LocalAddr()), true) // no key at all

	eventually(t, 10*time.Second, "b (same key) joins a", func() bool { return a.sees(a, b) && b.sees(a, b) })
	eventually(t, 10*time.Second, "c and d try and fail to join twice", func() bool {
		return counter(c.m.metrics.joinFailures) >= 2 && counter(d.m.metrics.joinFailures) >= 2
	})
	if !a.sees(a, b) || !c.sees(c) || !d.sees(d) {
		t.Fatalf("members: a=%v c=%v d=%v", a.memberNames(), c.memberNames(), d.memberNames())
	}
}

func TestNew_RefusesMalformedGossipKey(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
	}{
		{"not-base64", "this is not base64!!"},
		{"15-bytes", b64(strings.Repeat("x", 15))},
		{"33-bytes", b64(strings.Repeat("x", 33))},
		{"empty", "  \n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := fastConfig("ipam-a")
			cfg.GossipKeyFile = writeRaw(t, dir, tc.name, tc.content)
			_, err := New(cfg, time.Now(), nil, nil)
			if !errors.Is(err, ErrBadGossipKey) || !strings.Contains(err.Error(), cfg.GossipKeyFile) {
				t.Fatalf("New = %v, want an ErrBadGossipKey naming the file", err)
			}
		})
	}
	cfg := fastConfig("ipam-a")
	cfg.GossipKeyFile = dir + "/missing"
	if _, err := New(cfg, time.Now(), nil, nil); err == nil {
		t.Fatal("New accepted a missing key file")
	}
	for _, n := range []int{16, 24, 32} {
		cfg.GossipKeyFile = writeKey(t, dir, fmt.Sprint("ok", n), strings.Repeat("k", n))
		if _, err := New(cfg, time.Now(), nil, nil); err != nil {
			t.Errorf("%d-byte key refused: %v", n, err)
		}
	}
}

// TestMembership_ColdStartNoIslands: three replicas start one after the
// other, each seeded only with another's address that is not listening yet
// (a→b, b→c, c→a). Only re-joining makes one cluster: c joins a, and b
// stays alone until it retries c or a retries b.
func TestMembership_ColdStartNoIslands(t *testing.T) {
	ports := freeport.MustGet(t, 3)
	addr := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", ports[i%3]) }
	var nodes []*testNode
	for i, name := range []string{"ipam-a", "ipam-b", "ipam-c"} {
		cfg := fastConfig(name, addr(i+1))
		cfg.BindPort = ports[i]
		n := start(t, cfg, true)
		if i < 2 {
			eventually(t, 10*time.Second, name+"'s first join fails", func() bool { return counter(n.m.metrics.joinFailures) >= 1 })
		}
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		eventually(t, 10*time.Second, n.m.Name()+" sees all 3", func() bool { return n.sees(nodes...) })
	}
}

// TestMembership_GarbageMetaPeerIsIgnored: a gossip peer whose meta is not a
// replica meta never becomes a member, and the cluster keeps working.
func TestMembership_GarbageMetaPeerIsIgnored(t *testing.T) {
	a := start(t, fastConfig("ipam-a"), true)
	for i, meta := range [][]byte{[]byte("garbage\xff\x00"), {1, tagGRPCAddr, 200}, nil} {
		conf := memberlist.DefaultLANConfig()
		conf.Name = fmt.Sprintf("intruder-%d", i)
		conf.BindAddr, conf.BindPort, conf.AdvertisePort = "127.0.0.1", 0, 0
		conf.Label = "cce-ipam"
		conf.Delegate = rawMeta(meta)
		conf.LogOutput = discard{}
		ml, err := memberlist.Create(conf)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ml.Shutdown() })
		_, _ = ml.Join([]string{a.m.LocalAddr()})
	}
	eventually(t, 5*time.Second, "a rejects the intruders' meta", func() bool { return counter(a.m.metrics.metaRejected) >= 3 })
	b := start(t, fastConfig("ipam-b", a.m.LocalAddr()), true)
	eventually(t, 10*time.Second, "b joins a", func() bool { return a.sees(a, b) && b.sees(a, b) })
	for _, ev := range append(a.Events(), b.Events()...) {
		if strings.HasPrefix(ev.Member.Name, "intruder") {
			t.Errorf("event about an intruder: %+v", ev)
		}
	}
}

func TestMembership_RunTwice(t *testing.T) {
	a := start(t, fastConfig("ipam-a"), true)
	if err := a.m.Run(context.Background()); !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("second Run = %v", err)
	}
}

func TestMembership_BindConflictFailsRun(t *testing.T) {
	a := start(t, fastConfig("ipam-a"), true)
	cfg := fastConfig("ipam-b")
	cfg.BindPort = portOf(t, a)
	m, err := New(cfg, time.Now(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Run(context.Background()); err == nil {
		t.Fatal("Run on a taken port succeeded")
	}
	if _, ok := <-m.Events(); ok {
		t.Fatal("events channel not closed after a failed Run")
	}
}

func lastEventOf(evs []Event, name string) (Event, bool) {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Member.Name == name {
			return evs[i], true
		}
	}
	return Event{}, false
}

func gauge(t *testing.T, n *testNode, name string) float64 {
	t.Helper()
	mfs, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

type rawMeta []byte

func (r rawMeta) NodeMeta(int) []byte                 { return r }
func (r rawMeta) NotifyMsg([]byte)                    {}
func (r rawMeta) GetBroadcasts(int, int) [][]byte     { return nil }
func (r rawMeta) LocalState(bool) []byte              { return nil }
func (r rawMeta) MergeRemoteState(buf []byte, _ bool) {}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
