package ipam

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
	"github.com/cce-ipam/sharded/ipamcore/pool"
)

// BCE's reads lag its writes. An address whose presence on its ENI is in
// doubt is held in the datastore as HoldUnsettled, never handed out, until a
// cloud read taken late enough settles it by one rule (Store.Settle): listed
// on the ENI, it returns to the pool; not listed, it is forgotten. Three
// sources of doubt, and the read that settles each, live here:
//
//   - A takeover builds a node from one ENI list, which may still show an
//     address the previous owner deleted a moment before it was fenced.
//     Unclaimed addresses are therefore held (HoldUnsettled) until a list
//     taken ReadLag after the takeover began confirms them: confirmed ones
//     join the pool, missing ones are forgotten. Pods on the node meanwhile
//     wait at most ReadLag (the pool planner counts the held addresses as
//     idle, so it does not grow to replace them).
//   - The periodic ENI sync compares every address of every known ENI with
//     the cloud (reconcileIPs) and changes the datastore only when two reads
//     at least ReadLag apart agree: an idle address missing from the cloud
//     is held at once (never handed out) and forgotten on the second
//     missing read; a cloud address the datastore lacks is recorded on the
//     second read: assigned if a WorkloadEndpoint names it, otherwise held
//     (for the running pod that uses it, or as an orphan that the leaked-IP
//     GC deletes after its grace: leaked.go).

// settleTakeover settles the unsettled addresses of nodes taken over at
// start, with one VPC-wide list taken ReadLag after start.
func (i *IPAM) settleTakeover(ctx context.Context, names []string, start time.Time) {
	i.sleep(ctx, start.Add(i.cfg.ReadLag).Sub(i.deps.Clock.Now()))
	wait := time.Second
	for ctx.Err() == nil {
		instances := map[string]bool{}
		var nodes []*node
		for _, name := range names {
			// A node stopped and served again since is another takeover's
			// to settle: this read may be too early for it.
			if n, ok := i.node(name); ok && n.takenOverAt.Equal(start) {
				nodes = append(nodes, n)
				instances[n.instanceID] = true
			}
		}
		if len(nodes) == 0 {
			return
		}
		// Pods may be waiting for these addresses: the list goes ahead of
		// the periodic sync's share of the ListENIs limit.
		enis, err := i.deps.Cloud.ListENIs(cloud.Urgent(ctx), cloud.ListENIsOptions{VPCID: i.cfg.VPCID,
			NamePrefix: i.cfg.ClusterID + "/", Instances: instances})
		if err != nil {
			i.log.Warn("settling taken-over addresses: list ENIs failed; they stay out of the pool", "nodes", len(nodes),
				"retry_in", wait, "err", err)
			i.sleep(ctx, wait)
			wait = min(2*wait, 30*time.Second)
			continue
		}
		listed := listedAddrs(enis)
		for _, n := range nodes {
			i.settleNode(n, listed, start)
		}
		return
	}
}

// listedAddrs maps each address of the in-use ENIs to its ENI.
func listedAddrs(enis []cloud.ENI) map[netip.Addr]string {
	out := map[netip.Addr]string{}
	for _, e := range enis {
		if e.Status != cloud.ENIStatusInUse {
			continue
		}
		for _, p := range e.PrivateIPs {
			if a, err := netip.ParseAddr(p.Address); err == nil && !p.Primary {
				out[a] = e.ID
			}
		}
	}
	return out
}

// settleNode settles every unsettled address of n by one read, listed.
func (i *IPAM) settleNode(n *node, listed map[netip.Addr]string, coolFrom time.Time) {
	snap, err := i.store.Snapshot(n.name)
	if err != nil || i.mayAct(n.name) != nil {
		return
	}
	confirmed := 0
	for _, es := range snap.ENIs {
		for _, ip := range es.IPs {
			if !unsettled(ip) {
				continue
			}
			present := listed[ip.Addr] == es.ENI.ID
			if _, err := i.store.Settle(n.name, ip.Addr, present, coolFrom); err != nil {
				continue // settled meanwhile (a trim, a restore)
			}
			if present {
				confirmed++
				i.metrics.reconciled.WithLabelValues("confirmed").Inc()
				continue
			}
			i.metrics.reconciled.WithLabelValues("gone").Inc()
			i.log.Info("an address the takeover's ENI list showed is gone from the cloud; forgotten, never handed out",
				"node", n.name, "eni", es.ENI.ID, "ip", ip.Addr)
		}
	}
	if confirmed > 0 {
		n.refill()
	}
	n.poke()
}

// A trim's settling read is taken ReadLag after the unclear delete: a read
// taken at once could come from a replica that has not seen the delete yet
// and show an address that is gone. trimSettleRetry spaces the reads while
// they fail.
const trimSettleRetry = 15 * time.Second

