package datastore

import (
	"strings"
	"testing"
)

// Verify must notice each kind of corruption it promises to: a Verify that
// always said nil would let every other test pass.
func TestStore_Verify_DetectsCorruption(t *testing.T) {
	cases := []struct {
		name    string
		corrupt func(s *Store)
		want    string
	}{
		{"node counter", func(s *Store) { s.nodes["node-a"].n.nIdle++ }, "node node-a: counters"},
		{"eni counter", func(s *Store) { s.nodes["node-a"].n.enis["eni-1"].nAssigned++ }, "node node-a eni eni-1: counters"},
		{"idle owner", func(s *Store) {
			r := s.nodes["node-a"].n.ips[ip("10.0.1.10")]
			r.owner = owner("p", "c")
		}, "idle 10.0.1.10 has owner or hold"},
		{"assigned unindexed", func(s *Store) {
			n := s.nodes["node-a"].n
			delete(n.pods, owner("web", "c1").Pod())
		}, "not indexed under pod"},
		{"cross-subnet flag", func(s *Store) {
			s.nodes["node-a"].n.ips[ip("10.0.1.11")].crossSubnet = true
		}, "cross-subnet"},
		{"heap order", func(s *Store) {
			h := s.nodes["node-a"].n.enis["eni-1"].idle
			h[0], h[1] = h[1], h[0]
			h[0].heapIndex, h[1].heapIndex = 0, 1
		}, "heap order broken"},
		{"ip index", func(s *Store) { delete(s.ipOwner, ip("10.0.1.10")) }, "missing from ip index"},
		{"eni index", func(s *Store) { delete(s.eniOwner, "eni-2") }, "eni eni-2 missing from eni index"},
		{"primary index", func(s *Store) { delete(s.nodes["node-a"].n.primaries, ip("10.0.2.2")) }, "primary 10.0.2.2 not indexed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := fixture(t, DefaultConfig())
			must(t, s.AddIPs("node-a", "eni-1", ips("10.0.1.10", "10.0.1.11", "10.0.1.12"), t0))
			if _, err := s.AllocateSpecific("node-a", ip("10.0.1.12"), owner("web", "c1")); err != nil {
				t.Fatal(err)
			}
			check(t, s)
			tc.corrupt(s)
			err := s.Verify()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Verify() = %v, want a violation mentioning %q", err, tc.want)
			}
		})
	}
}
