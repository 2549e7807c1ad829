package pool

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cce-ipam/sharded/ipamcore/datastore"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func TestCapacityFromAnnotations(t *testing.T) {
	def := Capacity{MaxIPsPerENI: 16, MaxENIs: 8, WarmIPTarget: 8, PreAttachedENIs: 1}
	aheadDef := def
	aheadDef.AheadOfDemand = true
	for _, tc := range []struct {
		name    string
		ann     map[string]string
		want    Capacity
		wantErr string // substring; "" for none
	}{
		{"none", nil, def, ""},
		{"all", map[string]string{
			AnnotationMaxIPPerENI:       "30",
			AnnotationMaxENINum:         "4",
			AnnotationWarmIPTarget:      "5",
			AnnotationPreAttachedENINum: "2",
		},
			Capacity{MaxIPsPerENI: 30, MaxENIs: 4, WarmIPTarget: 5, PreAttachedENIs: 2, AheadOfDemand: true}, ""},
		{"warm defaults to half of max-ip-per-eni", map[string]string{AnnotationMaxIPPerENI: "40"},
			Capacity{MaxIPsPerENI: 40, MaxENIs: 8, WarmIPTarget: 20, PreAttachedENIs: 1}, ""},
		{"malformed falls back and reports", map[string]string{AnnotationMaxIPPerENI: "lots", AnnotationMaxENINum: "0"},
			def, "cce.io/max-eni-num"},
		{"max-ip-per-eni 1 is useless", map[string]string{AnnotationMaxIPPerENI: "1"}, def, "cce.io/max-ip-per-eni"},
		{"negative warm", map[string]string{AnnotationWarmIPTarget: "-1"}, aheadDef, "cce.io/warm-ip-target"},
		{"warm target alone asks for ENIs ahead", map[string]string{AnnotationWarmIPTarget: "3"},
			Capacity{MaxIPsPerENI: 16, MaxENIs: 8, WarmIPTarget: 3, PreAttachedENIs: 1, AheadOfDemand: true}, ""},
		{"pre-attached zero is fine", map[string]string{AnnotationPreAttachedENINum: "0"},
			Capacity{MaxIPsPerENI: 16, MaxENIs: 8, WarmIPTarget: 8, PreAttachedENIs: 0, AheadOfDemand: true}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CapacityFromAnnotations(tc.ann, def)
			if got != tc.want {
				t.Fatalf("capacity = %+v, want %+v", got, tc.want)
			}
			if (err != nil) != (tc.wantErr != "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error = %v, want one mentioning %q", err, tc.wantErr)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("returned capacity invalid: %v", err)
			}
		})
	}
}

