package shard

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The fenced ownership of partitions, as a pure state machine (see
// DESIGN.md). One Ownership runs in each replica. It takes every
// observation the driver makes (a View of the ring's wishes, the claims in
// the API server, the replicas in view, the budget and the nodes still
// stopping; the outcome of each renewal of its own lease and of each claim)
// and returns the Actions to carry out: claim or release a partition by
// compare-and-swap, start or stop serving its nodes, release a claim left
// behind. It decides when claims are held back (the budget, the fencing
// policy, a cold start settling) and what a lapsed lease fences. It performs
// no I/O and reads no clock: time comes in as View.Now and as the renewal's
// send time.

// PartitionState is one partition's state inside one replica.
type PartitionState uint8

const (
	// Unowned: this replica neither serves nor claims the partition.
	Unowned PartitionState = iota
	// Claiming: a CAS of the partition's claim to this replica is in flight.
	Claiming
	// Serving: the claim is ours; the nodes are rebuilt and served.
	Serving
	// Draining: the ring moved the partition away (or our lease is at risk);
	// in-flight work finishes, then the claim is released.
	Draining
)

func (s PartitionState) String() string {
	switch s {
	case Unowned:
		return "unowned"
	case Claiming:
		return "claiming"
	case Serving:
		return "serving"
	case Draining:
		return "draining"
	}
	return fmt.Sprintf("PartitionState(%d)", uint8(s))
}

// legal lists the transitions; anything else is a bug in the driver.
var legal = map[PartitionState][]PartitionState{
	Unowned:  {Claiming},
	Claiming: {Serving, Unowned},
	Serving:  {Draining, Unowned},
	Draining: {Unowned},
}

// transition checks a state change.
func transition(from, to PartitionState) error {
	if slices.Contains(legal[from], to) {
		return nil
	}
	return fmt.Errorf("ownership: illegal transition %s → %s", from, to)
}

// Claim is a partition's claim object as read from the API server.
type Claim struct {
	Holder string // "" when released
	// Version is the object's resourceVersion: a CAS names it.
	Version string
	// Epoch is the claim's spec.leaseTransitions, incremented by every
	// claim and release CAS: with Holder, the fencing token of the weps
	// written under the claim.
	Epoch int64
}

// View is what the driver observed, at Now.
type View struct {
	Now time.Time
	// Wanted is the ring's owner of each partition over the live replicas
	// ("" while there is no ring).
	Wanted []string
	// Claims is each partition's claim.
	Claims []Claim
	// Expired reports, for another replica, whether its lease has been
	// seen unrenewed for a full lease duration (it may be taken over).
	Expired func(replica string) bool
	// Live are the ring's members.
	Live []string
	// InView are the replicas this one knows of, ring members or not (by
	// gossip, by a fresh Lease), as sorted, distinct strings: a cold start
	// waits until they stop changing.
	InView []string
	// BudgetHeld: this replica holds a share of the cloud budget (or there
	// is none to split). Without one it could not rebuild what it claims.
	BudgetHeld bool
	// PolicyHold, when not "", is why claims must wait for the fencing
	// policy (it is required and missing).
	PolicyHold string
	// Busy reports the partitions whose nodes have not all stopped yet.
	Busy func(p int) bool
}

// ActionKind says what an Action asks of the driver.
type ActionKind uint8

const (
	// ActClaim: CAS the claim from Version to this replica, then report
	// with ClaimResult.
	ActClaim ActionKind = iota + 1
	// ActServe: rebuild and serve the partition's nodes.
	ActServe
	// ActStop: stop serving the partition's nodes (wait for in-flight
	// calls); the next Views report them Busy until they have stopped.
	ActStop
	// ActRelease: CAS the claim from Version to "" (nobody): a drained
	// partition is handed over.
	ActRelease
	// ActReleaseOrphan: CAS to "" a claim that still names this replica
	// although it serves the partition no more and the ring gives it to
	// another; report with OrphanReleased.
	ActReleaseOrphan
)

func (k ActionKind) String() string {
	return [...]string{"?", "claim", "serve", "stop", "release", "release-orphan"}[k]
}

// Action is one step for the driver.
type Action struct {
	Kind      ActionKind
	Partition int
	Version   string // for claim and release
	// Fenced: a stop because the partition may no longer be served here
	// (the lease is at risk, the claim is someone else's), not a drain.
	Fenced bool
}

// OwnershipConfig shapes one replica's Ownership.
type OwnershipConfig struct {
	Self       string
	Partitions int
	// ColdStartSettle holds back the first claims of a cold start until
	// the replicas in view have not changed for this long (0: no hold).
	ColdStartSettle time.Duration
	// SettleCap bounds that hold, from Start: a replica in view that never
	// becomes a ring member does not hold the others forever.
	SettleCap time.Duration
	// Start is when the replica started, by its clock.
	Start time.Time
}

// Ownership is one replica's ownership state machine.
type Ownership struct {
	cfg    OwnershipConfig
	states []PartitionState
	// leaseValidUntil: last successful renewal (as sent) + renew deadline.
	leaseValidUntil time.Time
	hold            string // why claims are held back ("" when they are not)
	settleKey       string // the replicas in view, as of settleSince
	settleSince     time.Time
	wantedSince     map[int]time.Time // the ring gave us the partition; not served yet
	releasing       map[int]bool      // orphaned claims being released
}

// NewOwnership starts with every partition Unowned and no lease.
func NewOwnership(cfg OwnershipConfig) *Ownership {
	return &Ownership{
		cfg:         cfg,
		states:      make([]PartitionState, cfg.Partitions),
		wantedSince: map[int]time.Time{},
		releasing:   map[int]bool{},
	}
}

// State returns a partition's state.
func (o *Ownership) State(p int) PartitionState { return o.states[p] }

// States returns a copy of every partition's state.
func (o *Ownership) States() []PartitionState { return slices.Clone(o.states) }

// LeaseValidUntil is when this replica must stop serving if its lease is
// not renewed again: last successful renewal + renew deadline, by this
// replica's clock. It is shorter than the lease duration others wait for,
// which is what fences a paused or cut-off replica.
func (o *Ownership) LeaseValidUntil() time.Time { return o.leaseValidUntil }

// Hold is why claims are held back as of the last Step ("" when they are
// not).
func (o *Ownership) Hold() string { return o.hold }

// CanServe is the check on the allocation path: the partition is ours and
// our lease is still valid at now. An allocation that fails it must not
// touch the node.
func (o *Ownership) CanServe(p int, now time.Time) bool {
	return o.states[p] == Serving && now.Before(o.leaseValidUntil)
}

// Renewed reports a successful renewal of this replica's lease, sent at
// sent and valid until until. A renewal sent after the lease had lapsed (a
// pause, a cut-off) must not make the old claims servable again: others may
// have taken them while our view still shows them as ours. So every Serving
// or Draining partition is fenced (Unowned, nothing released: each must be
// won again by CAS, which fails if anyone took it), and only then is the
// lease valid again. It returns the partitions fenced.
func (o *Ownership) Renewed(sent, until time.Time) (lapsed bool, fenced []int) {
	lapsed = !o.leaseValidUntil.IsZero() && !sent.Before(o.leaseValidUntil)
	if lapsed {
		for p, st := range o.states {
			if st == Serving || st == Draining {
				o.states[p] = Unowned
				fenced = append(fenced, p)
			}
		}
	}
	if until.After(o.leaseValidUntil) { // the first lease, or a timely renewal
		o.leaseValidUntil = until
	}
	return lapsed, fenced
}

// DropLease gives the lease up (the leave timed out): nothing may be served
// from here on.
func (o *Ownership) DropLease() { o.leaseValidUntil = time.Time{} }

// Step compares the view with the local states and returns the actions to
// take. It changes states only where no I/O is needed; the driver reports
// the outcome of claims with ClaimResult and of orphan releases with
// OrphanReleased.
func (o *Ownership) Step(v View) ([]Action, error) {
	n := len(o.states)
	if len(v.Wanted) != n || len(v.Claims) != n {
		return nil, fmt.Errorf("ownership: view has %d/%d partitions, want %d", len(v.Wanted), len(v.Claims), n)
	}
	o.hold = o.holdReason(v)
	wanted := o.trackWanted(v)
	leaseOK := v.Now.Before(o.leaseValidUntil)
	var acts []Action
	for p, st := range o.states {
		a, err := o.stepPartition(p, st, v.Claims[p], wanted[p] == o.cfg.Self, leaseOK, v.Expired)
		if err != nil {
			return nil, err
		}
		if a.Kind != 0 {
			acts = append(acts, a)
		}
	}
	for p, st := range o.states {
		if st == Draining && !busy(v, p) {
			// Drained: release, so the new owner need not wait for our
			// lease to expire (a graceful hand-over).
			if err := o.set(p, Unowned); err != nil {
				return nil, err
			}
			acts = append(acts, Action{
				Kind:      ActRelease,
				Partition: p,
				Version:   v.Claims[p].Version,
			})
		}
	}
	return append(acts, o.orphans(v, leaseOK)...), nil
}

// stepPartition is Step for one partition: claim what the ring gives us
// and nobody (alive) holds; stop what is fenced or moved away.
func (o *Ownership) stepPartition(p int, st PartitionState, claim Claim, mine, leaseOK bool,
	expired func(string) bool) (Action, error) {
	switch st {
	case Unowned:
		free := claim.Holder == "" || (claim.Holder != o.cfg.Self && expired != nil && expired(claim.Holder))
		if leaseOK && mine && (free || claim.Holder == o.cfg.Self) {
			act := Action{
				Kind:      ActClaim,
				Partition: p,
				Version:   claim.Version,
			}
			return act, o.set(p, Claiming)
		}
	case Serving:
		switch {
		case !leaseOK || claim.Holder != o.cfg.Self:
			// Fenced: stop at once; the claim is (or will be) taken over
			// after our lease expires, nothing to release.
			stop := Action{
				Kind:      ActStop,
				Partition: p,
				Fenced:    true,
			}
			return stop, o.set(p, Unowned)
		case !mine:
			drain := Action{
				Kind:      ActStop,
				Partition: p,
				Version:   claim.Version,
			}
			return drain, o.set(p, Draining)
		}
	}
	return Action{}, nil
}

func busy(v View, p int) bool { return v.Busy != nil && v.Busy(p) }

// holdReason says why this replica must not claim partitions yet, or ""
// when it may:
//   - without a share of the cloud budget it could not rebuild what it claims
//     (the ENI list is a cloud call), and nobody else could serve it either;
//   - while the fencing policy is required and missing;
//   - at a cold start (no live replica but us holds a claim, and we hold
//     nothing), until the replicas in view have been the same for
//     ColdStartSettle: replicas started together then split the nodes once.
//     The wait is capped at SettleCap from our start, so a replica whose
//     Lease is fresh but that never joins gossip does not hold us forever.
//
// Joins into a running cluster never wait.
func (o *Ownership) holdReason(v View) string {
	if !v.BudgetHeld {
		return "waiting for a share of the BCE budget"
	}
	if v.PolicyHold != "" {
		return v.PolicyHold
	}
	if o.cfg.ColdStartSettle <= 0 {
		return ""
	}
	for _, cl := range v.Claims {
		if cl.Holder != "" && cl.Holder != o.cfg.Self && slices.Contains(v.Live, cl.Holder) {
			return "" // a running cluster: a join takes its part at once
		}
	}
	for _, st := range o.states {
		if st != Unowned {
			return "" // we already took part
		}
	}
	if key := strings.Join(v.InView, ","); key != o.settleKey || o.settleSince.IsZero() {
		o.settleKey, o.settleSince = key, v.Now
	}
	if v.Now.Sub(o.settleSince) < o.cfg.ColdStartSettle && v.Now.Sub(o.cfg.Start) < o.cfg.SettleCap {
		return "cold start: waiting for the replicas to settle"
	}
	return ""
}

// trackWanted returns the ring's wishes with our unowned partitions left
// out while claims are held back, and records since when each partition
// the ring gives us has waited to be served (HandedOver).
func (o *Ownership) trackWanted(v View) []string {
	wanted := v.Wanted
	if o.hold != "" {
		wanted = slices.Clone(wanted)
		for p := range wanted {
			if wanted[p] == o.cfg.Self && o.states[p] == Unowned {
				wanted[p] = ""
			}
		}
	}
	for p := range wanted {
		if wanted[p] == o.cfg.Self && o.states[p] != Serving {
			if _, ok := o.wantedSince[p]; !ok {
				o.wantedSince[p] = v.Now
			}
		} else if wanted[p] != o.cfg.Self {
			delete(o.wantedSince, p)
		}
	}
	return wanted
}

// HandedOver returns, for each partition the ring gave us that is now
// Serving, how long the hand-over took (from the ring's wish until now,
// when its nodes are served), and forgets it.
func (o *Ownership) HandedOver(now time.Time) []time.Duration {
	var out []time.Duration
	for p, since := range o.wantedSince {
		if o.states[p] == Serving {
			out = append(out, now.Sub(since))
			delete(o.wantedSince, p)
		}
	}
	return out
}

// orphans releases claims that still name this replica although it does
// not serve them: a fenced stop (a lapsed lease, a lost CAS race) leaves
// the claim in place, and if the ring has meanwhile given the partition to
// another replica, nobody else may take it while our lease is fresh.
// Released only once the partition's nodes have stopped, and only while
// our lease is valid (the release is a write under our name).
func (o *Ownership) orphans(v View, leaseOK bool) []Action {
	if !leaseOK {
		return nil
	}
	var acts []Action
	for p, cl := range v.Claims {
		if cl.Holder != o.cfg.Self || o.states[p] != Unowned || busy(v, p) || o.releasing[p] || v.Wanted[p] == o.cfg.Self {
			continue
		}
		o.releasing[p] = true
		acts = append(acts, Action{
			Kind:      ActReleaseOrphan,
			Partition: p,
			Version:   cl.Version,
		})
	}
	return acts
}

// OrphanReleased reports that the release of an orphaned claim is done
// (won or not: the next Step decides again).
func (o *Ownership) OrphanReleased(p int) { delete(o.releasing, p) }

// Releasing reports whether any orphan release is in flight.
func (o *Ownership) Releasing() bool { return len(o.releasing) > 0 }

// ClaimResult reports a claim's CAS: won means the claim now names us.
// A won claim moves to Serving and asks the driver to serve.
func (o *Ownership) ClaimResult(p int, won bool) ([]Action, error) {
	if o.states[p] != Claiming {
		return nil, fmt.Errorf("ownership: claim result for partition %d in state %s", p, o.states[p])
	}
	if !won {
		return nil, o.set(p, Unowned)
	}
	if err := o.set(p, Serving); err != nil {
		return nil, err
	}
	return []Action{{Kind: ActServe, Partition: p}}, nil
}

// Serving lists the partitions in state Serving.
func (o *Ownership) Serving() []int {
	var out []int
	for p, st := range o.states {
		if st == Serving {
			out = append(out, p)
		}
	}
	return out
}

func (o *Ownership) set(p int, to PartitionState) error {
	if err := transition(o.states[p], to); err != nil {
		return fmt.Errorf("partition %d: %w", p, err)
	}
	o.states[p] = to
	return nil
}
