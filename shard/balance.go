package shard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// The ring balances partitions; Ring.Balanced moves partitions so that the
// replicas serve even shares of the nodes. Every replica must balance with
// the same node counts to agree on the table, and counts taken straight from
// each replica's node informer would move partitions whenever a node joins,
// each move a drain and a rebuild of its nodes (DESIGN.md has the numbers).
// So one replica, the first live
// member by name, publishes the node count of every partition on the
// balance Lease, and everyone balances with the published counts. It
// publishes again only when the replicas' actual shares have drifted past
// NodeLoad² of the mean (and a new table would narrow them), at most once
// per balanceInterval: nodes come and go without moving partitions until
// then.

// balanceState is what this replica knows of the balance Lease, and the
// table it balances to (owned by the loop).
type balanceState struct {
	version    string // the counts annotation as last read ("" no Lease)
	counts     []int  // the published node counts; nil: none or unreadable
	publishing bool
	lastCheck  time.Time
	lastTry    time.Time
	table      Table // the ring balanced with counts, for tableRing
	tableRing  *Ring
	tableVer   string
}

// balanceInterval is the least time between two publications by a replica.
const balanceInterval = 10 * time.Second

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

// publishBalance writes counts on the balance Lease by compare-and-swap. A
// conflict means someone else just published: the next look decides again.
func (c *Coordinator) publishBalance(ctx context.Context, counts []int) error {
	client := c.kube.CoordinationV1().Leases(c.cfg.Namespace)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := casAnnotations(ctx, client, balanceLeaseName, kindBalance, func(a map[string]string) {
		a[annoPartitionNodes] = EncodePartitionNodes(counts)
		a[annoMember] = c.self
	})
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		return errors.New("balance lease changed meanwhile")
	}
	return err
}

// readBalance decodes the balance Lease when it changed. Unreadable
// counts are logged and ignored (the ring's own table is used), and the
// publisher replaces them.
func (c *Coordinator) readBalance(l *coordv1.Lease) {
	version := "" // the annotation itself: cheap to compare, and what matters
	if l != nil {
		version = "v:" + l.Annotations[annoPartitionNodes]
	}
	if version == c.balance.version {
		return
	}
	c.balance.version, c.balance.counts = version, nil
	if l == nil {
		return
	}
	counts, err := DecodePartitionNodes(l.Annotations[annoPartitionNodes], c.cfg.Ring.Partitions)
	if err != nil {
		c.log.Warn("ignoring the balance lease's node counts", "err", err, "publishedBy", l.Annotations[annoMember])
		return
	}
	c.balance.counts = counts
}

// table is the ownership every live replica agrees on: the ring
// balanced with the published counts (the ring's own table while none are).
func (c *Coordinator) table() Table {
	if c.ring == nil {
		return Table{Owners: make([]string, c.cfg.Ring.Partitions)}
	}
	b := &c.balance
	if b.tableRing == c.ring && b.tableVer == b.version && b.table.Owners != nil {
		return b.table
	}
	t := c.ring.Table()
	if b.counts != nil {
		bt, err := c.ring.Balanced(b.counts)
		if err != nil {
			c.log.Error("balancing the ring", "err", err)
		} else {
			t = bt
		}
	}
	b.table, b.tableRing, b.tableVer = t, c.ring, b.version
	return t
}

// maybePublishBalance publishes the actual node counts when this
// replica is the first live member and the shares have drifted (see
// RebalanceReason). It looks at most once a second.
func (c *Coordinator) maybePublishBalance(ctx context.Context, now time.Time, live, served []string) {
	b := &c.balance
	if c.ring == nil || len(live) == 0 || live[0] != c.self || c.leaving || b.publishing ||
		!now.Before(c.own.LeaseValidUntil()) || now.Sub(b.lastCheck) < time.Second ||
		(!b.lastTry.IsZero() && now.Sub(b.lastTry) < balanceInterval) {
		return
	}
	b.lastCheck = now
	if len(served) == 0 {
		return // nothing to balance
	}
	actual := partitionCounts(c.cfg.Ring.Partitions, served)
	reason := "no node counts published"
	if b.counts != nil {
		var err error
		if reason, err = RebalanceReason(c.ring, c.table(), actual); err != nil {
			c.log.Error("balancing the ring", "err", err)
			return
		}
	}
	if reason == "" {
		return
	}
	b.publishing, b.lastTry = true, now
	c.log.Info("publishing the partitions' node counts", "reason", reason, "nodes", len(served))
	go func() {
		err := c.publishBalance(ctx, actual)
		c.results <- func() {
			c.balance.publishing = false
			if err != nil {
				c.log.Warn("publishing the partitions' node counts", "err", err)
				return
			}
			c.metrics.balancePublished.Inc()
		}
	}()
}
