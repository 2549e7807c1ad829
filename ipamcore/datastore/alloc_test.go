package datastore

import (
	"errors"
	"net/netip"
	"testing"
	"time"
)

func TestStore_Allocate(t *testing.T) {
	cool := 5 * time.Second
	type step struct {
		at      time.Duration // since t0
		req     Request
		want    string // expected address, "" when an error is expected
		err     error
		readyAt time.Duration // for *CoolingError
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, s *Store)
		steps []step
	}{
		{
			name:  "empty node",
			steps: []step{{req: Request{Owner: owner("p", "c")}, err: ErrNoIdleIP}},
		},
		{
			name: "most idle eni first, then oldest address",
			setup: func(t *testing.T, s *Store) {
				must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10"), t0))
				must(t, s.AddIPs("node-a", "eni-2", ips("10.0.2.12"), t0))
				must(t, s.AddIPs("node-a", "eni-2", ips("10.0.2.11"), t0.Add(time.Millisecond)))
			},
			steps: []step{
				{req: Request{Owner: owner("p1", "c")}, want: "10.0.2.12"},
				// tie 1:1 goes to the smaller ENI ID
				{req: Request{Owner: owner("p2", "c")}, want: "10.0.1.10"},
				{at: time.Millisecond, req: Request{Owner: owner("p3", "c")}, want: "10.0.2.11"},
				{at: time.Millisecond, req: Request{Owner: owner("p4", "c")}, err: ErrNoIdleIP},
			},
		},
		{
			name: "same pod again returns its address with the new sandbox",
			setup: func(t *testing.T, s *Store) {
				must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10", "10.0.1.11"), t0))
			},
			steps: []step{
				{req: Request{Owner: owner("p1", "c1")}, want: "10.0.1.10"},
				{req: Request{Owner: owner("p1", "c2")}, want: "10.0.1.10"},
			},
		},
		{
			name: "subnet filter",
			setup: func(t *testing.T, s *Store) {
				must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10", "10.0.1.11"), t0))
				must(t, s.AddIPs("node-a", "eni-2", ips("10.0.2.10"), t0))
			},
			steps: []step{
				{req: Request{Owner: owner("p1", "c"), SubnetID: "sbn-2"}, want: "10.0.2.10"},
				{req: Request{Owner: owner("p2", "c"), SubnetID: "sbn-2"}, err: ErrNoIdleIP},
				{req: Request{Owner: owner("p2", "c"), SubnetID: "sbn-x"}, err: ErrNoIdleIP},
			},
		},
		{
			name: "cooling addresses are not handed out even when nothing else is idle",
			setup: func(t *testing.T, s *Store) {
				must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10"), t0))
				_, err := s.Allocate("node-a", Request{Owner: owner("old", "c")}, t0)
				must(t, err)
				_, err = s.Release("node-a", ip("10.0.1.10"), "c", t0.Add(time.Second))
				must(t, err)
			},
			steps: []step{
				{at: 2 * time.Second, req: Request{Owner: owner("p1", "c")}, err: ErrIPCooling, readyAt: 6 * time.Second},
				{at: 5999 * time.Millisecond, req: Request{Owner: owner("p1", "c")}, err: ErrNoIdleIP, readyAt: 6 * time.Second},
				{at: 6 * time.Second, req: Request{Owner: owner("p1", "c")}, want: "10.0.1.10"},
			},
		},
		{
			name: "fresh address beats cooling one on another eni",
			setup: func(t *testing.T, s *Store) {
				must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10", "10.0.1.11"), t0))
				_, err := s.AllocateSpecific("node-a", ip("10.0.1.10"), owner("a", "c"))
				must(t, err)
				_, err = s.AllocateSpecific("node-a", ip("10.0.1.11"), owner("b", "c"))
				must(t, err)
				_, err = s.Release("node-a", ip("10.0.1.10"), "c", t0)
				must(t, err)
				_, err = s.Release("node-a", ip("10.0.1.11"), "c", t0)
				must(t, err)
				must(t, s.AddIPs("node-a", "eni-2", ips("10.0.2.10"), t0))
			},
			steps: []step{
				{at: time.Second, req: Request{Owner: owner("p1", "c")}, want: "10.0.2.10"},
				{at: time.Second, req: Request{Owner: owner("p2", "c")}, err: ErrIPCooling, readyAt: cool},
			},
		},
		{
			name: "held and cross-subnet addresses are never handed out",
			setup: func(t *testing.T, s *Store) {
				must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10"), t0))
				_, err := s.Hold("node-a", ips("10.0.1.10"), HoldReleasing)
				must(t, err)
				_, err = s.AddAssignedIP("node-a", "eni-1", ip("10.7.0.1"), owner("psts", "c"), t0)
				must(t, err)
			},
			steps: []step{{req: Request{Owner: owner("p1", "c")}, err: ErrNoIdleIP}},
		},
		{
			name:  "bad owner",
			steps: []step{{req: Request{Owner: Owner{Namespace: "ns", Name: "p"}}, err: ErrInvalidArgument}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fixture(t, Config{Cooldown: cool})
			if tc.setup != nil {
				tc.setup(t, s)
			}
			for i, st := range tc.steps {
				before, _ := s.Snapshot("node-a")
				got, err := s.Allocate("node-a", st.req, t0.Add(st.at))
				wantErr(t, err, st.err)
				check(t, s)
				if err != nil {
					var ce *CoolingError
					if errors.As(err, &ce) != (st.readyAt != 0) {
						t.Fatalf("step %d: cooling error = %v", i, err)
					}
					if ce != nil && !ce.ReadyAt.Equal(t0.Add(st.readyAt)) {
						t.Fatalf("step %d: ReadyAt = %s, want %s", i, ce.ReadyAt, t0.Add(st.readyAt))
					}
					after, _ := s.Snapshot("node-a")
					sameState(t, before, after)
					continue
				}
				if got.Addr != ip(st.want) || got.State != StateAssigned || got.Owner != st.req.Owner {
					t.Fatalf("step %d: got %+v, want %s for %s", i, got, st.want, st.req.Owner)
				}
				back, err := s.LookupIP(got.Addr)
				must(t, err)
				if back.Owner != st.req.Owner || back.Node != "node-a" {
					t.Fatalf("step %d: lookup = %+v", i, back)
				}
			}
		})
	}
}

