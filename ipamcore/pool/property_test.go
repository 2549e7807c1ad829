package pool

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
)

var poolSeed = flag.Uint64("pool.seed", 0, "seed for TestPlans_Property (0: time-based)")

// TestPlans_Property checks, for many random nodes, the rules every plan
// must keep whatever the numbers: adds plus short equal need; no add
// exceeds the call limit, the ENI's room or its backoff batch; skipped or
// backing-off ENIs get nothing; growth never overshoots MaxIdle; trimming
// never returns cooling or young addresses and never goes below MaxIdle.
func TestPlans_Property(t *testing.T) {
	seed := *poolSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -pool.seed=%d)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 7))
	now := t0.Add(time.Hour)
	for iter := range 5000 {
		minIdle := 1 + r.IntN(8)
		cfg := Config{MinIdle: minIdle, MaxIdle: minIdle + r.IntN(10), Batch: 1 + r.IntN(MaxIPsPerCall),
			TrimBatch: 1 + r.IntN(12), MinLifetime: 5 * time.Second, Backoff: DefaultBackoffPolicy()}
		capc := Capacity{MaxIPsPerENI: 2 + r.IntN(40), MaxENIs: 1 + r.IntN(8), WarmIPTarget: r.IntN(20), PreAttachedENIs: r.IntN(3)}
		st := NodeState{Waiting: r.IntN(6), ENIPending: r.IntN(5) == 0}
		backoff := map[string]Backoff{}
		for e := range r.IntN(capc.MaxENIs + 2) {
			id := fmt.Sprintf("eni-%d", e)
			c := 0
			if r.IntN(3) == 0 {
				c = 2 + r.IntN(40)
			}
			limit := c
			if limit == 0 {
				limit = capc.MaxIPsPerENI
			}
			total := r.IntN(limit + 2) // sometimes over capacity: stale annotation
			idle := r.IntN(total + 1)
			es := ENIState{ID: id, Total: total, Idle: idle, Assigned: r.IntN(total - idle + 1), Capacity: c,
				SubnetExhausted: r.IntN(6) == 0}
			st.ENIs = append(st.ENIs, es)
			for i := range idle {
				ready := now.Add(time.Duration(r.IntN(20)-10) * time.Second)
				added := now.Add(-time.Duration(r.IntN(30)) * time.Second)
				st.IdleIPs = append(st.IdleIPs, IdleIP{Addr: netip.AddrFrom4([4]byte{10, byte(e), byte(i), 1}),
					ENIID: id, AddedAt: added, IdleSince: ready.Add(-5 * time.Second), ReadyAt: ready})
			}
			if r.IntN(4) == 0 {
				backoff[id] = Backoff{Failures: 1, Until: now.Add(time.Duration(r.IntN(10)-5) * time.Second), MaxBatch: 1 + r.IntN(4)}
			}
		}
		fail := func(format string, args ...any) {
			t.Fatalf("iter %d: %s\ncfg %+v cap %+v\nstate %+v\nbackoff %+v", iter, fmt.Sprintf(format, args...), cfg, capc, st, backoff)
		}

		p := PlanGrow(cfg, capc, st, backoff, now)
		idle := st.Idle()
		if want := cfg.MinIdle + st.Waiting - idle; (want > 0) != (p.Need > 0) || p.Need < max(want, 0) {
			fail("need %d for deficit %d", p.Need, want)
		}
		if p.Need > 0 && idle+p.Need > cfg.MaxIdle+st.Waiting {
			fail("growth overshoots max: idle %d + %d", idle, p.Need)
		}
		sum, seen := 0, map[string]bool{}
		for _, a := range p.Adds {
			var e ENIState
			for _, x := range st.ENIs {
				if x.ID == a.ENIID {
					e = x
				}
			}
			b := backoff[a.ENIID]
			switch {
			case seen[a.ENIID]:
				fail("eni %s planned twice", a.ENIID)
			case a.Count < 1 || a.Count > MaxIPsPerCall:
				fail("add %+v out of 1..%d", a, MaxIPsPerCall)
			case a.Count > eniRoom(e, capc):
				fail("add %+v exceeds room %d", a, eniRoom(e, capc))
			case e.SubnetExhausted || b.Active(now):
				fail("add %+v on exhausted or backing-off eni", a)
			case b.MaxBatch > 0 && a.Count > b.MaxBatch:
				fail("add %+v over backoff batch %d", a, b.MaxBatch)
			}
			seen[a.ENIID] = true
			sum += a.Count
		}
		if sum+p.Short != p.Need || p.Short < 0 {
			fail("adds %d + short %d != need %d", sum, p.Short, p.Need)
		}
		if p.NewENI && (st.ENIPending || len(st.ENIs) >= capc.MaxENIs) {
			fail("new eni while pending or at max: %s", p.ENIReason)
		}
		if !p.NewENI && !st.ENIPending && len(st.ENIs) < capc.PreAttachedENIs && len(st.ENIs) < capc.MaxENIs {
			fail("no new eni below pre-attached count")
		}

		trim := PlanTrim(cfg, st, now)
		if len(trim) > cfg.TrimBatch || len(st.IdleIPs)-len(trim) < min(len(st.IdleIPs), cfg.MaxIdle+st.Waiting) {
			fail("trimmed %d of %d", len(trim), len(st.IdleIPs))
		}
		if len(trim) > 0 && p.Need > 0 {
			fail("grow and trim at once")
		}
		for i, ip := range trim {
			if ip.ReadyAt.After(now) || now.Sub(ip.AddedAt) < cfg.MinLifetime {
				fail("trimmed cooling or young %+v", ip)
			}
			if i > 0 && ip.IdleSince.Before(trim[i-1].IdleSince) {
				fail("trim not oldest first")
			}
		}
		// Everything trimmable that was left behind is newer than what was taken.
		if len(trim) > 0 {
			last := trim[len(trim)-1]
			taken := map[netip.Addr]bool{}
			for _, ip := range trim {
				taken[ip.Addr] = true
			}
			for _, ip := range st.IdleIPs {
				if !taken[ip.Addr] && !ip.ReadyAt.After(now) && now.Sub(ip.AddedAt) >= cfg.MinLifetime &&
					ip.IdleSince.Before(last.IdleSince) {
					fail("left %s idle since %s, took newer %s", ip.Addr, ip.IdleSince, last.Addr)
				}
			}
		}
	}
}
