package datastore

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"
)

func renis(list ...RestoreENI) []RestoreENI { return list }

func re(e ENI, addrs ...string) RestoreENI { return RestoreENI{ENI: e, IPs: ips(addrs...)} }

func claim(addr, name, cid string) Claim { return Claim{Addr: ip(addr), Owner: owner(name, cid)} }

var (
	e1 = eni("eni-1", "sbn-1", "10.0.1.0/24", "10.0.1.2")
	e2 = eni("eni-2", "sbn-2", "10.0.2.0/24", "10.0.2.2")
)

func TestStore_Restore(t *testing.T) {
	type want struct {
		idle, assigned, held int
		conflicts            []string // Conflict.String()
		states               map[string]IPState
	}
	for _, tc := range []struct {
		name string
		in   RestoreInput
		err  error
		want want
	}{
		{
			name: "clean",
			in: RestoreInput{
				ENIs:   renis(re(e1, "10.0.1.10", "10.0.1.11"), re(e2, "10.0.2.10")),
				Claims: []Claim{claim("10.0.1.11", "p", "c")},
			},
			want: want{idle: 2, assigned: 1, states: map[string]IPState{"10.0.1.11": StateAssigned, "10.0.2.10": StateIdle}},
		},
		{
			name: "ip claimed by two pods is held, not given to either",
			in: RestoreInput{
				ENIs:   renis(re(e1, "10.0.1.10")),
				Claims: []Claim{claim("10.0.1.10", "p", "c"), claim("10.0.1.10", "q", "d")},
			},
			want: want{held: 1, conflicts: []string{
				"claimed-twice 10.0.1.10 enis=[eni-1] owner=default/p@c owner=default/q@d held"}},
		},
		{
			name: "same pod claiming twice is one claim",
			in: RestoreInput{
				ENIs:   renis(re(e1, "10.0.1.10")),
				Claims: []Claim{claim("10.0.1.10", "p", "c"), claim("10.0.1.10", "p", "c")},
			},
			want: want{assigned: 1},
		},
		{
			name: "pod claiming two ips holds both",
			in: RestoreInput{
				ENIs:   renis(re(e1, "10.0.1.10", "10.0.1.11")),
				Claims: []Claim{claim("10.0.1.10", "p", "c"), claim("10.0.1.11", "p", "c")},
			},
			want: want{held: 2, conflicts: []string{
				"pod-claims-two 10.0.1.10 enis=[eni-1] owner=default/p@c held",
				"pod-claims-two 10.0.1.11 enis=[eni-1] owner=default/p@c held"}},
		},
		{
			name: "ip on two enis is held on the first",
			in: RestoreInput{
				ENIs: renis(re(e2, "10.0.1.10"), re(eni("eni-1", "sbn-1", "", "10.0.1.2"), "10.0.1.10")),
			},
			want: want{held: 1, conflicts: []string{"ip-on-two-enis 10.0.1.10 enis=[eni-1 eni-2] held"}},
		},
		{
			name: "claim for an ip the cloud lacks",
			in: RestoreInput{
				ENIs:   renis(re(e1, "10.0.1.10")),
				Claims: []Claim{claim("10.0.1.99", "p", "c")},
			},
			want: want{idle: 1, conflicts: []string{"claim-not-on-node 10.0.1.99 owner=default/p@c"}},
		},
		{
			name: "cross-subnet: claimed is assigned, unclaimed is held",
			in: RestoreInput{
				ENIs:   renis(re(e1, "10.7.0.1", "10.7.0.2")),
				Claims: []Claim{claim("10.7.0.1", "p", "c")},
			},
			want: want{assigned: 1, held: 1, conflicts: []string{"unclaimed-cross-subnet 10.7.0.2 enis=[eni-1] held"},
				states: map[string]IPState{"10.7.0.1": StateAssigned, "10.7.0.2": StateHeld}},
		},
		{
			name: "secondary equal to a primary is skipped",
			in:   RestoreInput{ENIs: renis(re(e1, "10.0.2.2"), re(e2))},
			want: want{conflicts: []string{"primary-as-secondary 10.0.2.2 enis=[eni-1 eni-2]"}},
		},
		{
			name: "ip recorded on another node",
			in:   RestoreInput{ENIs: renis(re(e1, "10.0.9.9", "10.0.1.10"))},
			want: want{idle: 1, conflicts: []string{
				"ip-on-other-node 10.0.9.9 enis=[eni-1] other-node=node-b"}},
		},
		{
			name: "primary that another node holds as a secondary: eni kept, reported",
			in:   RestoreInput{ENIs: renis(re(eni("eni-9", "sbn-9", "", "10.0.9.9"), "10.0.9.10"))},
			want: want{idle: 1, conflicts: []string{
				"ip-on-other-node 10.0.9.9 enis=[eni-9] other-node=node-b"}},
		},
		{
			name: "eni recorded on another node",
			in:   RestoreInput{ENIs: renis(re(eni("eni-b", "sbn-9", "", "10.0.9.2"), "10.0.9.20"), re(e1, "10.0.1.10"))},
			want: want{idle: 1, conflicts: []string{
				"eni-on-other-node 10.0.9.2 enis=[eni-b] other-node=node-b"}},
		},
		{
			name: "malformed claim is a conflict, not a failed rebuild",
			in: RestoreInput{
				ENIs:   renis(re(e1, "10.0.1.10")),
				Claims: []Claim{{Owner: owner("p", "c")}, {Addr: ip("10.0.1.10"), Owner: Owner{Name: "x"}}},
			},
			want: want{idle: 1, conflicts: []string{
				"invalid-claim invalid IP owner=default/p@c",
				"invalid-claim 10.0.1.10 owner=/x@"}},
		},
		{name: "eni listed twice", in: RestoreInput{ENIs: renis(re(e1), re(e1))}, err: ErrInvalidArgument},
		{name: "shared primary", in: RestoreInput{ENIs: renis(re(e1), re(eni("eni-3", "s", "", "10.0.1.2")))}, err: ErrInvalidArgument},
		{name: "bad eni", in: RestoreInput{ENIs: renis(re(ENI{ID: "eni-3"}))}, err: ErrInvalidArgument},
		{name: "bad ip", in: RestoreInput{ENIs: []RestoreENI{{ENI: e1, IPs: []netip.Addr{{}}}}}, err: ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fixture(t, DefaultConfig())
			must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.50"), t0))
			must(t, s.AddNode("node-b"))
			must(t, s.AddENI("node-b", eni("eni-b", "sbn-9", "10.0.9.0/24", "10.0.9.2")))
			must(t, s.AddIPs("node-b", "eni-b", ips("10.0.9.9"), t0))
			before, _ := s.Snapshot("node-a")
			otherBefore, _ := s.Snapshot("node-b")

			rep, err := s.Restore("node-a", tc.in, t0.Add(time.Minute))
			wantErr(t, err, tc.err)
			check(t, s)
			otherAfter, _ := s.Snapshot("node-b")
			sameState(t, otherBefore, otherAfter)
			if err != nil {
				after, _ := s.Snapshot("node-a")
				sameState(t, before, after)
				return
			}
			if rep.Idle != tc.want.idle || rep.Assigned != tc.want.assigned || rep.Held != tc.want.held {
				t.Fatalf("report = %+v, want %+v", rep, tc.want)
			}
			var got []string
			for _, c := range rep.Conflicts {
				got = append(got, c.String())
			}
			if !slices.Equal(got, tc.want.conflicts) {
				t.Fatalf("conflicts\n got %q\nwant %q", got, tc.want.conflicts)
			}
			st, _ := s.Stats("node-a", t0.Add(time.Minute))
			if st.Idle != rep.Idle || st.Assigned != rep.Assigned || st.Held != rep.Held || st.Cooling != 0 {
				t.Fatalf("stats %+v disagree with report %+v", st, rep)
			}
			for a, want := range tc.want.states {
				info, err := s.LookupIP(ip(a))
				must(t, err)
				if info.State != want {
					t.Fatalf("%s is %s, want %s", a, info.State, want)
				}
			}
			// the old state is gone: 10.0.1.50 was not in the snapshot
			if _, err := s.LookupIP(ip("10.0.1.50")); err == nil {
				t.Fatal("address missing from the snapshot survived the restore")
			}
		})
	}
}