func TestStore_AllocateSpecific(t *testing.T) {
	for _, tc := range []struct {
		name  string
		addr  string
		owner Owner
		err   error
	}{
		{"idle", "10.0.1.11", owner("web-0", "c1"), nil},
		{"cooling is ignored for a named address", "10.0.1.12", owner("web-0", "c1"), nil},
		{"same pod again updates container", "10.0.1.10", owner("web-1", "c9"), nil},
		{"other pod", "10.0.1.10", owner("web-0", "c1"), ErrIPInUse},
		{"pod holds another", "10.0.1.11", owner("web-1", "c9"), ErrPodHasIP},
		{"held", "10.0.1.13", owner("web-0", "c1"), ErrHeld},
		{"unknown", "10.0.1.99", owner("web-0", "c1"), ErrUnknownIP},
		{"zero addr", "", owner("web-0", "c1"), ErrInvalidArgument},
		{"bad owner", "10.0.1.11", Owner{Namespace: "default", Name: "web-0"}, ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fixture(t, DefaultConfig())
			must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10", "10.0.1.11", "10.0.1.12", "10.0.1.13"), t0))
			_, err := s.AllocateSpecific("node-a", ip("10.0.1.10"), owner("web-1", "c1"))
			must(t, err)
			_, err = s.AllocateSpecific("node-a", ip("10.0.1.12"), owner("tmp", "c1"))
			must(t, err)
			_, err = s.Release("node-a", ip("10.0.1.12"), "c1", t0)
			must(t, err)
			_, err = s.Hold("node-a", ips("10.0.1.13"), HoldConflict)
			must(t, err)

			var a netip.Addr // zero: malformed input
			if tc.addr != "" {
				a = ip(tc.addr)
			}
			before, _ := s.Snapshot("node-a")
			got, err := s.AllocateSpecific("node-a", a, tc.owner)
			wantErr(t, err, tc.err)
			check(t, s)
			if err != nil {
				after, _ := s.Snapshot("node-a")
				sameState(t, before, after)
				return
			}
			if got.Owner != tc.owner || got.Addr != a || got.State != StateAssigned {
				t.Fatalf("got %+v", got)
			}
		})
	}
}

