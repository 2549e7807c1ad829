package shard

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The ring balances partitions; Ring.Balanced moves partitions so that the
// replicas serve even shares of the nodes. Every replica must balance with
// the same node counts to agree on the table, and counts taken straight from
// each replica's node informer would move partitions whenever a node joins,
// each move a drain and a rebuild of its nodes (DESIGN.md has the numbers).
// So one replica, the first live member by name, publishes the node count
// of every partition on the balance Lease, and everyone balances with the
// published counts. It publishes again only when the replicas' actual
// shares have drifted past NodeLoad² of the mean (and a new table would
// narrow them), at most once per balanceInterval: nodes come and go without
// moving partitions until then. Balancer decides all of it; the driver
// reads and writes the Lease (balancelease.go).

// balanceInterval is the least time between two publications by a replica.
const balanceInterval = 10 * time.Second

// balanceLook is the least time between two looks at the drift: each look
// balances the ring once more.
const balanceLook = time.Second

// EncodePartitionNodes writes per-partition node counts for the balance
// Lease: decimal counts separated by commas, in partition order.
func EncodePartitionNodes(counts []int) string {
	var b strings.Builder
	for p, n := range counts {
		if p > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(n))
	}
	return b.String()
}

// maxPartitionNodes bounds a published count: no cluster has more nodes.
const maxPartitionNodes = 1 << 20

// DecodePartitionNodes reads what EncodePartitionNodes wrote. It refuses
// anything but exactly partitions non-negative counts, so a corrupt or
// foreign annotation is ignored rather than half used.
func DecodePartitionNodes(s string, partitions int) ([]int, error) {
	fields := strings.Split(s, ",")
	if len(fields) != partitions {
		return nil, fmt.Errorf("balance: %d node counts for %d partitions", len(fields), partitions)
	}
	counts := make([]int, partitions)
	for p, f := range fields {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 || n > maxPartitionNodes || strconv.Itoa(n) != f {
			return nil, fmt.Errorf("balance: partition %d: bad node count %q", p, f)
		}
		counts[p] = n
	}
	return counts, nil
}

// shareBounds are the least and most nodes a member may serve before the
// counts are published again: NodeLoad² around the mean, so a table just
// balanced to NodeLoad absorbs some drift first.
func shareBounds(cfg RingConfig, total, members int) (lo, hi int) {
	mean := float64(total) / float64(members)
	slack := cfg.NodeLoad * cfg.NodeLoad
	return int(math.Floor(mean / slack)), int(math.Ceil(mean * slack))
}

// loads returns the nodes each ring member serves under table t.
func loads(r *Ring, t Table, counts []int) map[string]int {
	out := make(map[string]int, len(r.members))
	for _, m := range r.members {
		out[m] = 0
	}
	for p, o := range t.Owners {
		out[o] += counts[p]
	}
	return out
}

// spread is the least and the most nodes any member serves.
func spread(l map[string]int) (lo, hi int) {
	ns := slices.Collect(maps.Values(l))
	return slices.Min(ns), slices.Max(ns)
}

// partitionCounts counts the nodes in each of the partitions.
func partitionCounts(partitions int, nodes []string) []int {
	counts := make([]int, partitions)
	for _, n := range nodes {
		counts[PartitionOf(partitions, n)]++
	}
	return counts
}

// RebalanceReason says why the table in use, inUse (the ring balanced with
// the published counts), should be balanced again with the actual counts,
// or "" when it should not: the members' shares of the actual nodes under
// inUse are within NodeLoad² of the mean, or a balance over the actual
// counts would not narrow them.
func RebalanceReason(r *Ring, inUse Table, actual []int) (string, error) {
	total := 0
	for _, n := range actual {
		total += n
	}
	if total == 0 {
		return "", nil
	}
	lo, hi := shareBounds(r.cfg, total, len(r.members))
	curLo, curHi := spread(loads(r, inUse, actual))
	if curLo >= lo && curHi <= hi {
		return "", nil
	}
	next, err := r.Balanced(actual)
	if err != nil {
		return "", err
	}
	nextLo, nextHi := spread(loads(r, next, actual))
	if nextHi >= curHi && nextLo <= curLo {
		return "", nil
	}
	return fmt.Sprintf("members serve %d to %d of %d nodes (bounds %d to %d)", curLo, curHi, total, lo, hi), nil
}

// BalancerConfig shapes one replica's Balancer.
type BalancerConfig struct {
	Self       string
	Partitions int
	// Interval is the least time between two publications by this replica.
	Interval time.Duration
}

// BalanceView is what the driver observed, at Now.
type BalanceView struct {
	Now time.Time
	// Ring is the ring over Live (nil while there is none).
	Ring *Ring
	// Live are the ring's members, sorted.
	Live []string
	// Active: this replica may write under its name (its lease is valid
	// and it is not leaving).
	Active bool
	// Nodes are the BCC nodes that exist.
	Nodes []string
}