func TestConfig_Validate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"min 0":          func(c *Config) { c.MinIdle = 0 },
		"max below min":  func(c *Config) { c.MinIdle, c.MaxIdle = 5, 4 },
		"batch 0":        func(c *Config) { c.Batch = 0 },
		"batch over 10":  func(c *Config) { c.Batch = 11 },
		"trim batch 0":   func(c *Config) { c.TrimBatch = 0 },
		"neg lifetime":   func(c *Config) { c.MinLifetime = -1 },
		"backoff zero":   func(c *Config) { c.Backoff = BackoffPolicy{} },
		"backoff max<in": func(c *Config) { c.Backoff = BackoffPolicy{Initial: time.Minute, Max: time.Second} },
	} {
		c := DefaultConfig()
		mut(&c)
		if c.Validate() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestBackoffPolicy_Fail(t *testing.T) {
	p := DefaultBackoffPolicy()
	var b Backoff
	if b.Active(t0) {
		t.Fatal("zero backoff is active")
	}
	wantDelays := []time.Duration{2, 4, 8, 16, 32, 60, 60}
	batches := []int{4, 2, 1, 1, 10, 3, 0}
	wantMax := []int{2, 1, 1, 1, 5, 1, 1}
	now := t0
	for i, d := range wantDelays {
		b = p.Fail(b, batches[i], now)
		if b.Failures != i+1 || !b.Until.Equal(now.Add(d*time.Second)) || b.MaxBatch != wantMax[i] {
			t.Fatalf("failure %d: %+v, want delay %ds max batch %d", i+1, b, d, wantMax[i])
		}
		if !b.Active(b.Until.Add(-time.Nanosecond)) || b.Active(b.Until) {
			t.Fatalf("failure %d: active window wrong", i+1)
		}
		now = b.Until
	}
	// Huge failure counts and caps must not overflow.
	b = p.Fail(Backoff{Failures: 1000}, 1, t0)
	if !b.Until.Equal(t0.Add(p.Max)) {
		t.Fatalf("overflow: %+v", b)
	}
	huge := BackoffPolicy{Initial: 3 * time.Second, Max: time.Duration(1<<63 - 1)}
	b = huge.Fail(Backoff{Failures: 200}, 1, t0)
	if !b.Until.After(t0.Add(time.Hour)) {
		t.Fatalf("overflow with huge max: %+v", b)
	}
}

func enis(list ...ENIState) []ENIState { return list }

func TestPlanGrow(t *testing.T) {
	cfg := DefaultConfig() // min 1, max 6, batch 4
	capc := Capacity{MaxIPsPerENI: 8, MaxENIs: 3, WarmIPTarget: 4, PreAttachedENIs: 1}
	future := t0.Add(time.Minute)
	for _, tc := range []struct {
		name      string
		cfg       *Config
		st        NodeState
		backoff   map[string]Backoff
		need      int
		adds      string // "eni:count ..."
		short     int
		skips     string
		newENI    bool
		eniReason string
		// waitingShort: waiting allocations beyond every growable ENI's
		// room and the idle addresses.
		waitingShort int
		// beyondRoom: of need, what no attached ENI can take even once full.
		beyondRoom int
	}{
		{
			name: "warm enough: nothing",
			st:   NodeState{ENIs: enis(ENIState{ID: "a", Total: 3, Idle: 2, Assigned: 1})},
			need: 0, newENI: false, eniReason: "enough room",
		},
		{
			name: "empty pool: one batch on the emptiest eni",
			st:   NodeState{ENIs: enis(ENIState{ID: "a", Total: 5, Assigned: 5}, ENIState{ID: "b", Total: 2, Assigned: 2})},
			need: 4, adds: "b:4", newENI: false, eniReason: "enough room",
		},
		{
			name: "waiting allocations add demand, capped by max idle",
			st:   NodeState{Waiting: 5, ENIs: enis(ENIState{ID: "a", Total: 1, Assigned: 1}, ENIState{ID: "b", Total: 1, Assigned: 1})},
			need: 6, adds: "a:6", eniReason: "enough room",
		},
		{
			name: "spills to the next eni when the first fills",
			st:   NodeState{Waiting: 5, ENIs: enis(ENIState{ID: "a", Total: 4, Assigned: 4}, ENIState{ID: "b", Total: 5, Assigned: 5})},
			need: 6, adds: "a:3 b:2", short: 1, newENI: true, eniReason: "cannot take", beyondRoom: 1,
		},
		{
			name: "never more than 10 per call",
			cfg:  &Config{MinIdle: 15, MaxIdle: 30, Batch: 10, TrimBatch: 10, Backoff: DefaultBackoffPolicy()},
			st:   NodeState{ENIs: enis(ENIState{ID: "a", Capacity: 40}, ENIState{ID: "b", Capacity: 40})},
			need: 15, adds: "a:10 b:5", eniReason: "enough room",
		},
		{
			name: "waiting beyond all the enis' room: they wait for a new eni",
			st:   NodeState{Waiting: 9, ENIs: enis(ENIState{ID: "a", Total: 4, Assigned: 4}, ENIState{ID: "b", Total: 5, Assigned: 5})},
			need: 10, adds: "a:3 b:2", short: 5, newENI: true, eniReason: "cannot take", waitingShort: 4,
			beyondRoom: 5,
		},
		{
			name: "idle addresses serve waiting allocations first",
			st:   NodeState{Waiting: 3, ENIs: enis(ENIState{ID: "a", Total: 7, Idle: 2, Assigned: 5})},
			need: 4, short: 4, skips: "a:eni-full", newENI: true, eniReason: "warm ip target", waitingShort: 1,
			beyondRoom: 4,
		},
		{
			name:    "an eni in backoff lends no room to waiting allocations",
			st:      NodeState{Waiting: 3, ENIs: enis(ENIState{ID: "b", Total: 1, Assigned: 1})},
			backoff: map[string]Backoff{"b": {Failures: 1, Until: future, MaxBatch: 2}},
			need:    4, short: 4, skips: "b:backoff", newENI: true, eniReason: "warm ip target", waitingShort: 3,
			beyondRoom: 4,
		},
		{
			name: "exhausted subnet and backoff are skipped",
			st: NodeState{ENIs: enis(ENIState{ID: "a", SubnetExhausted: true}, ENIState{ID: "b", Total: 1, Assigned: 1},
				ENIState{ID: "c", Total: 2, Assigned: 2})},
			backoff: map[string]Backoff{"b": {Failures: 1, Until: future, MaxBatch: 2}},
			need:    4, adds: "c:4", skips: "a:subnet-exhausted b:backoff", eniReason: "maximum",
		},
		{
			name:    "expired backoff: half batch",
			st:      NodeState{ENIs: enis(ENIState{ID: "b", Total: 1, Assigned: 1})},
			backoff: map[string]Backoff{"b": {Failures: 1, Until: t0, MaxBatch: 2}},
			need:    4, adds: "b:2", short: 2, newENI: true, eniReason: "cannot take",
		},
		{
			name: "all enis full: need a new eni",
			st:   NodeState{ENIs: enis(ENIState{ID: "a", Total: 7, Assigned: 7}, ENIState{ID: "b", Total: 7, Assigned: 7})},
			need: 4, short: 4, skips: "a:eni-full b:eni-full", newENI: true, eniReason: "warm ip target", beyondRoom: 4,
		},
		{
			name: "full but at max enis",
			st: NodeState{ENIs: enis(ENIState{ID: "a", Total: 7, Assigned: 7}, ENIState{ID: "b", Total: 7, Assigned: 7},
				ENIState{ID: "c", Total: 7, Assigned: 7})},
			need: 4, short: 4, skips: "a:eni-full b:eni-full c:eni-full", newENI: false, eniReason: "maximum",
			beyondRoom: 4,
		},
		{
			name: "eni creation already in flight",
			st:   NodeState{ENIPending: true, ENIs: enis(ENIState{ID: "a", Total: 7, Assigned: 7})},
			need: 4, short: 4, skips: "a:eni-full", newENI: false, eniReason: "already being created", beyondRoom: 4,
		},
		{
			name: "no eni at all: pre-attach",
			st:   NodeState{},
			need: 4, short: 4, newENI: true, eniReason: "pre-attached", beyondRoom: 4,
		},
		{
			name: "per-eni capacity overrides the node's",
			st:   NodeState{ENIs: enis(ENIState{ID: "a", Total: 1, Assigned: 1, Capacity: 3})},
			need: 4, adds: "a:1", short: 3, newENI: true, eniReason: "warm ip target", beyondRoom: 3,
		},
		{
			name: "spare below warm target though pool is warm",
			st:   NodeState{ENIs: enis(ENIState{ID: "a", Total: 6, Idle: 2, Assigned: 4})},
			need: 0, newENI: true, eniReason: "warm ip target",
		},
		{
			name: "exhausted subnet counts only idle as spare",
			st:   NodeState{ENIs: enis(ENIState{ID: "a", Total: 1, Idle: 1, SubnetExhausted: true})},
			need: 0, skips: "", newENI: true, eniReason: "warm ip target",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			if tc.cfg != nil {
				c = *tc.cfg
			}
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			p := PlanGrow(c, capc, tc.st, tc.backoff, t0)
			var adds, skips []string
			total := 0
			for _, a := range p.Adds {
				adds = append(adds, fmt.Sprintf("%s:%d", a.ENIID, a.Count))
				total += a.Count
				if a.Count < 1 || a.Count > MaxIPsPerCall {
					t.Fatalf("bad add %+v", a)
				}
			}
			for _, s := range p.Skips {
				skips = append(skips, fmt.Sprintf("%s:%s", s.ENIID, s.Reason))
			}
			if p.BeyondRoom != tc.beyondRoom {
				t.Fatalf("beyond the room: %d, want %d (plan %+v)", p.BeyondRoom, tc.beyondRoom, p)
			}
			if p.Need != tc.need || strings.Join(adds, " ") != tc.adds || p.Short != tc.short || p.WaitingShort != tc.waitingShort ||
				strings.Join(skips, " ") != tc.skips || p.NewENI != tc.newENI || !strings.Contains(p.ENIReason, tc.eniReason) {
				t.Fatalf("plan = %+v\nwant need=%d adds=%q short=%d waitingShort=%d skips=%q newENI=%v reason~%q",
					p, tc.need, tc.adds, tc.short, tc.waitingShort, tc.skips, tc.newENI, tc.eniReason)
			}
			if total+p.Short != p.Need {
				t.Fatalf("adds %d + short %d != need %d", total, p.Short, p.Need)
			}
		})
	}
}

