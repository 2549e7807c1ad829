package ipam

import (
	"context"
	"net/netip"
	"time"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
)

// BCE's reads lag its writes. Two places depend on that and live here:
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
//     missing read; a cloud address the datastore lacks is adopted on the
//     second read, assigned if a WorkloadEndpoint names it.

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
			if ip.State != datastore.StateHeld || ip.HoldReason != datastore.HoldUnsettled {
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