func TestStore_Restore_AddsNodeAndKeepsCooling(t *testing.T) {
	s, err := New(DefaultConfig())
	must(t, err)
	in := RestoreInput{ENIs: renis(re(e1, "10.0.1.10", "10.0.1.11"))}
	rep, err := s.Restore("node-a", in, t0)
	must(t, err)
	if rep.Idle != 2 || !s.HasNode("node-a") {
		t.Fatalf("report = %+v", rep)
	}
	_, err = s.Allocate("node-a", Request{Owner: owner("p", "c")}, t0)
	must(t, err)
	_, err = s.Release("node-a", ip("10.0.1.10"), "c", t0.Add(time.Second))
	must(t, err)

	// A resync a moment later must not make the just-released address
	// usable before its cooldown ends, nor reorder the pool.
	_, err = s.Restore("node-a", in, t0.Add(2*time.Second))
	must(t, err)
	check(t, s)
	got, err := s.LookupIP(ip("10.0.1.10"))
	must(t, err)
	if !got.ReadyAt.Equal(t0.Add(time.Second+DefaultCooldown)) || !got.AddedAt.Equal(t0) {
		t.Fatalf("cooling lost: %+v", got)
	}
	a, err := s.Allocate("node-a", Request{Owner: owner("q", "c")}, t0.Add(2*time.Second))
	must(t, err)
	if a.Addr != ip("10.0.1.11") {
		t.Fatalf("got %s, want the non-cooling 10.0.1.11", a.Addr)
	}
	_, err = s.Restore("", in, t0)
	wantErr(t, err, ErrInvalidArgument)
}