func idleIP(addr string, added, idleSince, ready time.Duration) IdleIP {
	return IdleIP{Addr: netip.MustParseAddr(addr), ENIID: "a",
		AddedAt: t0.Add(added), IdleSince: t0.Add(idleSince), ReadyAt: t0.Add(ready)}
}

func TestPlanTrim(t *testing.T) {
	now := t0.Add(time.Hour)
	old := -time.Hour // relative to t0: long ago
	var many []IdleIP
	for i := range 12 {
		many = append(many, idleIP(fmt.Sprintf("10.0.0.%d", 10+i), old, time.Duration(i)*time.Minute, time.Duration(i)*time.Minute))
	}
	for _, tc := range []struct {
		name string
		cfg  func(*Config)
		st   NodeState
		want []string
	}{
		{name: "at max: nothing", st: NodeState{IdleIPs: many[:6]}},
		{name: "over max: idle longest first", st: NodeState{IdleIPs: many[:8]}, want: []string{"10.0.0.10", "10.0.0.11"}},
		{name: "input order does not matter",
			st:   NodeState{IdleIPs: []IdleIP{many[7], many[3], many[0], many[5], many[1], many[2], many[4], many[6]}},
			want: []string{"10.0.0.10", "10.0.0.11"}},
		{name: "waiting allocations keep addresses", st: NodeState{IdleIPs: many[:8], Waiting: 1}, want: []string{"10.0.0.10"}},
		{name: "trim batch caps a large excess", cfg: func(c *Config) { c.MaxIdle, c.TrimBatch = 1, 3 }, st: NodeState{IdleIPs: many},
			want: []string{"10.0.0.10", "10.0.0.11", "10.0.0.12"}},
		{
			name: "cooling and young addresses are never returned",
			st: NodeState{IdleIPs: append(slices.Clone(many[2:8]),
				idleIP("10.0.1.1", old, 0, 61*time.Minute),              // idle longest but cooling at now
				idleIP("10.0.1.2", 59*time.Minute+58*time.Second, 0, 0), // 2s old: below min lifetime
			)},
			want: []string{"10.0.0.12", "10.0.0.13"},
		},
		{
			name: "ties broken by address",
			st: NodeState{IdleIPs: []IdleIP{idleIP("10.0.0.9", old, 0, 0), idleIP("10.0.0.3", old, 0, 0),
				idleIP("10.0.0.5", old, 0, 0), idleIP("10.0.0.4", old, 0, 0), idleIP("10.0.0.8", old, 0, 0),
				idleIP("10.0.0.7", old, 0, 0), idleIP("10.0.0.6", old, 0, 0)}},
			want: []string{"10.0.0.3"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			if tc.cfg != nil {
				tc.cfg(&c)
			}
			var got []string
			for _, ip := range PlanTrim(c, tc.st, now) {
				got = append(got, ip.Addr.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("trim = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPlans_DoNotFight: after carrying out a grow plan, the trim plan is
// empty, and after carrying out a trim plan, the grow plan is empty, for
// every pool size and demand in range.
func TestPlans_DoNotFight(t *testing.T) {
	cfg := DefaultConfig()
	capc := Capacity{MaxIPsPerENI: 40, MaxENIs: 8, WarmIPTarget: 0, PreAttachedENIs: 1}
	now := t0.Add(time.Hour)
	for idle := 0; idle <= 20; idle++ {
		for waiting := 0; waiting <= 8; waiting++ {
			st := NodeState{Waiting: waiting, ENIs: enis(ENIState{ID: "a", Total: idle + 5, Idle: idle, Assigned: 5})}
			for i := range idle {
				st.IdleIPs = append(st.IdleIPs, idleIP(fmt.Sprintf("10.0.0.%d", i+1), -time.Hour, 0, 0))
			}
			g := PlanGrow(cfg, capc, st, nil, now)
			tr := PlanTrim(cfg, st, now)
			if g.Need > 0 && len(tr) > 0 {
				t.Fatalf("idle=%d waiting=%d: grow %d and trim %d at once", idle, waiting, g.Need, len(tr))
			}
			after := idle + g.Need - len(tr)
			if after < cfg.MinIdle+waiting && g.Short == 0 {
				t.Fatalf("idle=%d waiting=%d: still below min after plan (%d)", idle, waiting, after)
			}
			if after > cfg.MaxIdle+waiting && len(tr) < cfg.TrimBatch {
				t.Fatalf("idle=%d waiting=%d: still above max after plan (%d)", idle, waiting, after)
			}
		}
	}
}

func TestStateFromSnapshot(t *testing.T) {
	s, err := datastore.New(datastore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	mustDo := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	mustDo(s.AddNode("n"))
	mustDo(s.AddENI("n", datastore.ENI{ID: "a", SubnetID: "s1", PrimaryIP: netip.MustParseAddr("10.0.0.1"), Capacity: 8}))
	mustDo(s.AddENI("n", datastore.ENI{ID: "b", SubnetID: "s2", PrimaryIP: netip.MustParseAddr("10.0.1.1")}))
	addrs := []netip.Addr{netip.MustParseAddr("10.0.0.10"), netip.MustParseAddr("10.0.0.11"), netip.MustParseAddr("10.0.0.12")}
	mustDo(s.AddIPs("n", "a", addrs, t0))
	_, err = s.Allocate("n", datastore.Request{Owner: datastore.Owner{Namespace: "ns", Name: "p", ContainerID: "c"}}, t0)
	mustDo(err)
	_, err = s.Hold("n", []netip.Addr{netip.MustParseAddr("10.0.0.12")}, datastore.HoldReleasing)
	mustDo(err)
	snap, err := s.Snapshot("n")
	mustDo(err)
	st := StateFromSnapshot(snap, map[string]bool{"s2": true})
	want := []ENIState{
		{ID: "a", Total: 3, Idle: 1, Assigned: 1, Capacity: 8},
		{ID: "b", SubnetExhausted: true},
	}
	if !slices.Equal(st.ENIs, want) || st.Idle() != 1 || len(st.IdleIPs) != 1 ||
		st.IdleIPs[0].Addr != netip.MustParseAddr("10.0.0.11") || !st.IdleIPs[0].AddedAt.Equal(t0) {
		t.Fatalf("state = %+v", st)
	}
}

// An unsettled address (held until a cloud read confirms it) counts as idle
// for growing, so that waiting for the read does not grow the pool, but is
// never a trim candidate.
func TestStateFromSnapshot_UnsettledCountsAsIdleNotTrimmable(t *testing.T) {
	snap := restoredSnapshot(t, datastore.RestoreInput{Unsettled: true})
	st := StateFromSnapshot(snap, nil)
	if st.Idle() != 2 || len(st.IdleIPs) != 0 {
		t.Fatalf("state = %+v, want 2 idle for planning and no trim candidate", st)
	}
	if p := PlanGrow(Config{MinIdle: 2, MaxIdle: 4, Batch: 1, TrimBatch: 10}, Capacity{MaxIPsPerENI: 8}, st, nil, t0); p.Need != 0 {
		t.Fatalf("grow plan = %+v, want nothing while the unsettled addresses await their read", p)
	}
}

// UsableNow counts only what an allocation could take now: a node just taken
// over grows for its waiting pods instead of waiting for cooling and settling.
func TestUsableNow_CountsOnlyReadyIdle(t *testing.T) {
	// 10.0.0.10 and .11 cool from t0 (a takeover).
	snap := restoredSnapshot(t, datastore.RestoreInput{CoolFrom: t0})
	st := StateFromSnapshot(snap, nil)
	st.Waiting = 1
	cfg := Config{MinIdle: 2, MaxIdle: 4, Batch: 1, TrimBatch: 10}
	if p := PlanGrow(cfg, Capacity{MaxIPsPerENI: 8}, st, nil, t0); p.Need != 1 {
		t.Fatalf("plain plan = %+v, want 1 (for the waiting pod beyond the 2 cooling)", p)
	}
	now := t0.Add(time.Second)
	u := UsableNow(st, snap, now)
	if u.Idle() != 0 || st.Idle() != 2 || len(u.IdleIPs) != 2 {
		t.Fatalf("usable = %+v (idle %d), want 0 usable of 2 cooling, the trim candidates kept", u, u.Idle())
	}
	if p := PlanGrow(cfg, Capacity{MaxIPsPerENI: 8}, u, nil, now); p.Need != 3 {
		t.Fatalf("plan while cooling = %+v, want 3 (min 2 + 1 waiting)", p)
	}
	if later := UsableNow(st, snap, t0.Add(datastore.DefaultCooldown)); later.Idle() != 2 {
		t.Fatalf("after the cooling, usable = %d, want 2", later.Idle())
	}
}

// restoredSnapshot is the snapshot of node "n" restored at t0 from in plus
// one ENI "a" with the idle candidates 10.0.0.10 and 10.0.0.11.
func restoredSnapshot(t *testing.T, in datastore.RestoreInput) datastore.NodeSnapshot {
	t.Helper()
	s, err := datastore.New(datastore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	in.ENIs = []datastore.RestoreENI{{
		ENI: datastore.ENI{ID: "a", SubnetID: "s1", PrimaryIP: netip.MustParseAddr("10.0.0.1"), Capacity: 8},
		IPs: []netip.Addr{netip.MustParseAddr("10.0.0.10"), netip.MustParseAddr("10.0.0.11")},
	}}
	if _, err := s.Restore("n", in, t0); err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot("n")
	if err != nil {
		t.Fatal(err)
	}
	return snap
}
