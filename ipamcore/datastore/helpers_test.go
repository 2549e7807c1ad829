package datastore

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func ips(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = ip(s)
	}
	return out
}

func owner(name, cid string) Owner { return Owner{Namespace: "default", Name: name, ContainerID: cid} }

func eni(id, subnet, cidr, primary string) ENI {
	e := ENI{ID: id, SubnetID: subnet, PrimaryIP: ip(primary), MAC: "fa:16:3e:00:00:01", Capacity: 8}
	if cidr != "" {
		e.SubnetCIDR = netip.MustParsePrefix(cidr)
	}
	return e
}

// fixture: node-a with eni-1 (10.0.1.0/24) and eni-2 (10.0.2.0/24).
func fixture(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	must(t, s.AddNode("node-a"))
	must(t, s.AddENI("node-a", eni("eni-1", "sbn-1", "10.0.1.0/24", "10.0.1.2")))
	must(t, s.AddENI("node-a", eni("eni-2", "sbn-2", "10.0.2.0/24", "10.0.2.2")))
	return s
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func check(t testing.TB, s *Store) {
	t.Helper()
	if err := s.Verify(); err != nil {
		t.Fatalf("invariants: %v", err)
	}
}

func wantErr(t testing.TB, got, want error) {
	t.Helper()
	if want == nil {
		if got != nil {
			t.Fatalf("unexpected error: %v", got)
		}
		return
	}
	if !errors.Is(got, want) {
		t.Fatalf("error = %v, want %v", got, want)
	}
}

// sameState compares two snapshots (used to prove a failed call changed
// nothing).
func sameState(t testing.TB, before, after NodeSnapshot) {
	t.Helper()
	if a, b := fmt.Sprintf("%+v", before), fmt.Sprintf("%+v", after); a != b {
		t.Fatalf("state changed:\nbefore %s\nafter  %s", a, b)
	}
}

func sprint(v any) string { return fmt.Sprintf("%+v", v) }