// A hand-over: the new owner's store never saw the previous owner's
// releases, so every unclaimed address cools from CoolFrom.
func TestStore_Restore_CoolFromCoolsEveryNewIdleAddress(t *testing.T) {
	s, err := New(DefaultConfig())
	must(t, err)
	in := RestoreInput{ENIs: renis(re(e1, "10.0.1.10", "10.0.1.11")), Claims: []Claim{claim("10.0.1.11", "p", "c")},
		CoolFrom: t0}
	_, err = s.Restore("node-a", in, t0.Add(time.Second))
	must(t, err)
	check(t, s)
	_, err = s.Allocate("node-a", Request{Owner: owner("q", "c")}, t0.Add(DefaultCooldown-time.Millisecond))
	var cooling *CoolingError
	if !errors.As(err, &cooling) || !cooling.ReadyAt.Equal(t0.Add(DefaultCooldown)) {
		t.Fatalf("allocate before the cooldown from CoolFrom ended = %v, want a CoolingError until %s", err, t0.Add(DefaultCooldown))
	}
	a, err := s.Allocate("node-a", Request{Owner: owner("q", "c")}, t0.Add(DefaultCooldown))
	must(t, err)
	if a.Addr != ip("10.0.1.10") {
		t.Fatalf("got %s, want 10.0.1.10", a.Addr)
	}
}

