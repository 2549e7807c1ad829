package shard

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/podip"
)

// ErrNotOwner is the (retryable) refusal of a call for a node this replica
// does not serve. It is a podip.ErrNotHere, so the CNI server marks it in
// the reply's trailer and a forwarding replica routes the call again.
var ErrNotOwner = podip.NotHere("not the owner of the node")

// snapshot is the ownership loop's state as the CNI path, the cloud gate,
// the router and /shard/status need it, at one moment. It is immutable
// once published: the loop builds a new one after every state change.
type snapshot struct {
	// states is each partition's Ownership state.
	states []PartitionState
	// leaseValidUntil is when this replica must stop serving unless its
	// Lease is renewed again (by its own clock).
	leaseValidUntil time.Time
	// claims are the claims as of the loop's last look (the watch, with our
	// own writes the watch has not shown yet); nil before the first look.
	claims []Claim
	// tokens is the claim each partition's fencing token rests on: our
	// latest write to it, else the claim as looked at.
	tokens []Claim
	// peers are the other replicas' Leases as observed.
	peers map[string]observed
	// live are the ring's members; owners the table they agree on (nil
	// while there is no ring).
	live   []string
	owners []string
	// leaving: this replica is handing its partitions over.
	leaving bool
	// stepped: the loop has run; readyReason is why it is not ready ("" when
	// it is).
	stepped     bool
	readyReason string
}

// Fence answers, without a lock, what this replica may do now: whether it
// may write for a node (MayAct, FenceToken), where a call for a node goes
// (RouteOf), whether its Lease is valid. The Coordinator's loop is its only
// writer: it publishes a new snapshot after every change of its state, and
// a tightening (a fenced partition, a lapsed or dropped lease) before it
// starts anything that depends on it. Readers compare the snapshot's lease
// validity with the clock at the moment they ask, so a snapshot that is not
// replaced in time only ever gets stricter. DESIGN.md has the argument.
//
// It is built before the IPAM and the Coordinator (NewFence), so that both
// can be given it at construction.
type Fence struct {
	self          string
	partitions    int
	leaseDuration time.Duration
	renewDeadline time.Duration
	clock         clock.PassiveClock
	snap          atomic.Pointer[snapshot]
	// shareHeld: this replica holds a share of the BCE budget (or there is
	// no budget to split); written by the budget, read by Gate.
	shareHeld atomic.Bool
}

var (
	_ ipam.Fence      = (*Fence)(nil)
	_ ipam.TokenFence = (*Fence)(nil)
)

// NewFence returns the fence of replica self: closed (nothing owned, no
// lease) until a Coordinator built with it publishes.
func NewFence(cfg Config, self string, clk clock.PassiveClock) *Fence {
	f := &Fence{
		self:          self,
		partitions:    cfg.Ring.Partitions,
		leaseDuration: cfg.LeaseDuration,
		renewDeadline: cfg.RenewDeadline,
		clock:         clk,
	}
	f.snap.Store(&snapshot{
		states:      make([]PartitionState, cfg.Ring.Partitions),
		readyReason: "not started",
	})
	return f
}

// publish replaces the snapshot (the ownership loop only).
func (f *Fence) publish(s *snapshot) { f.snap.Store(s) }

func (f *Fence) load() *snapshot { return f.snap.Load() }

// expired: r's Lease has not changed (or been absent) for a whole
// LeaseDuration on our clock. A replica never seen counts as expired: its
// claim can only be a leftover of a process that is gone.
func (s *snapshot) expired(self, r string, now time.Time, leaseDuration time.Duration) bool {
	if r == self {
		return false
	}
	o, ok := s.peers[r]
	return !ok || now.Sub(o.since) >= leaseDuration
}

// peerExpired is expired on the current snapshot (the budget's view).
func (f *Fence) peerExpired(m string, now time.Time) bool {
	return f.load().expired(f.self, m, now, f.leaseDuration)
}

// GossipSeeds are the gossip addresses of the other replicas whose Leases
// are present, not expired and not leaving: membership joins them as well as
// its seeds and DNS name, so that replicas find each other without CoreDNS
// (whose pods may be waiting for an IP from us).
func (f *Fence) GossipSeeds() []string {
	s := f.load()
	if s == nil {
		return nil
	}
	now := f.clock.Now()
	var out []string
	for m, o := range s.peers {
		if o.gossip != "" && o.version != "" && !o.leaving && !s.expired(f.self, m, now, f.leaseDuration) {
			out = append(out, o.gossip)
		}
	}
	slices.Sort(out)
	return out
}

