package ipam

import (
	"context"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/ipamcore/pool"
)

// ENIs ahead of demand (spec §7.2.4 "Grow ENIs"): after each ENI sync the
// replica looks at the nodes it serves, and for a Ready node whose
// annotations ask for it (pool.Capacity.AheadOfDemand) and that has no ENI
// in flight, starts an ENI creation when pool.PlanAhead says so. So a burst
// of pods finds an attached ENI instead of paying the attach time.
//
// Each creation is in-flight work of its node (acquireWork: it carries the
// node's permission, and StopServingNode ends and waits for it) on its own
// goroutine, so the pool worker keeps serving allocations from the ENIs it
// has while the new one attaches; beginENI keeps it to one creation per node
// (the pool worker's own creations included). No lock is held across the
// cloud calls, and nothing is global across nodes.

// maxENICreationsPerSync bounds the creations one sync starts, as the
// reference does (16 per run): a replica taking over many fresh nodes does
// not spend the cloud budget on ENIs all at once; the rest wait one period.
const maxENICreationsPerSync = 16

// eniInFlight returns the nodes (by name) and instances that have an ENI on
// its way: attaching to the instance, or created for the node and still
// available (not attached yet; one older than LeakedENIAge is a leak the
// sync deletes, not a creation in flight).
func (i *IPAM) eniInFlight(enis []cloud.ENI) (nodes, instances map[string]bool) {
	nodes, instances = map[string]bool{}, map[string]bool{}
	now := i.deps.Clock.Now()
	for _, e := range enis {
		switch e.Status {
		case cloud.ENIStatusAttaching:
			if e.InstanceID != "" {
				instances[e.InstanceID] = true
			}
		case cloud.ENIStatusAvailable:
			if !e.CreatedTime.IsZero() && now.Sub(e.CreatedTime) >= i.cfg.LeakedENIAge {
				continue
			}
			if parts := strings.Split(e.Name, "/"); len(parts) == 4 {
				instances[parts[1]] = true
				nodes[parts[2]] = true
			}
		}
	}
	return nodes, instances
}

// createENIsAhead starts the ahead-of-demand creations the list enis calls
// for, at most maxENICreationsPerSync; it returns how many it started. run
// is the context the creations run under (Run's, not the sync's, which may
// be a NoWait context and ends with the sync).
func (i *IPAM) createENIsAhead(run context.Context, servedNodes []string, enis []cloud.ENI) int {
	inflightNodes, inflightInstances := i.eniInFlight(enis)
	exhausted := i.exhaustedSubnets()
	names := slices.Clone(servedNodes)
	slices.Sort(names) // deterministic order when the bound cuts in
	started := 0
	for _, name := range names {
		if started == maxENICreationsPerSync {
			i.log.Info("ENI sync: creation bound reached; other nodes wait for the next sync", "started", started)
			break
		}
		k8sNode, err := i.nodes.Get(name)
		if err != nil || !nodeReady(k8sNode) {
			continue
		}
		// The annotations are read at every sync: the node agent may
		// change them while the node is served.
		capc, err := pool.CapacityFromAnnotations(k8sNode.Annotations, pool.DefaultCapacity())
		if !capc.AheadOfDemand {
			continue
		}
		if err != nil {
			i.log.Warn("node capacity annotations malformed; using defaults", "node", name, "err", err)
		}
		n, ok := i.node(name)
		if !ok || inflightNodes[name] || inflightInstances[n.instanceID] {
			continue
		}
		snap, err := i.store.Snapshot(name)
		if err != nil {
			continue
		}
		st := pool.StateFromSnapshot(snap, exhausted)
		st.ENIPending = n.eniCreating()
		now := i.deps.Clock.Now()
		need, reason := pool.PlanAhead(capc, st, n.backoffs(), now)
		if !need {
			continue
		}
		if i.startENIAhead(run, name, reason) {
			started++
		}
	}
	return started
}

// startENIAhead starts one creation for the node on its own goroutine.
func (i *IPAM) startENIAhead(run context.Context, name, reason string) bool {
	return i.startENICreation(run, name, reason, true)
}

// startENICreation starts one creation for the node on its own goroutine,
// unless one runs already (beginENI); ahead says it was asked by the
// node's annotations (pre-attached count, warm IP target) rather than by a
// pool that outgrows its ENIs (pool.go's balance), whose ENI is created
// holding the addresses the pool wants beyond its room (createENI).
func (i *IPAM) startENICreation(run context.Context, name, reason string, ahead bool) bool {
	ctx, n, done, ok := i.acquireWork(run, name)
	if !ok {
		return false
	}
	if i.mayAct(name) != nil || !n.beginENI(i.deps.Clock.Now()) {
		done()
		return false
	}
	what := "creating an ENI beside the pool's adds"
	if ahead {
		what = "creating an ENI ahead of demand"
	}
	i.log.Info(what, "node", name, "reason", reason)
	i.workers.Add(1)
	go func() {
		defer i.workers.Done()
		defer done()
		err := i.createENI(ctx, n, !ahead)
		n.endENI(i.deps.Clock.Now(), reason, err)
		if err != nil {
			i.log.Warn(what+" failed", "node", name, "err", err)
			return
		}
		if ahead {
			i.metrics.enisAhead.Inc()
		}
		n.poke() // waiting allocations: the pool worker grows on the new ENI
	}()
	return true
}

// nodeReady: the node's Ready condition is True (the reference grows ENIs
// only for Ready nodes: a node that is not Ready may be going away).
func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