// A takeover whose ENI list may lag: unclaimed addresses are held until a
// read settles them, and each one is settled by what the read shows.
func TestStore_Restore_UnsettledUntilSettled(t *testing.T) {
	s, err := New(DefaultConfig())
	must(t, err)
	in := RestoreInput{ENIs: renis(re(e1, "10.0.1.10", "10.0.1.11", "10.0.1.12")),
		Claims: []Claim{claim("10.0.1.12", "p", "c")}, CoolFrom: t0, Unsettled: true}
	rep, err := s.Restore("node-a", in, t0)
	must(t, err)
	check(t, s)
	if rep.Held != 2 || rep.Assigned != 1 || rep.Idle != 0 {
		t.Fatalf("report = %+v, want 2 held, 1 assigned", rep)
	}
	late := t0.Add(time.Hour)
	if _, err := s.Allocate("node-a", Request{Owner: owner("q", "c")}, late); !errors.Is(err, ErrNoIdleIP) {
		t.Fatalf("allocate with only unsettled addresses = %v, want ErrNoIdleIP", err)
	}
	// A resync before the read keeps them unsettled.
	_, err = s.Restore("node-a", RestoreInput{ENIs: in.ENIs, Claims: in.Claims}, t0.Add(time.Second))
	must(t, err)
	if got, _ := s.LookupIP(ip("10.0.1.10")); got.HoldReason != HoldUnsettled {
		t.Fatalf("a resync settled an address no read confirmed: %+v", got)
	}

	info, err := s.Settle("node-a", ip("10.0.1.10"), true, t0)
	must(t, err)
	if info.State != StateIdle || !info.ReadyAt.Equal(t0.Add(DefaultCooldown)) {
		t.Fatalf("confirmed address = %+v, want idle, cooling from t0", info)
	}
	gone, err := s.Settle("node-a", ip("10.0.1.11"), false, t0)
	must(t, err)
	if gone.Addr != ip("10.0.1.11") {
		t.Fatalf("settle absent returned %+v", gone)
	}
	if _, err := s.LookupIP(ip("10.0.1.11")); !errors.Is(err, ErrUnknownIP) {
		t.Fatalf("an address the read lacks is still recorded: %v", err)
	}
	check(t, s)
	if _, err := s.Settle("node-a", ip("10.0.1.12"), false, t0); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("settle of an assigned address = %v, want ErrNotHeld", err)
	}
	if _, err := s.Settle("node-a", ip("10.0.1.99"), true, t0); !errors.Is(err, ErrUnknownIP) {
		t.Fatalf("settle of an unknown address = %v, want ErrUnknownIP", err)
	}
	a, err := s.Allocate("node-a", Request{Owner: owner("q", "c")}, late)
	must(t, err)
	if a.Addr != ip("10.0.1.10") {
		t.Fatalf("got %s, want the confirmed 10.0.1.10", a.Addr)
	}
}

func TestStore_Surrender(t *testing.T) {
	s, err := New(Config{})
	must(t, err)
	_, err = s.Restore("node-a", RestoreInput{ENIs: renis(re(e1, "10.0.1.10", "10.0.1.11", "10.0.1.12")),
		Claims: []Claim{claim("10.0.1.10", "p", "c"), claim("10.0.1.11", "q", "c")}}, t0)
	must(t, err)
	if _, err := s.Surrender("node-a", ip("10.0.1.11"), owner("p", "c").Pod()); !errors.Is(err, ErrPodHasIP) {
		t.Fatalf("surrender of another pod's address = %v, want ErrPodHasIP", err)
	}
	info, err := s.Surrender("node-a", ip("10.0.1.10"), owner("p", "c").Pod())
	must(t, err)
	if info.State != StateHeld || info.HoldReason != HoldReleasing {
		t.Fatalf("surrendered = %+v, want held releasing", info)
	}
	if _, err := s.LookupPod("node-a", owner("p", "c").Pod()); !errors.Is(err, ErrUnknownIP) {
		t.Fatalf("the pod still holds an address after surrendering it: %v", err)
	}
	check(t, s)
	// Only the idle 10.0.1.12 can be allocated now.
	a, err := s.Allocate("node-a", Request{Owner: owner("r", "c")}, t0)
	must(t, err)
	if a.Addr != ip("10.0.1.12") {
		t.Fatalf("allocated %s", a.Addr)
	}
	if _, err := s.Allocate("node-a", Request{Owner: owner("x", "c")}, t0); !errors.Is(err, ErrNoIdleIP) {
		t.Fatalf("allocate = %v, want ErrNoIdleIP (the surrendered address is not idle)", err)
	}
}

func TestStore_Unsettle(t *testing.T) {
	s, err := New(Config{})
	must(t, err)
	_, err = s.Restore("node-a", RestoreInput{ENIs: renis(re(e1, "10.0.1.10", "10.0.1.11"))}, t0)
	must(t, err)
	if err := s.Unsettle("node-a", ip("10.0.1.10")); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("unsettle of an idle address = %v, want ErrNotHeld", err)
	}
	_, err = s.Hold("node-a", ips("10.0.1.10"), HoldReleasing)
	must(t, err)
	must(t, s.Unsettle("node-a", ip("10.0.1.10")))
	got, err := s.LookupIP(ip("10.0.1.10"))
	must(t, err)
	if got.State != StateHeld || got.HoldReason != HoldUnsettled {
		t.Fatalf("after Unsettle: %+v", got)
	}
	check(t, s)
}
