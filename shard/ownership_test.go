package shard

import (
	"testing"
	"time"
)

const testPartitions = 7

var ownStart = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// newTestOwnership is r0's Ownership with a 2 s cold-start settle, capped
// at 8 s, and a lease valid for an hour.
func newTestOwnership() *Ownership {
	o := NewOwnership(OwnershipConfig{
		Self:            "r0",
		Partitions:      testPartitions,
		ColdStartSettle: 2 * time.Second,
		SettleCap:       8 * time.Second,
		Start:           ownStart,
	})
	o.Renewed(ownStart, ownStart.Add(time.Hour))
	return o
}

// holdAt steps o with nothing wanted (no state changes) and returns its hold.
func holdAt(t *testing.T, o *Ownership, now time.Time, live, inView []string, claims []Claim) string {
	t.Helper()
	if claims == nil {
		claims = make([]Claim, testPartitions)
	}
	if _, err := o.Step(View{
		Now: now, Wanted: make([]string, testPartitions), Claims: claims,
		Live: live, InView: inView, BudgetHeld: true,
	}); err != nil {
		t.Fatal(err)
	}
	return o.Hold()
}

// At a cold start a replica claims nothing until the replicas in view have
// been the same for ColdStartSettle (replicas started together then split
// the nodes once).
func TestOwnership_ColdStartHoldsClaimsUntilSettled(t *testing.T) {
	o := newTestOwnership()
	now := ownStart
	if h := holdAt(t, o, now, []string{"r0"}, []string{"r0"}, nil); h == "" {
		t.Fatal("a replica alone at its start claimed at once")
	}
	now = now.Add(time.Second)
	// r1's Lease appears (gossip has not seen it yet): the view changed.
	if h := holdAt(t, o, now, []string{"r0"}, []string{"r0", "r1(lease)"}, nil); h == "" {
		t.Fatal("claimed while another replica's Lease had just appeared")
	}
	now = now.Add(1500 * time.Millisecond) // 2.5 s from the start, 1.5 s from the change
	if h := holdAt(t, o, now, []string{"r0"}, []string{"r0", "r1(lease)"}, nil); h == "" {
		t.Fatal("claimed 1.5 s after the view changed (settle is 2 s)")
	}
	// Gossip now sees r1 too: it is live, the view changes once more.
	if h := holdAt(t, o, now, []string{"r0", "r1"}, []string{"r0", "r1"}, nil); h == "" {
		t.Fatal("claimed as r1 became live")
	}
	now = now.Add(2100 * time.Millisecond)
	if h := holdAt(t, o, now, []string{"r0", "r1"}, []string{"r0", "r1"}, nil); h != "" {
		t.Fatalf("still holding after the view was stable for the settle time: %s", h)
	}
}

// A view that never settles holds claims back only up to the cap.
func TestOwnership_ColdStartHoldIsCapped(t *testing.T) {
	o := newTestOwnership()
	for i := 0; ; i++ {
		now := ownStart.Add(time.Duration(i) * 500 * time.Millisecond)
		inView := []string{"r0"}
		if i%2 == 1 {
			inView = append(inView, "flapping(lease)")
		}
		if h := holdAt(t, o, now, []string{"r0"}, inView, nil); h == "" {
			if el := now.Sub(ownStart); el < 8*time.Second {
				t.Fatalf("claimed after %s although the view kept changing", el)
			}
			return
		}
		if el := now.Sub(ownStart); el > 9*time.Second {
			t.Fatalf("still holding after %s: the cap did not apply", el)
		}
	}
}

// Joining a running cluster (a live replica holds a claim) does not wait;
// no budget share or a missing required fencing policy always holds.
func TestOwnership_HoldsForBudgetAndPolicyNotForAJoin(t *testing.T) {
	o := newTestOwnership()
	running := make([]Claim, testPartitions)
	running[3] = Claim{Holder: "r1", Version: "5"}
	if h := holdAt(t, o, ownStart, []string{"r0", "r1"}, []string{"r0", "r1"}, running); h != "" {
		t.Fatalf("a replica joining a running cluster held its claims: %s", h)
	}
	v := View{
		Now: ownStart, Wanted: make([]string, testPartitions), Claims: running,
		Live: []string{"r0", "r1"}, InView: []string{"r0", "r1"},
	}
	if _, err := o.Step(v); err != nil || o.Hold() == "" {
		t.Fatalf("claimed without a share of the cloud budget (err %v)", err)
	}
	v.BudgetHeld, v.PolicyHold = true, "fencing policy missing"
	if _, err := o.Step(v); err != nil || o.Hold() != "fencing policy missing" {
		t.Fatalf("hold with the policy required and missing = %q (err %v)", o.Hold(), err)
	}
}

// A renewal after a lapse fences every partition served or draining, and
// only a later Step claims them again; a timely renewal fences nothing.
func TestOwnership_RenewedAfterLapseFences(t *testing.T) {
	o := NewOwnership(OwnershipConfig{Self: "r0", Partitions: testPartitions})
	const deadline = 4 * time.Second
	o.Renewed(ownStart, ownStart.Add(deadline))
	for _, p := range []int{1, 2} {
		if err := o.set(p, Claiming); err != nil {
			t.Fatal(err)
		}
		if err := o.set(p, Serving); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.set(2, Draining); err != nil {
		t.Fatal(err)
	}
	sent := ownStart.Add(time.Second)
	if lapsed, fenced := o.Renewed(sent, sent.Add(deadline)); lapsed || len(fenced) != 0 {
		t.Fatalf("a timely renewal: lapsed %v, fenced %v", lapsed, fenced)
	}
	sent = sent.Add(deadline + time.Second) // paused past the deadline
	lapsed, fenced := o.Renewed(sent, sent.Add(deadline))
	if !lapsed || len(fenced) != 2 || o.State(1) != Unowned || o.State(2) != Unowned {
		t.Fatalf("a renewal after a lapse: lapsed %v, fenced %v, states %v", lapsed, fenced, o.States())
	}
	if !o.LeaseValidUntil().Equal(sent.Add(deadline)) || o.CanServe(1, sent) {
		t.Fatal("after the lapse the lease must be valid again and the old claims not servable")
	}
}
