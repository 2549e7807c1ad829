package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/cce-ipam/sharded/shard"
)

func healthy() shard.Status {
	return shard.Status{
		Self: "a", LeaseValid: true, Partitions: 271,
		Members: []shard.MemberStatus{{Name: "a", Live: true}, {Name: "b", Live: true}, {Name: "c", Live: true}},
	}
}

func TestCheckRingVerdict(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mod      func(*shard.Status)
		replicas int
		want     []string // substrings, one per failed line
	}{
		{name: "healthy", replicas: 3},
		{name: "healthy, count from the replica", replicas: 0},
		{name: "balance pending is no failure", replicas: 3, mod: func(s *shard.Status) { s.BalancePending = true }},
		{name: "one dead", replicas: 3, mod: func(s *shard.Status) { s.Members[2].Live = false },
			want: []string{"live members: 2, want 3 (a sees a (live), b (live), c (dead))"}},
		{name: "one dead, count from the replica", mod: func(s *shard.Status) { s.Members[2].Live = false },
			want: []string{"live members: 2, want 3"}},
		{name: "leaving counts as gone", replicas: 3, mod: func(s *shard.Status) { s.Members[1].Leaving = true },
			want: []string{"b (leaving)"}},
		{name: "fewer replicas than the chart's", replicas: 4, want: []string{"live members: 3, want 4"}},
		{name: "everything wrong", replicas: 3, mod: func(s *shard.Status) {
			s.Members = s.Members[:1]
			s.Unowned, s.UnownedNodes, s.LeaseValid = 180, 7, false
		}, want: []string{"live members: 1, want 3", "partitions without an owner: 180 of 271",
			"nodes without an owner: 7", "the lease of a is not valid"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := healthy()
			if tc.mod != nil {
				tc.mod(&st)
			}
			failed := checkRing(st, tc.replicas)
			if len(failed) != len(tc.want) {
				t.Fatalf("failed = %q, want %d lines like %q", failed, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(failed[i], w) {
					t.Errorf("line %d = %q, want it to contain %q", i, failed[i], w)
				}
			}
			var out bytes.Buffer
			err := printCheck(&out, failed, st)
			if len(tc.want) == 0 {
				if err != nil || out.String() != "ok: 3 members, 271 partitions held\n" {
					t.Errorf("printCheck = %q, %v", out.String(), err)
				}
				return
			}
			if !errors.Is(err, errCheckFailed) || strings.Count(out.String(), "\n") != len(tc.want) {
				t.Errorf("printCheck = %q, %v; want one line per failure and errCheckFailed", out.String(), err)
			}
		})
	}
}

func TestCommandNameAsKubectlPlugin(t *testing.T) {
	for argv0, want := range map[string]string{
		"/usr/local/bin/ipamctl":      "ipamctl",
		"/ipamctl":                    "ipamctl",
		"/home/u/bin/kubectl-ipam":    "kubectl ipam",
		"./kubectl-ipam":              "kubectl ipam",
		"/usr/bin/kubectl-ipam_check": "kubectl ipam-check",
	} {
		if got := commandName(argv0); got != want {
			t.Errorf("commandName(%q) = %q, want %q", argv0, got, want)
		}
	}
}

func TestAPIServerRefusal(t *testing.T) {
	forbidden := []byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"services \"x-peers\" is forbidden: User \"u\" cannot get resource \"services/proxy\"","reason":"Forbidden","code":403}`)
	if err := apiServerRefusal(403, forbidden); err == nil || !strings.Contains(err.Error(), "forbidden by the API server (403)") ||
		!strings.Contains(err.Error(), "services/proxy") {
		t.Errorf("403: %v", err)
	}
	noEndpoints := []byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"no endpoints available for service \"x-peers\"","reason":"ServiceUnavailable","code":503}`)
	if err := apiServerRefusal(503, noEndpoints); err == nil || !strings.Contains(err.Error(), "no replica behind the Service (503)") {
		t.Errorf("503: %v", err)
	}
	// A replica's own answer passes the proxy unchanged: not the API server's.
	if err := apiServerRefusal(404, []byte("404 page not found\n")); err != nil {
		t.Errorf("a replica's text was taken for the API server's: %v", err)
	}
}
