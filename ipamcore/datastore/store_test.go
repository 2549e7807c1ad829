package datastore

import (
	"errors"
	"net/netip"
	"testing"
	"time"
)

func TestNew_Config(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want time.Duration
		err  error
	}{
		{"default", DefaultConfig(), DefaultCooldown, nil},
		{"custom", Config{Cooldown: 30 * time.Second}, 30 * time.Second, nil},
		{"zero is none", Config{}, 0, nil},
		{"negative", Config{Cooldown: -time.Second}, 0, ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(tc.cfg)
			wantErr(t, err, tc.err)
			if err == nil && s.Cooldown() != tc.want {
				t.Fatalf("cooldown = %s, want %s", s.Cooldown(), tc.want)
			}
		})
	}
}

func TestStore_AddNode_RemoveNode(t *testing.T) {
	s := fixture(t, DefaultConfig())
	must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10", "10.0.1.11"), t0))
	must(t, s.AddNode("node-b"))
	must(t, s.AddENI("node-b", eni("eni-3", "sbn-1", "10.0.1.0/24", "10.0.1.3")))
	must(t, s.AddIPs("node-b", "eni-3", ips("10.0.1.20"), t0))

	wantErr(t, s.AddNode("node-a"), ErrNodeExists)
	wantErr(t, s.AddNode(""), ErrInvalidArgument)
	_, err := s.RemoveNode("nope")
	wantErr(t, err, ErrNodeNotFound)
	_, err = s.RemoveNode("")
	wantErr(t, err, ErrInvalidArgument)

	before, _ := s.Snapshot("node-b")
	gone, err := s.RemoveNode("node-a")
	must(t, err)
	if len(gone.ENIs) != 2 || len(gone.ENIs[0].IPs) != 2 {
		t.Fatalf("removed snapshot = %+v", gone)
	}
	check(t, s)
	after, err := s.Snapshot("node-b")
	must(t, err)
	sameState(t, before, after)
	if got := s.Nodes(); len(got) != 1 || got[0] != "node-b" {
		t.Fatalf("nodes = %v", got)
	}
	if s.HasNode("node-a") {
		t.Fatal("node-a still present")
	}
	_, err = s.Allocate("node-a", Request{Owner: owner("p", "c")}, t0)
	wantErr(t, err, ErrNodeNotFound)
	// Its addresses and ENIs are free for another node now.
	must(t, s.AddENI("node-b", eni("eni-1", "sbn-1", "10.0.1.0/24", "10.0.1.2")))
	must(t, s.AddIPs("node-b", "eni-1", ips("10.0.1.10"), t0))
	check(t, s)
}

func TestStore_AddENI(t *testing.T) {
	for _, tc := range []struct {
		name string
		node string
		eni  ENI
		err  error
	}{
		{"ok", "node-a", eni("eni-9", "sbn-1", "10.0.1.0/24", "10.0.1.9"), nil},
		{"no cidr ok", "node-a", eni("eni-9", "sbn-1", "", "10.0.1.9"), nil},
		{"unknown node", "node-x", eni("eni-9", "sbn-1", "", "10.0.1.9"), ErrNodeNotFound},
		{"empty node", "", eni("eni-9", "sbn-1", "", "10.0.1.9"), ErrInvalidArgument},
		{"empty id", "node-a", eni("", "sbn-1", "", "10.0.1.9"), ErrInvalidArgument},
		{"empty subnet", "node-a", eni("eni-9", "", "", "10.0.1.9"), ErrInvalidArgument},
		{"bad mac", "node-a", func() ENI { e := eni("eni-9", "s", "", "10.0.1.9"); e.MAC = "zz"; return e }(), ErrInvalidArgument},
		{"no primary", "node-a", ENI{ID: "eni-9", SubnetID: "s"}, ErrInvalidArgument},
		{"unspecified primary", "node-a", eni("eni-9", "s", "", "0.0.0.0"), ErrInvalidArgument},
		{"negative capacity", "node-a", func() ENI { e := eni("eni-9", "s", "", "10.0.1.9"); e.Capacity = -1; return e }(), ErrInvalidArgument},
		{"duplicate id", "node-a", eni("eni-1", "sbn-1", "", "10.0.1.9"), ErrENIExists},
		{"duplicate id other node", "node-b", eni("eni-1", "sbn-1", "", "10.0.1.9"), ErrENIExists},
		{"primary is other eni's primary", "node-a", eni("eni-9", "sbn-1", "", "10.0.1.2"), ErrIPExists},
		{"primary is a secondary", "node-a", eni("eni-9", "sbn-1", "", "10.0.1.10"), ErrIPExists},
		{"primary is other node's secondary", "node-b", eni("eni-9", "sbn-1", "", "10.0.1.10"), ErrIPExists},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fixture(t, DefaultConfig())
			must(t, s.AddNode("node-b"))
			must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10"), t0))
			before, _ := s.Snapshot("node-a")
			err := s.AddENI(tc.node, tc.eni)
			wantErr(t, err, tc.err)
			if err != nil {
				after, _ := s.Snapshot("node-a")
				sameState(t, before, after)
			}
			check(t, s)
		})
	}
}