// settleRead is a GetENI a pool worker owes one of its unclear trims.
type settleRead struct {
	eniID string
	due   time.Time
}

// settleReads are the reads one node's pool worker owes, by address (only
// its goroutine touches them). They say when to read which ENI; the
// addresses' state is the datastore's (HoldUnsettled), so a read that
// finds an address settled by another path (the ENI sync, a rebuild that
// dropped it) simply forgets it.
type settleReads map[netip.Addr]settleRead

func (r settleReads) owe(a netip.Addr, eniID string, due time.Time) {
	r[a] = settleRead{
		eniID: eniID,
		due:   due,
	}
}

// next returns the earliest due time.
func (r settleReads) next() (time.Time, bool) {
	var first time.Time
	for _, x := range r {
		if first.IsZero() || x.due.Before(first) {
			first = x.due
		}
	}
	return first, !first.IsZero()
}

// uncount lowers st's per-ENI idle counts by the owed addresses snap still
// holds unsettled (see poolState).
func (r settleReads) uncount(st pool.NodeState, snap datastore.NodeSnapshot) pool.NodeState {
	if len(r) == 0 {
		return st
	}
	owed := map[string]int{}
	for _, es := range snap.ENIs {
		for _, ip := range es.IPs {
			if _, ok := r[ip.Addr]; ok && unsettled(ip) {
				owed[es.ENI.ID]++
			}
		}
	}
	enis := make([]pool.ENIState, len(st.ENIs))
	for k, e := range st.ENIs {
		e.Idle -= owed[e.ID]
		enis[k] = e
	}
	st.ENIs = enis
	return st
}

func unsettled(ip datastore.IPInfo) bool {
	return ip.State == datastore.StateHeld && ip.HoldReason == datastore.HoldUnsettled
}

// settleTrims takes the reads that are due (one GetENI per ENI) and settles
// their addresses by the datastore's rule. While the node may not act the
// reads wait: it may be moving away (the next owner reads the cloud
// afresh), or the lease is at risk.
func (i *IPAM) settleTrims(ctx context.Context, n *node, reads settleReads) {
	if len(reads) == 0 {
		return
	}
	now := i.deps.Clock.Now()
	byENI := map[string][]netip.Addr{}
	for a, x := range reads {
		info, err := i.store.LookupIP(a)
		if err != nil || info.Node != n.name || !unsettled(info) {
			delete(reads, a) // settled, or dropped with its ENI
			continue
		}
		if !x.due.After(now) {
			byENI[x.eniID] = append(byENI[x.eniID], a)
		}
	}
	if len(byENI) > 0 && (ctx.Err() != nil || i.mayAct(n.name) != nil) {
		for eniID, addrs := range byENI {
			for _, a := range addrs {
				reads.owe(a, eniID, now.Add(trimSettleRetry))
			}
		}
		return
	}
	for eniID, addrs := range byENI {
		listed, err := i.readENIAddrs(ctx, eniID)
		if err != nil {
			i.log.Warn("reading an ENI to settle unclear trims failed; will retry", "node", n.name, "eni", eniID,
				"ips", len(addrs), "retry_in", trimSettleRetry, "err", err)
			for _, a := range addrs {
				reads.owe(a, eniID, now.Add(trimSettleRetry))
			}
			continue
		}
		i.settleRead(n, eniID, addrs, listed, reads)
	}
}

// readENIAddrs returns the addresses the cloud lists on eniID; none when
// the ENI is gone (its addresses went with it).
func (i *IPAM) readENIAddrs(ctx context.Context, eniID string) (map[netip.Addr]bool, error) {
	listed := map[netip.Addr]bool{}
	e, err := i.deps.Cloud.GetENI(ctx, eniID)
	switch {
	case err == nil:
		for _, p := range e.PrivateIPs {
			if a, perr := netip.ParseAddr(p.Address); perr == nil {
				listed[a.Unmap()] = true
			}
		}
	case errors.Is(err, cloud.ErrENINotFound):
	default:
		return nil, err
	}
	return listed, nil
}

// settleRead settles the owed addresses of one ENI by one read, listed.
func (i *IPAM) settleRead(n *node, eniID string, addrs []netip.Addr, listed map[netip.Addr]bool, reads settleReads) {
	now := i.deps.Clock.Now()
	back, gone := 0, 0
	for _, a := range addrs {
		delete(reads, a)
		if _, err := i.store.Settle(n.name, a, listed[a], now); err != nil {
			i.log.Error("could not settle an unclear trim", "node", n.name, "ip", a, "listed", listed[a], "err", err)
			continue
		}
		if listed[a] {
			back++
		} else {
			gone++
		}
	}
	i.metrics.poolReturned.Add(float64(gone))
	i.log.Info("settled unclear trims by reading the ENI", "node", n.name, "eni", eniID,
		"back_in_pool", back, "deleted", gone)
	if back > 0 {
		n.refill()
	}
}
