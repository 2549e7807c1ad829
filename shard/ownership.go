package shard

import (
	"fmt"
	"slices"
	"time"
)

// The fenced ownership of partitions, as a pure state machine (see
// DESIGN.md). One Ownership runs in each replica. It reads a View of the
// world (the ring's wishes, the partition claims in the API server, its own
// lease) and returns the Actions to carry out: claim or release a partition
// by compare-and-swap in the API server, and start or stop serving its nodes.
// It performs no I/O and reads no clock; the driver does both.

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
	// Wanted is the ring's owner of each partition over the live replicas.
	Wanted []string
	// Claims is each partition's claim.
	Claims []Claim
	// Expired reports, for another replica, whether its lease has been
	// seen unrenewed for a full lease duration (it may be taken over).
	Expired func(replica string) bool
	// LeaseValidUntil is when this replica must stop serving if its own
	// lease is not renewed again: last successful renewal + renew deadline,
	// by this replica's clock. It is shorter than the lease duration others
	// wait for, which is what fences a paused or cut-off replica.
	LeaseValidUntil time.Time
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
	// calls), then report with Stopped.
	ActStop
	// ActRelease: CAS the claim from Version to "" (nobody).
	ActRelease
)

func (k ActionKind) String() string {
	return [...]string{"?", "claim", "serve", "stop", "release"}[k]
}

// Action is one step for the driver.
type Action struct {
	Kind      ActionKind
	Partition int
	Version   string // for claim and release
}

// Ownership is one replica's ownership state machine.
type Ownership struct {
	self   string
	states []PartitionState
}

// NewOwnership starts with every partition Unowned.
func NewOwnership(self string, partitions int) *Ownership {
	return &Ownership{self: self, states: make([]PartitionState, partitions)}
}

// State returns a partition's state.
func (o *Ownership) State(p int) PartitionState { return o.states[p] }

// CanServe is the check on the allocation path: the partition is ours and
// our lease is still valid at now. An allocation that fails it must not
// touch the node.
func (o *Ownership) CanServe(p int, now time.Time, leaseValidUntil time.Time) bool {
	return o.states[p] == Serving && now.Before(leaseValidUntil)
}

// Step compares the view with the local states and returns the actions to
// take. It changes states only where no I/O is needed; the driver reports
// the outcome of claims and stops with ClaimResult and Stopped.
func (o *Ownership) Step(v View) ([]Action, error) {
	if len(v.Wanted) != len(o.states) || len(v.Claims) != len(o.states) {
		return nil, fmt.Errorf("ownership: view has %d/%d partitions, want %d", len(v.Wanted), len(v.Claims), len(o.states))
	}
	leaseOK := v.Now.Before(v.LeaseValidUntil)
	var acts []Action
	for p, st := range o.states {
		claim := v.Claims[p]
		mine := v.Wanted[p] == o.self
		switch st {
		case Unowned:
			free := claim.Holder == "" || (claim.Holder != o.self && v.Expired != nil && v.Expired(claim.Holder))
			if leaseOK && mine && (free || claim.Holder == o.self) {
				if err := o.set(p, Claiming); err != nil {
					return nil, err
				}
				acts = append(acts, Action{Kind: ActClaim, Partition: p, Version: claim.Version})
			}
		case Serving:
			switch {
			case !leaseOK || claim.Holder != o.self:
				// Fenced: stop at once; the claim is (or will be) taken
				// over after our lease expires, nothing to release.
				if err := o.set(p, Unowned); err != nil {
					return nil, err
				}
				acts = append(acts, Action{Kind: ActStop, Partition: p})
			case !mine:
				if err := o.set(p, Draining); err != nil {
					return nil, err
				}
				acts = append(acts, Action{Kind: ActStop, Partition: p, Version: claim.Version})
			}
		}
	}
	return acts, nil
}

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

// Stopped reports that a draining partition's nodes are no longer served;
// the claim is then released so the new owner need not wait for a lease to
// expire (a graceful hand-over). version is the claim's current version.
func (o *Ownership) Stopped(p int, version string) ([]Action, error) {
	if o.states[p] != Draining {
		return nil, nil // a fenced stop: nothing to release
	}
	if err := o.set(p, Unowned); err != nil {
		return nil, err
	}
	return []Action{{Kind: ActRelease, Partition: p, Version: version}}, nil
}

// fence moves a Serving or Draining partition to Unowned at once: the
// replica's lease lapsed, so it may no longer act on its claims (their nodes
// are stopped by the driver; nothing is released).
func (o *Ownership) fence(p int) error {
	if o.states[p] != Serving && o.states[p] != Draining {
		return fmt.Errorf("ownership: fence of partition %d in state %s", p, o.states[p])
	}
	o.states[p] = Unowned
	return nil
}

// States returns a copy of every partition's state.
func (o *Ownership) States() []PartitionState { return slices.Clone(o.states) }

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
