package shard

import (
	"context"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
)

// One step of the loop: look at the Leases, the gossip members and the
// nodes; run the Ownership against them; start the I/O it asks for.

// step compares the world with the Ownership and starts the I/O it asks for.
func (c *Coordinator) step(ctx context.Context) error {
	now := c.clock.Now()
	leases, err := c.leases.List(labels.Everything())
	if err != nil {
		return err
	}
	var gossip map[string]bool
	if c.gossip != nil {
		gossip = map[string]bool{}
		for _, m := range c.gossip() {
			gossip[m] = true
		}
	}
	claims, present, budgetLease, balanceLease := c.readLeases(leases)
	served := c.servedNodes()
	c.applyWritten(claims)
	c.observe(present, now)
	live := c.liveMembers(now, gossip)
	if err := c.updateRing(live); err != nil {
		return err
	}
	c.readBalance(balanceLease)
	c.maybePublishBalance(ctx, now, live, served)
	wanted := c.wanted(now, live, claims, gossip)
	acts, err := c.own.Step(View{
		Now: now, Wanted: wanted, Claims: claims, LeaseValidUntil: c.leaseValidUntil,
		Expired: func(r string) bool { return c.expired(r, now) },
	})
	if err != nil {
		return err
	}
	c.publish() // a partition fenced or draining is closed before its nodes stop
	for _, a := range acts {
		c.startAction(ctx, a, claims[a.Partition])
	}
	c.reconcileNodes(ctx, now, claims, served)
	c.budget.observe(budgetLease, live, max(c.freshReplicas(now), len(live)))
	c.updateMetrics()
	c.stepped = true
	c.publish()
	return nil
}

// wanted is the ring's owner of each partition, with this replica's
// unowned partitions left out while claims are held back (holdClaims), and
// it tracks since when each partition the ring gives us has been waiting
// (the hand-over duration).
func (c *Coordinator) wanted(now time.Time, live []string, claims []Claim, gossip map[string]bool) []string {
	wanted := c.table().Owners
	if hold := c.holdClaims(now, live, claims, gossip); hold != c.holdReason {
		if hold != "" {
			c.log.Info("holding back claims", "reason", hold)
		} else {
			c.log.Info("claiming", "members", live)
		}
		c.holdReason = hold
	}
	if c.holdReason != "" {
		wanted = slices.Clone(wanted)
		for p := range wanted {
			if wanted[p] == c.self && c.own.State(p) == Unowned {
				wanted[p] = ""
			}
		}
	}
	for p := range wanted {
		if wanted[p] == c.self && c.own.State(p) != Serving {
			if _, ok := c.wantedSince[p]; !ok {
				c.wantedSince[p] = now
			}
		} else if wanted[p] != c.self {
			delete(c.wantedSince, p)
		}
	}
	return wanted
}

// holdClaims says why this replica must not claim partitions yet, or ""
// when it may:
//   - without a share of the cloud budget it could not rebuild what it claims
//     (the ENI list is a cloud call), and nobody else could serve it either;
//   - at a cold start (no live replica but us holds a claim), until the
//     replicas in view, by gossip or by a fresh Lease, have been the same for
//     ColdStartSettle: replicas started together then split the nodes once.
//     The wait is capped at ColdStartSettle + LeaseDuration from our start,
//     so a replica whose Lease is fresh but that never joins gossip does not
//     hold us forever.
func (c *Coordinator) holdClaims(now time.Time, live []string, claims []Claim, gossip map[string]bool) string {
	if !c.budget.held() {
		return "waiting for a share of the BCE budget"
	}
	if present, detail := c.policy.get(); c.cfg.RequireFencingPolicy && !present {
		return "fencing policy missing (--shard-require-fencing-policy): " + detail
	}
	if c.cfg.ColdStartSettle <= 0 {
		return ""
	}
	for _, cl := range claims {
		if cl.Holder != "" && cl.Holder != c.self && slices.Contains(live, cl.Holder) {
			return "" // a running cluster: a join takes its part at once
		}
	}
	for p := range c.cfg.Ring.Partitions {
		if c.own.State(p) != Unowned {
			return "" // we already took part
		}
	}
	if key := strings.Join(c.inView(now, live, gossip), ","); key != c.settleKey || c.settleSince.IsZero() {
		c.settleKey, c.settleSince = key, now
	}
	if now.Sub(c.settleSince) < c.cfg.ColdStartSettle && now.Sub(c.startedAt) < c.cfg.ColdStartSettle+c.cfg.LeaseDuration {
		return "cold start: waiting for the replicas to settle"
	}
	return ""
}
