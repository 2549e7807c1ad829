package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/cce-ipam/sharded/shard"
)

// errCheckFailed is run's answer when check found the ring unhealthy; the
// failed conditions are printed already, one a line.
var errCheckFailed = errors.New("check failed")

// checkRing is the verdict of `ipamctl check` on one replica's view: nil
// when exactly replicas members are live (replicas 0: every member the
// replica knows), every partition and node is held and the replica's own
// Lease is valid; else every failed condition, each on its own. A pending
// rebalance is no failure: the ring is served meanwhile.
func checkRing(st shard.Status, replicas int) []string {
	var failed []string
	live := liveMembers(st)
	want := replicas
	if want == 0 {
		want = len(st.Members)
	}
	if live != want {
		failed = append(failed, fmt.Sprintf("live members: %d, want %d (%s sees %s)", live, want, st.Self, memberList(st)))
	}
	if st.Unowned != 0 {
		failed = append(failed, fmt.Sprintf("partitions without an owner: %d of %d", st.Unowned, st.Partitions))
	}
	if st.UnownedNodes != 0 {
		failed = append(failed, fmt.Sprintf("nodes without an owner: %d", st.UnownedNodes))
	}
	if !st.LeaseValid {
		failed = append(failed, fmt.Sprintf("the lease of %s is not valid", st.Self))
	}
	return failed
}

// liveMembers counts the members that are live and not leaving.
func liveMembers(st shard.Status) int {
	live := 0
	for _, m := range st.Members {
		if m.Live && !m.Leaving {
			live++
		}
	}
	return live
}

// memberList names the members and their state: "a (live), b (dead)".
func memberList(st shard.Status) string {
	if len(st.Members) == 0 {
		return "no members"
	}
	out := ""
	for i, m := range st.Members {
		state := "dead"
		switch {
		case m.Leaving:
			state = "leaving"
		case m.Live:
			state = "live"
		}
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf("%s (%s)", m.Name, state)
	}
	return out
}

// printCheck writes the verdict: "ok: N members, P partitions held", or
// each failed condition on its own line and errCheckFailed.
func printCheck(w io.Writer, failed []string, st shard.Status) error {
	if len(failed) == 0 {
		_, err := fmt.Fprintf(w, "ok: %d members, %d partitions held\n", liveMembers(st), st.Partitions)
		return err
	}
	for _, f := range failed {
		fmt.Fprintf(w, "FAIL: %s\n", f)
	}
	return errCheckFailed
}
