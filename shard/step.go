package shard

import (
	"context"
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
	c.prefetchForStale(ctx, now, c.claims, served)
	live := c.liveMembers(now, gossip)
	if err := c.updateRing(live); err != nil {
		return err
	}
	c.stepBalance(ctx, now, balanceLease, live, served)
	c.balancePending.Store(c.balance.Pending())
	acts, err := c.own.Step(c.view(now, live, claims, gossip))
	if err != nil {
		return err
	}
	c.logHold(live)
	c.publish() // a partition fenced or draining is closed before its nodes stop
	for _, a := range acts {
		c.startAction(ctx, a, claims[a.Partition])
	}
	c.reconcileNodes(ctx, now, served)
	c.budget.observe(budgetLease, live, max(c.freshReplicas(now), len(live)))
	c.updateMetrics()
	c.stepped = true
	c.publish()
	return nil
}

// view is what the Ownership is shown at now.
func (c *Coordinator) view(now time.Time, live []string, claims []Claim, gossip map[string]bool) View {
	v := View{
		Now:        now,
		Wanted:     c.table().Owners,
		Claims:     claims,
		Expired:    func(r string) bool { return c.expired(r, now) },
		Live:       live,
		InView:     c.inView(now, live, gossip),
		BudgetHeld: c.budget.held(),
		Busy:       c.serving.busy(c.cfg.Ring.Partitions),
	}
	if present, detail := c.policy.get(); c.cfg.RequireFencingPolicy && !present {
		v.PolicyHold = "fencing policy missing (--shard-require-fencing-policy): " + detail
	}
	return v
}

// logHold logs when claims start or stop being held back.
func (c *Coordinator) logHold(live []string) {
	hold := c.own.Hold()
	if hold == c.loggedHold {
		return
	}
	if hold != "" {
		c.log.Info("holding back claims", "reason", hold)
	} else {
		c.log.Info("claiming", "members", live)
	}
	c.loggedHold = hold
}
