package shard

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

// Node serving: the nodes of Serving partitions are started (rebuilt in
// batches by the NodeServer) and the others stopped; a draining partition
// is released once its nodes have all stopped.

type nodeState uint8

const (
	nodeAbsent nodeState = iota
	nodeStarting
	nodeUp
	nodeStopping
)

func (s nodeState) String() string { return [...]string{"absent", "starting", "up", "stopping"}[s] }

// nodeServing is the loop's record of the nodes it serves.
type nodeServing struct {
	state      map[string]nodeState
	starting   bool // a batch is being served
	retryAt    map[string]time.Time
	retryDelay map[string]time.Duration // a failing node's current backoff (see serveBackoff)
}

// newNodeServing serves no node yet.
func newNodeServing() nodeServing {
	return nodeServing{
		state:      map[string]nodeState{},
		retryAt:    map[string]time.Time{},
		retryDelay: map[string]time.Duration{},
	}
}

// servedNodes lists the nodes this controller serves: the BCC nodes not
// being deleted (ipam.ServesNode, a pure function of the Node object, so
// every replica counts the same nodes).
func (c *Coordinator) servedNodes() []string {
	all, _ := c.nodeLister.List(labels.Everything())
	names := make([]string, 0, len(all))
	for _, n := range all {
		if ok, _ := ipam.ServesNode(n); ok {
			names = append(names, n.Name)
		}
	}
	return names
}

// reconcileNodes starts and stops the nodes planNodes says, and updates
// readiness.
func (c *Coordinator) reconcileNodes(ctx context.Context, now time.Time, served []string) {
	plan := planNodes(nodeInputs{
		now:            now,
		partitions:     c.cfg.Ring.Partitions,
		state:          c.own.State,
		served:         served,
		serving:        c.serving,
		claimsInFlight: c.inFlight.claims,
		claimsSince:    c.inFlight.claimsSince,
	})
	c.serving.begin(plan)
	for _, name := range plan.stop {
		go func() {
			c.nodes.StopServingNode(name)
			c.results <- func() { c.serving.state[name] = nodeAbsent }
		}()
	}
	if len(plan.start) > 0 {
		go c.serve(ctx, plan.start)
	}
	exists := make(map[string]bool, len(served))
	for _, name := range served {
		exists[name] = true
	}
	c.updateReady(now, exists)
}

// serve rebuilds a batch of nodes in one ServeNodes (one VPC-wide ENI list).
func (c *Coordinator) serve(ctx context.Context, names []string) {
	start := c.clock.Now()
	errs := c.nodes.ServeNodes(ctx, names)
	took := c.clock.Since(start)
	c.results <- func() { c.served(names, errs, took) }
}

// served applies a batch's outcome: failed nodes back off, the others are up.
func (c *Coordinator) served(names []string, errs map[string]error, took time.Duration) {
	c.serving.starting = false
	now := c.clock.Now()
	for _, n := range names {
		if err, failed := errs[n]; failed {
			wait, delay := c.serving.failed(n, now, serveJitter)
			c.log.Warn("serving node failed; backing off", "node", n, "retry_in", wait.Round(time.Millisecond),
				"backoff", delay, "err", err)
			continue
		}
		c.serving.up(n)
	}
	// Hand-over duration: from when the ring gave us a partition until
	// its nodes are served.
	for _, took := range c.own.HandedOver(now) {
		c.metrics.handoverDuration.Observe(took.Seconds())
	}
	c.log.Info("served nodes", "count", len(names)-len(errs), "failed", len(errs), "duration", took)
}

// A node that cannot be served is retried after serveRetryMin, doubling on
// each failure up to serveRetryMax; a success resets it. A node that never
// rebuilds (a bad providerID, a cloud reply it cannot use) must not cost an
// urgent VPC-wide ENI list every second: that starves the periodic ENI sync
// and spends the cluster's ListENIs budget.
const (
	serveRetryMin = time.Second
	serveRetryMax = 2 * time.Minute
)

// serveBackoff returns the backoff after one more failure.
func serveBackoff(prev time.Duration) time.Duration {
	return min(max(2*prev, serveRetryMin), serveRetryMax)
}

// serveJitter spreads d over [0.8d, 1.2d), so that nodes failing together
// (one batch) do not retry in lockstep for ever.
func serveJitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// updateReady: ready once the lease is held, a step has run, and every
// node of our Serving partitions is up.
func (c *Coordinator) updateReady(now time.Time, exists map[string]bool) {
	switch {
	case !now.Before(c.own.LeaseValidUntil()):
		c.readyReason = "replica lease not held"
	case c.own.Hold() != "":
		c.readyReason = c.own.Hold()
	case c.serving.starting:
		c.readyReason = "building the state of owned nodes"
	default:
		// A claim in flight is a partition the replica is about to serve:
		// ready now would let a rolling update stop the next replica
		// before this one has taken its share.
		c.readyReason = ""
		for p := range c.cfg.Ring.Partitions {
			if c.own.State(p) == Claiming {
				c.readyReason = fmt.Sprintf("claiming partition %d", p)
				return
			}
		}
		for name := range exists {
			if c.own.State(PartitionOf(c.cfg.Ring.Partitions, name)) == Serving && c.serving.state[name] != nodeUp {
				c.readyReason = "node " + name + " not served yet"
				break
			}
		}
	}
}
