package datastore

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// source feeds the harness its choices: a seeded PRNG for the property
// test, the fuzzer's bytes for the fuzz target.
type source interface {
	intn(n int) int
	done() bool
}

type randSource struct{ r *rand.Rand }

func (s randSource) intn(n int) int { return s.r.IntN(n) }
func (s randSource) done() bool     { return false }

type byteSource struct {
	b []byte
	i int
}

func (s *byteSource) intn(n int) int {
	if s.i >= len(s.b) {
		return 0
	}
	v := int(s.b[s.i])
	s.i++
	return v % n
}

func (s *byteSource) done() bool { return s.i >= len(s.b) }

// The universe the harness draws from is small on purpose, so that
// collisions (same IP on two nodes, same pod twice, primaries) are common.
var (
	hNodes = []string{"n0", "n1", "n2"}
	hENIs  = func() []ENI {
		out := make([]ENI, 6)
		for i := range out {
			k := i % 3
			out[i] = ENI{
				ID: fmt.Sprintf("eni-%d", i), SubnetID: fmt.Sprintf("sbn-%d", k),
				SubnetCIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(k), 0}), 24),
				MAC:        fmt.Sprintf("fa:16:3e:00:00:%02x", i),
				PrimaryIP:  netip.AddrFrom4([4]byte{10, 0, byte(k), byte(1 + i/3)}),
				Capacity:   10,
			}
		}
		return out
	}()
)

type harness struct {
	t      testing.TB
	s      *Store
	m      *model
	src    source
	now    time.Time
	counts map[string]int
}

// newHarness picks the cooldown from the source too: none, the default,
// or a long one, so cooling is exercised at different rates.
func newHarness(t testing.TB, src source) *harness {
	cfg := []Config{DefaultConfig(), {}, {Cooldown: 20 * time.Second}}[src.intn(3)]
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, s: s, m: newModel(s.Cooldown()), src: src, now: t0, counts: map[string]int{}}
	return h
}

func (h *harness) pick(n int) int { return h.src.intn(n) }
func (h *harness) node() string   { return hNodes[h.pick(len(hNodes))] }
func (h *harness) eni() ENI       { return hENIs[h.pick(len(hENIs))] }
func (h *harness) addr() netip.Addr {
	return netip.AddrFrom4([4]byte{10, 0, byte(h.pick(4)), byte(1 + h.pick(16))})
}
func (h *harness) owner() Owner {
	return Owner{Namespace: "ns", Name: fmt.Sprintf("p%d", h.pick(10)), ContainerID: fmt.Sprintf("c%d", h.pick(3))}
}

// addrInState prefers an address of the node in the given state.
func (h *harness) addrInState(node string, st IPState) netip.Addr {
	var have []netip.Addr
	for a, r := range h.m.ips {
		if r.node == node && r.state == st {
			have = append(have, a)
		}
	}
	if len(have) == 0 || h.pick(3) == 0 {
		return h.knownAddr(node)
	}
	slices.SortFunc(have, netip.Addr.Compare)
	return have[h.pick(len(have))]
}

// eniOn prefers an ENI the model has on the node.
func (h *harness) eniOn(node string) ENI {
	var have []ENI
	for _, e := range hENIs {
		if cur, ok := h.m.enis[e.ID]; ok && cur.node == node {
			have = append(have, e)
		}
	}
	if len(have) == 0 || h.pick(6) == 0 {
		return h.eni()
	}
	return have[h.pick(len(have))]
}

// addrIn prefers an address inside the ENI's subnet.
func (h *harness) addrIn(e ENI) netip.Addr {
	if h.pick(6) == 0 {
		return h.addr()
	}
	return netip.AddrFrom4([4]byte{10, 0, e.SubnetCIDR.Addr().As4()[2], byte(1 + h.pick(16))})
}

// knownAddr prefers an address the model has on the node, so operations
// hit real records most of the time.
func (h *harness) knownAddr(node string) netip.Addr {
	var have []netip.Addr
	for a, r := range h.m.ips {
		if r.node == node {
			have = append(have, a)
		}
	}
	if len(have) == 0 || h.pick(5) == 0 {
		return h.addr()
	}
	slices.SortFunc(have, netip.Addr.Compare)
	return have[h.pick(len(have))]
}

func (h *harness) fail(op string, format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf("step %d %s: %s", h.total(), op, fmt.Sprintf(format, args...))
}

func (h *harness) total() int {
	n := 0
	for k, c := range h.counts {
		if !strings.HasSuffix(k, " ok") {
			n += c
		}
	}
	return n
}

func (h *harness) same(op string, got, want error) {
	h.t.Helper()
	if (got == nil) != (want == nil) || (want != nil && !errors.Is(got, want)) {
		h.fail(op, "error = %v, model wants %v", got, want)
	}
	if got == nil {
		h.counts[op+" ok"]++
	}
}