// PublishBalance asks the driver to write Counts on the balance Lease by
// compare-and-swap, then to report with Balancer.Published.
type PublishBalance struct {
	Counts []int
	Reason string // why now, for the log
}

// Balancer is one replica's part in the balance, a pure state machine like
// Ownership: it takes the balance Lease as read (Observe) and what the
// replica sees (Step, a BalanceView), returns the publication to carry out
// if one is due, and gives the table the replica balances to (Table). It
// performs no I/O and reads no clock.
type Balancer struct {
	cfg        BalancerConfig
	version    string // the counts annotation as last observed ("" no Lease)
	counts     []int  // the published node counts; nil: none or unreadable
	publishing bool
	pending    bool // the last look found counts to publish (or one in flight)
	lastCheck  time.Time
	lastTry    time.Time
	table      Table // the ring balanced with counts, for tableRing
	tableRing  *Ring
	tableVer   string
}

// NewBalancer starts with no counts observed and nothing published.
func NewBalancer(cfg BalancerConfig) *Balancer { return &Balancer{cfg: cfg} }

// Observe records the balance Lease as read: present is false while there
// is none, raw is its counts annotation. Counts that cannot be read are
// ignored (the ring's own table is used, and the publisher replaces them):
// the error says why, once per change.
func (b *Balancer) Observe(present bool, raw string) error {
	version := "" // the annotation itself: cheap to compare, and what matters
	if present {
		version = "v:" + raw
	}
	if version == b.version {
		return nil
	}
	b.version, b.counts = version, nil
	if !present {
		return nil
	}
	counts, err := DecodePartitionNodes(raw, b.cfg.Partitions)
	if err != nil {
		return err
	}
	b.counts = counts
	return nil
}

// Counts are the published node counts as last observed (nil: none, or
// unreadable).
func (b *Balancer) Counts() []int { return slices.Clone(b.counts) }

// Table is the ownership every live replica agrees on: r balanced with the
// published counts (r's own table while none are). A balance that fails
// leaves r's own table; its error is returned once.
func (b *Balancer) Table(r *Ring) (Table, error) {
	if b.tableRing == r && b.tableVer == b.version && b.table.Owners != nil {
		return b.table, nil
	}
	t, err := r.Table(), error(nil)
	if b.counts != nil {
		var bt Table
		if bt, err = r.Balanced(b.counts); err == nil {
			t = bt
		}
	}
	b.table, b.tableRing, b.tableVer = t, r, b.version
	return t, err
}

// Step decides whether this replica publishes the node counts now: only
// the first live member by name does, while it may write, with no
// publication in flight and none tried within the Interval. It looks at
// most once a second, and publishes when no counts are published or the
// shares have drifted (RebalanceReason).
func (b *Balancer) Step(v BalanceView) (*PublishBalance, error) {
	if v.Ring == nil || len(v.Live) == 0 || v.Live[0] != b.cfg.Self || !v.Active {
		b.pending = false // not the publisher (now)
		return nil, nil
	}
	if b.publishing || v.Now.Sub(b.lastCheck) < balanceLook {
		return nil, nil
	}
	b.lastCheck = v.Now
	b.pending = false
	if len(v.Nodes) == 0 {
		return nil, nil // nothing to balance
	}
	actual := partitionCounts(b.cfg.Partitions, v.Nodes)
	reason := "no node counts published"
	if b.counts != nil {
		inUse, err := b.Table(v.Ring)
		if err != nil {
			return nil, err
		}
		if reason, err = RebalanceReason(v.Ring, inUse, actual); err != nil {
			return nil, err
		}
	}
	if reason == "" {
		return nil, nil
	}
	// Due, but published only once per Interval; Pending says so meanwhile.
	b.pending = true
	if !b.lastTry.IsZero() && v.Now.Sub(b.lastTry) < b.cfg.Interval {
		return nil, nil
	}
	b.publishing, b.lastTry = true, v.Now
	return &PublishBalance{
		Counts: actual,
		Reason: reason,
	}, nil
}

// Published reports that the publication Step asked for is over, written
// or not. The outcome does not change the decision: a conflict means
// another replica has just published, which Observe will show, and the
// counts are looked at again after the Interval, whether the write
// succeeded or failed.
func (b *Balancer) Published() { b.publishing = false }

// Pending reports whether this replica, as the publisher, has node counts
// to publish: its last look found none published or the shares drifted, and
// they are being written or wait for the Interval. A table that is about to
// change is not settled (the status says so, for tests and operators).
func (b *Balancer) Pending() bool { return b.pending || b.publishing }

// Publishing reports whether a publication is in flight.
func (b *Balancer) Publishing() bool { return b.publishing }