// peerVersion is the version of m's Lease as last observed ("" absent).
func (f *Fence) peerVersion(m string) string {
	return f.load().peers[m].version
}

// Gate is the cloud client's gate (cloud.WithGate): an attempt goes out only
// while the replica's lease is valid and it holds a share of the budget. The
// Fence is built before the cloud client, so the client gets it at
// construction.
func (f *Fence) Gate() error {
	if !f.LeaseValid() {
		return errors.New("replica lease not valid")
	}
	if !f.shareHeld.Load() {
		return errNoShare
	}
	return nil
}

func (f *Fence) recordShare(held bool) { f.shareHeld.Store(held) }

// LeaseValid reports whether this replica's lease is valid now: the gate of
// every cloud call and write.
func (f *Fence) LeaseValid() bool {
	return f.clock.Now().Before(f.load().leaseValidUntil)
}

// MayAct implements ipam.Fence: writes for the node may go ahead while its
// partition is Serving or Draining (in-flight work finishing) here and our
// lease is valid now.
func (f *Fence) MayAct(node string) (time.Time, error) {
	return f.mayAct(f.load(), PartitionOf(f.partitions, node))
}

func (f *Fence) mayAct(s *snapshot, p int) (time.Time, error) {
	now := f.clock.Now()
	st := s.states[p]
	switch {
	case st != Serving && st != Draining:
		return time.Time{}, fmt.Errorf("%w: partition %d is %s here", ErrNotOwner, p, st)
	case !now.Before(s.leaseValidUntil):
		return time.Time{}, fmt.Errorf("%w: replica lease not renewed within %s", ErrNotOwner, f.renewDeadline)
	}
	return s.leaseValidUntil, nil
}

// FenceToken implements ipam.TokenFence: MayAct's answer, and the claim it
// rests on (the partition, this replica, the claim's epoch), both from one
// snapshot.
func (f *Fence) FenceToken(node string) (ipam.FenceToken, time.Time, error) {
	s := f.load()
	p := PartitionOf(f.partitions, node)
	until, err := f.mayAct(s, p)
	if err != nil {
		return ipam.FenceToken{}, time.Time{}, err
	}
	cl := Claim{}
	if p < len(s.tokens) {
		cl = s.tokens[p]
	}
	if cl.Holder != f.self {
		return ipam.FenceToken{}, time.Time{}, fmt.Errorf("%w: the claim of partition %d names %q", ErrNotOwner, p, cl.Holder)
	}
	tok := ipam.FenceToken{
		Partition: p,
		Holder:    f.self,
		Epoch:     cl.Epoch,
	}
	return tok, until, nil
}

// Route is where a call for a node goes now.
type Route struct {
	Partition int
	// Local: this replica serves the node's partition.
	Local bool
	// Owner and GRPC name the replica holding the claim, when another live
	// one does; empty when the node has no owner at the moment.
	Owner string
	GRPC  string
}

// RouteOf answers the router: local, another replica, or nobody yet.
func (f *Fence) RouteOf(node string) Route {
	p := PartitionOf(f.partitions, node)
	now := f.clock.Now()
	s := f.load()
	r := Route{Partition: p}
	if s.states[p] == Serving && now.Before(s.leaseValidUntil) {
		r.Local = true
		return r
	}
	if p >= len(s.claims) {
		return r // no look taken yet
	}
	holder := s.claims[p].Holder
	if holder == "" || holder == f.self || s.expired(f.self, holder, now, f.leaseDuration) {
		return r
	}
	if o, ok := s.peers[holder]; ok && o.grpc != "" {
		r.Owner, r.GRPC = holder, o.grpc
	}
	return r
}

// ready returns nil when the replica holds its lease and serves every node
// of the partitions it holds; otherwise why not.
func (f *Fence) ready() error {
	s := f.load()
	if !s.stepped {
		return errors.New("ownership loop not started")
	}
	if s.readyReason != "" {
		return errors.New(s.readyReason)
	}
	return nil
}