// step runs one random operation on both the store and the model and
// compares results and the full state afterwards.
func (h *harness) step() {
	h.t.Helper()
	h.now = h.now.Add(time.Duration(h.pick(1500)) * time.Millisecond)
	n := h.node()
	var op string
	switch h.pick(16) {
	case 0:
		op = "AddNode"
		h.same(op, h.s.AddNode(n), h.m.addNode(n))
	case 1:
		op = "RemoveNode"
		if h.pick(6) != 0 { // rarer than the rest
			op = "Stats"
			h.stats(n)
			break
		}
		_, err := h.s.RemoveNode(n)
		h.same(op, err, h.m.removeNode(n))
	case 2:
		op = "AddENI"
		e := h.eni()
		h.same(op, h.s.AddENI(n, e), h.m.addENI(n, e))
	case 3:
		op = "RemoveENI"
		if h.pick(3) != 0 {
			op = "Stats"
			h.stats(n)
			break
		}
		id := h.eniOn(n).ID
		_, err := h.s.RemoveENI(n, id)
		h.same(op, err, h.m.removeENI(n, id))
	case 4, 5:
		op = "AddIPs"
		e := h.eniOn(n)
		id := e.ID
		addrs := make([]netip.Addr, 1+h.pick(3))
		for i := range addrs {
			addrs[i] = h.addrIn(e)
		}
		h.same(op, h.s.AddIPs(n, id, addrs, h.now), h.m.addIPs(n, id, addrs, h.now))
	case 6:
		op = "AddAssignedIP"
		e := h.eniOn(n)
		id, a, o := e.ID, h.addr(), h.owner()
		_, err := h.s.AddAssignedIP(n, id, a, o, h.now)
		h.same(op, err, h.m.addAssigned(n, id, a, o, h.now))
	case 7:
		op = "RemoveIP"
		a := h.knownAddr(n)
		_, err := h.s.RemoveIP(n, a)
		h.same(op, err, h.m.removeIP(n, a))
	case 8, 9, 10:
		op = "Allocate"
		req := Request{Owner: h.owner()}
		if h.pick(4) == 0 {
			req.SubnetID = fmt.Sprintf("sbn-%d", h.pick(3))
		}
		got, err := h.s.Allocate(n, req, h.now)
		want, readyAt, cooling, werr := h.m.allocate(n, req, h.now)
		h.same(op, err, werr)
		var ce *CoolingError
		if errors.As(err, &ce) && (!ce.ReadyAt.Equal(readyAt) || ce.Cooling != cooling) {
			h.fail(op, "cooling error %v, model wants ready %s count %d", err, readyAt, cooling)
		}
		if err == nil && (got.Addr != want || got.Owner != req.Owner) {
			h.fail(op, "got %s for %s, model wants %s", got.Addr, got.Owner, want)
		}
	case 11:
		op = "AllocateSpecific"
		a, o := h.addrInState(n, StateIdle), h.owner()
		_, err := h.s.AllocateSpecific(n, a, o)
		h.same(op, err, h.m.allocateSpecific(n, a, o))
	case 12, 13:
		op = "Release"
		a := h.addrInState(n, StateAssigned)
		cid := fmt.Sprintf("c%d", h.pick(3))
		if r, ok := h.m.ips[a]; ok && r.state == StateAssigned && h.pick(3) != 0 {
			cid = r.owner.ContainerID // mostly the right sandbox
		}
		rel, err := h.s.Release(n, a, cid, h.now)
		removed, werr := h.m.release(n, a, cid, h.now)
		h.same(op, err, werr)
		if err == nil && rel.Removed != removed {
			h.fail(op, "removed = %v, model wants %v", rel.Removed, removed)
		}
	case 14:
		op = "Hold/Unhold"
		if h.pick(2) == 0 {
			addrs := []netip.Addr{h.knownAddr(n), h.knownAddr(n)}
			why := HoldReason(1 + h.pick(2))
			got, err := h.s.Hold(n, addrs, why)
			want, werr := h.m.hold(n, addrs, why)
			h.same(op, err, werr)
			if !slices.Equal(got, want) {
				h.fail(op, "held %v, model wants %v", got, want)
			}
		} else {
			a := h.knownAddr(n)
			var o *Owner
			if h.pick(2) == 0 {
				x := h.owner()
				o = &x
			}
			_, err := h.s.Unhold(n, a, o, h.now)
			h.same(op, err, h.m.unhold(n, a, o, h.now))
		}
	case 15:
		op = "Restore"
		h.restore(n)
	}
	h.counts[op]++
	h.verify(op)
}