func TestStore_Release(t *testing.T) {
	for _, tc := range []struct {
		name     string
		addr     string
		cid      string
		err      error
		removed  bool
		stillOwn bool // the address must still belong to its owner
	}{
		{"owner's sandbox", "10.0.1.10", "c2", nil, false, false},
		{"stale sandbox after re-add keeps the ip", "10.0.1.10", "c1", ErrContainerMismatch, false, true},
		{"other container", "10.0.1.10", "zzz", ErrContainerMismatch, false, true},
		{"empty container", "10.0.1.10", "", ErrInvalidArgument, false, true},
		{"idle: repeated DEL", "10.0.1.11", "c2", ErrNotAssigned, false, false},
		{"unknown", "10.0.1.99", "c2", ErrUnknownIP, false, false},
		{"held", "10.0.1.12", "c2", ErrHeld, false, false},
		{"cross-subnet is forgotten", "10.7.0.1", "x1", nil, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fixture(t, DefaultConfig())
			must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10", "10.0.1.11", "10.0.1.12"), t0))
			_, err := s.Allocate("node-a", Request{Owner: owner("p", "c1")}, t0)
			must(t, err)
			// the pod's sandbox is re-created: c2 now owns 10.0.1.10
			_, err = s.Allocate("node-a", Request{Owner: owner("p", "c2")}, t0)
			must(t, err)
			_, err = s.Hold("node-a", ips("10.0.1.12"), HoldConflict)
			must(t, err)
			_, err = s.AddAssignedIP("node-a", "eni-1", ip("10.7.0.1"), owner("psts", "x1"), t0)
			must(t, err)

			before, _ := s.Snapshot("node-a")
			now := t0.Add(time.Minute)
			rel, err := s.Release("node-a", ip(tc.addr), tc.cid, now)
			wantErr(t, err, tc.err)
			check(t, s)
			if err != nil {
				after, _ := s.Snapshot("node-a")
				sameState(t, before, after)
			}
			if tc.stillOwn {
				got, err := s.LookupIP(ip(tc.addr))
				must(t, err)
				if got.State != StateAssigned || got.Owner != owner("p", "c2") {
					t.Fatalf("owner lost: %+v", got)
				}
			}
			if err != nil {
				return
			}
			if rel.Removed != tc.removed || rel.Info.Addr != ip(tc.addr) || rel.Info.State != StateAssigned {
				t.Fatalf("released = %+v", rel)
			}
			got, lerr := s.LookupIP(ip(tc.addr))
			if tc.removed {
				wantErr(t, lerr, ErrUnknownIP)
				return
			}
			must(t, lerr)
			if got.State != StateIdle || !got.IdleSince.Equal(now) || !got.ReadyAt.Equal(now.Add(DefaultCooldown)) {
				t.Fatalf("after release: %+v", got)
			}
			if _, err := s.LookupPod("node-a", PodKey{"default", "p"}); !errors.Is(err, ErrUnknownIP) {
				t.Fatalf("pod still indexed: %v", err)
			}
		})
	}
}

func TestStore_HoldUnhold(t *testing.T) {
	s := fixture(t, DefaultConfig())
	must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10", "10.0.1.11", "10.0.1.12"), t0))
	_, err := s.AllocateSpecific("node-a", ip("10.0.1.11"), owner("p", "c"))
	must(t, err)

	_, err = s.Hold("node-a", ips("10.0.1.10"), HoldNone)
	wantErr(t, err, ErrInvalidArgument)
	// Only idle addresses are held; the assigned and unknown ones are skipped.
	held, err := s.Hold("node-a", ips("10.0.1.10", "10.0.1.11", "10.0.1.99", "10.0.1.12"), HoldReleasing)
	must(t, err)
	if len(held) != 2 || held[0] != ip("10.0.1.10") || held[1] != ip("10.0.1.12") {
		t.Fatalf("held = %v", held)
	}
	check(t, s)
	st, _ := s.Stats("node-a", t0)
	if st.Held != 2 || st.Idle != 0 || st.Assigned != 1 || st.Total != 3 {
		t.Fatalf("stats = %+v", st)
	}

	now := t0.Add(time.Minute)
	_, err = s.Unhold("node-a", ip("10.0.1.11"), nil, now)
	wantErr(t, err, ErrNotHeld)
	_, err = s.Unhold("node-a", ip("10.0.1.99"), nil, now)
	wantErr(t, err, ErrUnknownIP)
	o := owner("p", "c")
	_, err = s.Unhold("node-a", ip("10.0.1.10"), &o, now)
	wantErr(t, err, ErrPodHasIP)

	back, err := s.Unhold("node-a", ip("10.0.1.10"), nil, now)
	must(t, err)
	if back.State != StateIdle || !back.ReadyAt.Equal(now.Add(DefaultCooldown)) {
		t.Fatalf("unheld = %+v", back)
	}
	o2 := owner("q", "c")
	got, err := s.Unhold("node-a", ip("10.0.1.12"), &o2, now)
	must(t, err)
	if got.State != StateAssigned || got.Owner != o2 {
		t.Fatalf("unheld = %+v", got)
	}
	check(t, s)
}