func TestStore_RemoveENI(t *testing.T) {
	s := fixture(t, DefaultConfig())
	must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10", "10.0.1.11"), t0))
	must(t, s.AddIPs("node-a", "eni-2", ips("10.0.2.10"), t0))
	got, err := s.AllocateSpecific("node-a", ip("10.0.1.11"), owner("p", "c"))
	must(t, err)

	_, err = s.RemoveENI("node-a", "eni-x")
	wantErr(t, err, ErrENINotFound)
	_, err = s.RemoveENI("node-a", "")
	wantErr(t, err, ErrInvalidArgument)

	gone, err := s.RemoveENI("node-a", "eni-1")
	must(t, err)
	if len(gone) != 2 || gone[1].Addr != got.Addr || gone[1].State != StateAssigned || gone[1].Owner != got.Owner {
		t.Fatalf("removed = %+v", gone)
	}
	check(t, s)
	st, _ := s.Stats("node-a", t0)
	if st.Total != 1 || st.Assigned != 0 || len(st.ENIs) != 1 {
		t.Fatalf("stats = %+v", st)
	}
	if _, err := s.LookupPod("node-a", got.Owner.Pod()); !errors.Is(err, ErrUnknownIP) {
		t.Fatalf("pod still indexed: %v", err)
	}
	// The primary and the addresses may be recorded again.
	must(t, s.AddENI("node-a", eni("eni-1", "sbn-1", "10.0.1.0/24", "10.0.1.2")))
	must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.11"), t0))
	check(t, s)
}

func TestStore_AddIPs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		node  string
		eni   string
		addrs []netip.Addr
		err   error
	}{
		{"ok", "node-a", "eni-1", ips("10.0.1.20", "10.0.1.21"), nil},
		{"empty batch", "node-a", "eni-1", nil, nil},
		{"ipv4-mapped folds", "node-a", "eni-1", ips("::ffff:10.0.1.20"), nil},
		{"unknown node", "node-x", "eni-1", ips("10.0.1.20"), ErrNodeNotFound},
		{"unknown eni", "node-a", "eni-x", ips("10.0.1.20"), ErrENINotFound},
		{"empty eni", "node-a", "", ips("10.0.1.20"), ErrInvalidArgument},
		{"zero addr", "node-a", "eni-1", []netip.Addr{{}}, ErrInvalidArgument},
		{"multicast", "node-a", "eni-1", ips("224.0.0.1"), ErrInvalidArgument},
		{"twice in batch", "node-a", "eni-1", ips("10.0.1.20", "10.0.1.20"), ErrInvalidArgument},
		{"already on eni", "node-a", "eni-1", ips("10.0.1.20", "10.0.1.10"), ErrIPExists},
		{"already on other eni", "node-a", "eni-2", ips("10.0.1.10"), ErrIPExists},
		{"mapped duplicate", "node-a", "eni-1", ips("::ffff:10.0.1.10"), ErrIPExists},
		{"primary", "node-a", "eni-1", ips("10.0.2.2"), ErrIPExists},
		{"on other node", "node-a", "eni-1", ips("10.0.1.30"), ErrIPExists},
		{"cross-subnet must be assigned", "node-a", "eni-1", ips("10.0.9.9"), ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fixture(t, DefaultConfig())
			must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10"), t0))
			must(t, s.AddNode("node-b"))
			must(t, s.AddENI("node-b", eni("eni-3", "sbn-1", "10.0.1.0/24", "10.0.1.3")))
			must(t, s.AddIPs("node-b", "eni-3", ips("10.0.1.30"), t0))
			before, _ := s.Snapshot("node-a")
			err := s.AddIPs(tc.node, tc.eni, tc.addrs, t0.Add(time.Second))
			wantErr(t, err, tc.err)
			after, _ := s.Snapshot("node-a")
			if err != nil {
				sameState(t, before, after)
			} else {
				st, _ := s.Stats("node-a", t0.Add(time.Second))
				if st.Idle != 1+len(tc.addrs) || st.Cooling != 0 {
					t.Fatalf("stats = %+v", st)
				}
			}
			check(t, s)
		})
	}
}