// restore rebuilds a node from the model's view of it, perturbed: ENIs
// dropped or borrowed from other nodes, addresses lost, duplicated or
// invented, claims dropped, doubled or pointing nowhere.
func (h *harness) restore(n string) {
	in := RestoreInput{}
	used := map[string]bool{}
	for _, e := range hENIs {
		cur, ok := h.m.enis[e.ID]
		if (!ok || cur.node != n || h.pick(8) == 0) && h.pick(6) != 0 {
			continue
		}
		used[e.ID] = true
		re := RestoreENI{ENI: e}
		for a, r := range h.m.ips {
			if r.eni == e.ID && h.pick(8) != 0 {
				re.IPs = append(re.IPs, a)
			}
		}
		slices.SortFunc(re.IPs, netip.Addr.Compare)
		for range h.pick(3) {
			re.IPs = append(re.IPs, h.addr())
		}
		in.ENIs = append(in.ENIs, re)
	}
	// Primaries must be unique in a valid cloud snapshot.
	in.ENIs = slices.DeleteFunc(in.ENIs, func(re RestoreENI) bool {
		return slices.ContainsFunc(in.ENIs, func(o RestoreENI) bool {
			return o.ENI.ID < re.ENI.ID && o.ENI.PrimaryIP == re.ENI.PrimaryIP
		})
	})
	var addrs []netip.Addr
	for a, r := range h.m.ips {
		if r.node == n {
			addrs = append(addrs, a)
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	for _, a := range addrs {
		r := h.m.ips[a]
		if r.state == StateAssigned && h.pick(6) != 0 {
			in.Claims = append(in.Claims, Claim{Addr: a, Owner: r.owner})
		}
	}
	for range h.pick(3) {
		in.Claims = append(in.Claims, Claim{Addr: h.knownAddr(n), Owner: h.owner()})
	}
	rep, err := h.s.Restore(n, in, h.now)
	want := h.m.restore(n, in, h.now)
	if err != nil {
		h.fail("Restore", "unexpected error %v", err)
	}
	got := make([]string, len(rep.Conflicts))
	for i, c := range rep.Conflicts {
		got[i] = fmt.Sprintf("%s %s", c.Kind, c.Addr)
	}
	if !slices.Equal(got, want) {
		h.fail("Restore", "conflicts %q, model wants %q", got, want)
	}
}

func (h *harness) stats(n string) {
	st, err := h.s.Stats(n, h.now)
	if _, ok := h.m.nodes[n]; !ok {
		h.same("Stats", err, ErrNodeNotFound)
		return
	}
	var want NodeStats
	for _, r := range h.m.ips {
		if r.node != n {
			continue
		}
		want.Total++
		switch r.state {
		case StateIdle:
			want.Idle++
			if r.readyAt.After(h.now) {
				want.Cooling++
			}
		case StateAssigned:
			want.Assigned++
		case StateHeld:
			want.Held++
		}
	}
	if err != nil || st.Total != want.Total || st.Idle != want.Idle || st.Cooling != want.Cooling ||
		st.Assigned != want.Assigned || st.Held != want.Held {
		h.fail("Stats", "got %+v (%v), model wants %+v", st, err, want)
	}
}

// verify checks the store's own invariants, then that every node looks
// exactly like the model, then the lookups.
func (h *harness) verify(op string) {
	h.t.Helper()
	if err := h.s.Verify(); err != nil {
		h.fail(op, "invariants: %v", err)
	}
	nodes := make([]string, 0, len(h.m.nodes))
	for n := range h.m.nodes {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	if got := h.s.Nodes(); !slices.Equal(got, nodes) {
		h.fail(op, "nodes %v, model %v", got, nodes)
	}
	for _, n := range nodes {
		got, err := h.s.Snapshot(n)
		if err != nil {
			h.fail(op, "snapshot %s: %v", n, err)
		}
		if want := h.m.snapshot(n); !sameSnapshot(got, want) {
			h.fail(op, "node %s differs from model:\n got %s\nwant %s", n, sprint(got), sprint(want))
		}
	}
	for a, r := range h.m.ips {
		info, err := h.s.LookupIP(a)
		if err != nil || info.Node != r.node || info.State != r.state {
			h.fail(op, "LookupIP %s = %+v, %v", a, info, err)
		}
		if r.state == StateAssigned {
			p, err := h.s.LookupPod(r.node, r.owner.Pod())
			if err != nil || p.Addr != a {
				h.fail(op, "LookupPod %s = %+v, %v", r.owner.Pod(), p, err)
			}
		}
	}
	// No pod holds two addresses on a node, no address has two owners:
	// implied by the model comparison plus the pod index invariant, and
	// checked here directly as well.
	pods := map[string]netip.Addr{}
	for a, r := range h.m.ips {
		if r.state != StateAssigned {
			continue
		}
		k := r.node + "/" + r.owner.Pod().String()
		if prev, ok := pods[k]; ok {
			h.fail(op, "pod %s holds %s and %s", k, prev, a)
		}
		pods[k] = a
	}
}

// sameSnapshot compares field by field (cheaper than formatting, which
// matters for fuzzing throughput).
func sameSnapshot(a, b NodeSnapshot) bool {
	return a.Node == b.Node && slices.EqualFunc(a.ENIs, b.ENIs, func(x, y ENISnapshot) bool {
		return x.ENI == y.ENI && slices.EqualFunc(x.IPs, y.IPs, func(p, q IPInfo) bool {
			return p.Node == q.Node && p.ENIID == q.ENIID && p.SubnetID == q.SubnetID && p.MAC == q.MAC &&
				p.Addr == q.Addr && p.State == q.State && p.Owner == q.Owner && p.HoldReason == q.HoldReason &&
				p.CrossSubnet == q.CrossSubnet && p.AddedAt.Equal(q.AddedAt) &&
				p.IdleSince.Equal(q.IdleSince) && p.ReadyAt.Equal(q.ReadyAt)
		})
	})
}