func TestStore_Lookup(t *testing.T) {
	s := fixture(t, DefaultConfig())
	must(t, s.AddIPs("node-a", "eni-2", ips("10.0.2.10"), t0))
	got, err := s.Allocate("node-a", Request{Owner: owner("p", "c")}, t0)
	must(t, err)
	want := IPInfo{Node: "node-a", ENIID: "eni-2", SubnetID: "sbn-2", MAC: "fa:16:3e:00:00:01",
		Addr: ip("10.0.2.10"), State: StateAssigned, Owner: owner("p", "c"), AddedAt: t0}
	if got != want {
		t.Fatalf("allocate = %+v\nwant       %+v", got, want)
	}
	for _, tc := range []struct {
		name string
		fn   func() (IPInfo, error)
		err  error
	}{
		{"ip", func() (IPInfo, error) { return s.LookupIP(ip("10.0.2.10")) }, nil},
		{"mapped ip", func() (IPInfo, error) { return s.LookupIP(ip("::ffff:10.0.2.10")) }, nil},
		{"pod", func() (IPInfo, error) { return s.LookupPod("node-a", PodKey{"default", "p"}) }, nil},
		{"unknown ip", func() (IPInfo, error) { return s.LookupIP(ip("10.0.2.99")) }, ErrUnknownIP},
		{"primary is not a pool ip", func() (IPInfo, error) { return s.LookupIP(ip("10.0.2.2")) }, ErrUnknownIP},
		{"unknown pod", func() (IPInfo, error) { return s.LookupPod("node-a", PodKey{"default", "q"}) }, ErrUnknownIP},
		{"pod on unknown node", func() (IPInfo, error) { return s.LookupPod("node-x", PodKey{"default", "p"}) }, ErrNodeNotFound},
		{"empty pod", func() (IPInfo, error) { return s.LookupPod("node-a", PodKey{}) }, ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info, err := tc.fn()
			wantErr(t, err, tc.err)
			if err == nil && info != want {
				t.Fatalf("lookup = %+v", info)
			}
		})
	}
}

func TestStore_Stats(t *testing.T) {
	s := fixture(t, DefaultConfig())
	must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10", "10.0.1.11", "10.0.1.12", "10.0.1.13"), t0))
	must(t, s.AddIPs("node-a", "eni-2", ips("10.0.2.10"), t0))
	_, err := s.AllocateSpecific("node-a", ip("10.0.1.10"), owner("a", "c"))
	must(t, err)
	_, err = s.AllocateSpecific("node-a", ip("10.0.1.11"), owner("b", "c"))
	must(t, err)
	_, err = s.Release("node-a", ip("10.0.1.11"), "c", t0)
	must(t, err)
	_, err = s.Hold("node-a", ips("10.0.1.12"), HoldReleasing)
	must(t, err)

	st, err := s.Stats("node-a", t0.Add(time.Second))
	must(t, err)
	want := NodeStats{Node: "node-a", Total: 5, Idle: 3, Cooling: 1, Assigned: 1, Held: 1, ENIs: []ENIStats{
		{ID: "eni-1", SubnetID: "sbn-1", Capacity: 8, Total: 4, Idle: 2, Cooling: 1, Assigned: 1, Held: 1},
		{ID: "eni-2", SubnetID: "sbn-2", Capacity: 8, Total: 1, Idle: 1},
	}}
	if got, w := sprint(st), sprint(want); got != w {
		t.Fatalf("stats\n got %s\nwant %s", got, w)
	}
	st, _ = s.Stats("node-a", t0.Add(DefaultCooldown))
	if st.Cooling != 0 {
		t.Fatalf("still cooling after cooldown: %+v", st)
	}
	_, err = s.Stats("node-x", t0)
	wantErr(t, err, ErrNodeNotFound)
}