func TestStore_AddAssignedIP(t *testing.T) {
	for _, tc := range []struct {
		name  string
		addr  string
		owner Owner
		cross bool
		err   error
	}{
		{"fixed ip", "10.0.1.50", owner("web-0", "c1"), false, nil},
		{"cross-subnet", "10.9.0.5", owner("web-0", "c1"), true, nil},
		{"pod holds another", "10.0.1.50", owner("p", "c9"), false, ErrPodHasIP},
		{"exists", "10.0.1.10", owner("web-0", "c1"), false, ErrIPExists},
		{"bad owner", "10.0.1.50", Owner{Name: "x"}, false, ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fixture(t, DefaultConfig())
			must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10"), t0))
			_, err := s.Allocate("node-a", Request{Owner: owner("p", "c")}, t0)
			must(t, err)
			info, err := s.AddAssignedIP("node-a", "eni-1", ip(tc.addr), tc.owner, t0)
			wantErr(t, err, tc.err)
			check(t, s)
			if err != nil {
				return
			}
			if info.State != StateAssigned || info.Owner != tc.owner || info.CrossSubnet != tc.cross {
				t.Fatalf("info = %+v", info)
			}
			got, err := s.LookupPod("node-a", tc.owner.Pod())
			must(t, err)
			if got.Addr != ip(tc.addr) {
				t.Fatalf("lookup = %+v", got)
			}
		})
	}
}

func TestStore_RemoveIP(t *testing.T) {
	s := fixture(t, DefaultConfig())
	must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10", "10.0.1.11", "10.0.1.12"), t0))
	a, err := s.Allocate("node-a", Request{Owner: owner("p", "c")}, t0)
	must(t, err)
	held, err := s.Hold("node-a", ips("10.0.1.12"), HoldReleasing)
	must(t, err)
	if len(held) != 1 {
		t.Fatalf("held = %v", held)
	}
	for _, tc := range []struct {
		addr  netip.Addr
		state IPState
		err   error
	}{
		{a.Addr, StateAssigned, nil}, // the cloud deleted it: the store must follow
		{ip("10.0.1.12"), StateHeld, nil},
		{ip("10.0.1.11"), StateIdle, nil},
		{ip("10.0.1.11"), 0, ErrUnknownIP},
		{netip.Addr{}, 0, ErrInvalidArgument},
	} {
		got, err := s.RemoveIP("node-a", tc.addr)
		wantErr(t, err, tc.err)
		if err == nil && got.State != tc.state {
			t.Fatalf("removed %s in state %s, want %s", tc.addr, got.State, tc.state)
		}
		check(t, s)
	}
	if _, err := s.LookupPod("node-a", a.Owner.Pod()); !errors.Is(err, ErrUnknownIP) {
		t.Fatalf("pod of removed ip still found: %v", err)
	}
	if st, _ := s.Stats("node-a", t0); st.Total != 0 {
		t.Fatalf("stats = %+v", st)
	}
}
