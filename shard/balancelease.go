package shard

import (
	"context"
	"errors"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// The balance Lease I/O: the loop shows the Balancer the Lease and what it
// sees, and writes the counts when the Balancer asks for it.

// stepBalance runs the Balancer against the balance Lease l (nil: none)
// and starts the publication it asks for.
func (c *Coordinator) stepBalance(ctx context.Context, now time.Time, l *coordv1.Lease, live, served []string) {
	c.readBalance(l)
	pub, err := c.balance.Step(BalanceView{
		Now:    now,
		Ring:   c.ring,
		Live:   live,
		Active: now.Before(c.own.LeaseValidUntil()) && !c.leaving,
		Nodes:  served,
	})
	if err != nil {
		c.log.Error("balancing the ring", "err", err)
		return
	}
	if pub == nil {
		return
	}
	c.log.Info("publishing the partitions' node counts", "reason", pub.Reason, "nodes", len(served))
	go func() {
		err := c.publishBalance(ctx, pub.Counts)
		c.results <- func() {
			c.balance.Published()
			if err != nil {
				c.log.Warn("publishing the partitions' node counts", "err", err)
				return
			}
			c.metrics.balancePublished.Inc()
		}
	}()
}

// readBalance shows the Balancer the balance Lease. Unreadable counts are
// logged and ignored (the ring's own table is used), and the publisher
// replaces them.
func (c *Coordinator) readBalance(l *coordv1.Lease) {
	var raw string
	if l != nil {
		raw = l.Annotations[annoPartitionNodes]
	}
	if err := c.balance.Observe(l != nil, raw); err != nil {
		c.log.Warn("ignoring the balance lease's node counts", "err", err, "publishedBy", l.Annotations[annoMember])
	}
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

// table is the ownership every live replica agrees on: the ring balanced
// with the published counts (the ring's own table while none are).
func (c *Coordinator) table() Table {
	if c.ring == nil {
		return Table{Owners: make([]string, c.cfg.Ring.Partitions)}
	}
	t, err := c.balance.Table(c.ring)
	if err != nil {
		c.log.Error("balancing the ring", "err", err)
	}
	return t
}
