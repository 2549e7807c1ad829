package datastore

import (
	"testing"
)

func TestStore_AddHeldIP(t *testing.T) {
	s := fixture(t, DefaultConfig())
	info, err := s.AddHeldIP("node-a", "eni-1", ip("10.0.1.30"), HoldOrphan, t0)
	must(t, err)
	if info.State != StateHeld || info.HoldReason != HoldOrphan || info.ENIID != "eni-1" {
		t.Fatalf("added %+v, want held orphan on eni-1", info)
	}
	check(t, s)
	// Never allocated.
	_, err = s.Allocate("node-a", Request{Owner: owner("p", "c1")}, t0)
	wantErr(t, err, ErrNoIdleIP)
	st, _ := s.Stats("node-a", t0)
	if st.Held != 1 || st.Total != 1 || st.Idle != 0 {
		t.Fatalf("stats %+v, want one held of one", st)
	}

	before, _ := s.Snapshot("node-a")
	for name, tc := range map[string]struct {
		eni  string
		addr string
		why  HoldReason
		err  error
	}{
		"duplicate":       {"eni-2", "10.0.1.30", HoldOrphan, ErrIPExists},
		"primary":         {"eni-1", "10.0.1.2", HoldOrphan, ErrIPExists},
		"cross subnet":    {"eni-1", "10.9.0.1", HoldOrphan, ErrInvalidArgument},
		"unknown eni":     {"eni-9", "10.0.1.31", HoldOrphan, ErrENINotFound},
		"empty eni":       {"", "10.0.1.31", HoldOrphan, ErrInvalidArgument},
		"bad reason":      {"eni-1", "10.0.1.31", HoldReleasing, ErrInvalidArgument},
		"no reason":       {"eni-1", "10.0.1.31", HoldNone, ErrInvalidArgument},
		"unspecified":     {"eni-1", "0.0.0.0", HoldOrphan, ErrInvalidArgument},
		"unknown node":    {"eni-1", "10.0.1.31", HoldInUse, ErrNodeNotFound},
		"multicast addr":  {"eni-1", "224.0.0.1", HoldInUse, ErrInvalidArgument},
		"reason too high": {"eni-1", "10.0.1.31", HoldReason(99), ErrInvalidArgument},
	} {
		t.Run(name, func(t *testing.T) {
			node := "node-a"
			if name == "unknown node" {
				node = "node-z"
			}
			_, err := s.AddHeldIP(node, tc.eni, ip(tc.addr), tc.why, t0)
			wantErr(t, err, tc.err)
		})
	}
	after, _ := s.Snapshot("node-a")
	sameState(t, before, after)
	check(t, s)

	// A claimant appears: Unhold gives it the address.
	got, err := s.Unhold("node-a", ip("10.0.1.30"), new(owner("p", "c1")), t0)
	must(t, err)
	if got.State != StateAssigned {
		t.Fatalf("after Unhold: %+v", got)
	}
	check(t, s)
}

func TestStore_HoldInUse(t *testing.T) {
	s := fixture(t, DefaultConfig())
	must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10", "10.0.1.11", "10.0.1.12", "10.0.1.13", "10.0.1.14"), t0))
	_, err := s.AllocateSpecific("node-a", ip("10.0.1.11"), owner("old", "c1"))
	must(t, err)
	_, err = s.AllocateSpecific("node-a", ip("10.0.1.14"), owner("other", "c9"))
	must(t, err)
	_, err = s.AddHeldIP("node-a", "eni-1", ip("10.0.1.20"), HoldOrphan, t0)
	must(t, err)
	_, err = s.Hold("node-a", ips("10.0.1.12"), HoldUnsettled)
	must(t, err)
	_, err = s.Hold("node-a", ips("10.0.1.13"), HoldReleasing)
	must(t, err)
	oldPod := owner("old", "c1").Pod()

	for _, tc := range []struct {
		addr string
		was  IPState
		pod  PodKey
		err  error
	}{
		{"10.0.1.14", StateAssigned, oldPod, ErrChanged}, // assigned to another pod than seen
		{"10.0.1.11", StateIdle, PodKey{}, ErrChanged},   // assigned since it was read idle
		{"10.0.1.10", StateIdle, PodKey{}, nil},
		{"10.0.1.11", StateAssigned, oldPod, nil},
		{"10.0.1.20", StateHeld, PodKey{}, nil}, // orphan
		{"10.0.1.12", StateHeld, PodKey{}, nil}, // unsettled: a pod's use proves it is there
		{"10.0.1.10", StateIdle, PodKey{}, nil}, // again: no change
		{"10.0.1.13", StateHeld, PodKey{}, ErrHeld},
		{"10.0.1.99", StateIdle, PodKey{}, ErrUnknownIP},
	} {
		before, _ := s.Snapshot("node-a")
		err := s.HoldInUse("node-a", ip(tc.addr), tc.was, tc.pod)
		wantErr(t, err, tc.err)
		if err != nil {
			after, _ := s.Snapshot("node-a")
			sameState(t, before, after)
		}
		check(t, s)
	}
	for _, addr := range []string{"10.0.1.10", "10.0.1.11", "10.0.1.20", "10.0.1.12"} {
		info, err := s.LookupIP(ip(addr))
		must(t, err)
		if info.State != StateHeld || info.HoldReason != HoldInUse {
			t.Fatalf("%s is %s/%s, want held in_use", addr, info.State, info.HoldReason)
		}
	}
	// The old owner no longer holds anything: its pod may take another.
	if _, err := s.LookupPod("node-a", oldPod); err == nil {
		t.Fatal("the pod still holds the address it lost")
	}
	// Nothing idle is left to hand out.
	_, err = s.Allocate("node-a", Request{Owner: owner("new", "c2")}, t0)
	wantErr(t, err, ErrNoIdleIP)
	// A DEL of the old sandbox does not free it.
	_, err = s.Release("node-a", ip("10.0.1.11"), "c1", t0)
	wantErr(t, err, ErrHeld)

	// The pod went: back to the pool, cooling.
	info, err := s.Unhold("node-a", ip("10.0.1.11"), nil, t0)
	must(t, err)
	if info.State != StateIdle || !info.Cooling(t0) {
		t.Fatalf("after Unhold: %+v, want idle and cooling", info)
	}
	check(t, s)
}

func TestStore_HoldInUse_CrossSubnet(t *testing.T) {
	s := fixture(t, DefaultConfig())
	o := owner("psts", "c1")
	_, err := s.AddAssignedIP("node-a", "eni-1", ip("10.9.0.5"), o, t0)
	must(t, err)
	before, _ := s.Snapshot("node-a")
	wantErr(t, s.HoldInUse("node-a", ip("10.9.0.5"), StateAssigned, o.Pod()), ErrInvalidArgument)
	after, _ := s.Snapshot("node-a")
	sameState(t, before, after)
}
