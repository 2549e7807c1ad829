package ipam

import (
	"context"
	"net/netip"
	"time"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
)

// ipDrift is what one node's per-address reconciliation remembers between
// ENI syncs: since when each address has disagreed with the cloud. Only the
// sync loop touches it, under node.mu.
type ipDrift struct {
	absent map[netip.Addr]time.Time // recorded here, not listed by the cloud
	extra  map[netip.Addr]time.Time // listed by the cloud, not recorded here
	warned map[netip.Addr]bool      // assigned and missing: reported once
}

// reconcileIPs compares, address by address, the node's recorded ENIs with
// one cloud read (see settle.go for the rules). Addresses added or removed
// by this replica less than ReadLag ago are left alone: the read may not
// show them yet.
func (i *IPAM) reconcileIPs(ctx context.Context, n *node, inUse []cloud.ENI) {
	snap, err := i.store.Snapshot(n.name)
	if err != nil {
		return
	}
	now := i.deps.Clock.Now()
	listed := listedAddrs(inUse)
	listedENI := map[string]bool{}
	for _, e := range inUse {
		listedENI[e.ID] = true
	}
	recorded := map[netip.Addr]bool{}

	n.mu.Lock()
	d := &n.drift
	if d.absent == nil {
		d.absent, d.extra, d.warned = map[netip.Addr]time.Time{}, map[netip.Addr]time.Time{}, map[netip.Addr]bool{}
	}
	n.mu.Unlock()

	var unheld, dropped int
	for _, es := range snap.ENIs {
		if !listedENI[es.ENI.ID] {
			continue // a vanished ENI is adoptENIs' business
		}
		for _, ip := range es.IPs {
			recorded[ip.Addr] = true
			if listed[ip.Addr] == es.ENI.ID {
				n.mu.Lock()
				since, wasAbsent := d.absent[ip.Addr]
				delete(d.absent, ip.Addr)
				delete(d.warned, ip.Addr)
				n.mu.Unlock()
				if wasAbsent && unsettled(ip) {
					// Held by the read before, listed by this later one:
					// the later read is the truth.
					if _, err := i.store.Settle(n.name, ip.Addr, true, since); err == nil {
						unheld++
						i.metrics.reconciled.WithLabelValues("confirmed").Inc()
					}
				}
				continue
			}
			if now.Sub(ip.AddedAt) < i.cfg.ReadLag {
				continue
			}
			dropped += i.reconcileAbsent(n, d, ip, now)
		}
	}
	// Forget the disagreements of addresses no longer recorded (forgotten,
	// trimmed, moved): the maps would otherwise only grow.
	n.mu.Lock()
	for a := range d.absent {
		if !recorded[a] {
			delete(d.absent, a)
			delete(d.warned, a)
		}
	}
	n.mu.Unlock()
	i.adoptExtras(ctx, n, d, listed, recorded, snap, now)
	if unheld > 0 {
		n.refill()
	}
	if unheld+dropped > 0 {
		n.poke()
	}
}

// reconcileAbsent handles one recorded address the cloud read lacks; it
// returns 1 when the address was forgotten.
func (i *IPAM) reconcileAbsent(n *node, d *ipDrift, ip datastore.IPInfo, now time.Time) int {
	n.mu.Lock()
	since, seen := d.absent[ip.Addr]
	if !seen {
		d.absent[ip.Addr] = now
		since = now
	}
	n.mu.Unlock()
	switch {
	case ip.State == datastore.StateIdle:
		// Never hand out an address the cloud may no longer have; the
		// next read decides.
		if _, err := i.store.Hold(n.name, []netip.Addr{ip.Addr}, datastore.HoldUnsettled); err != nil {
			i.log.Warn("ENI sync: could not hold an address missing from the cloud", "node", n.name, "ip", ip.Addr, "err", err)
		}
	case unsettled(ip):
		if !seen || now.Sub(since) < i.cfg.ReadLag {
			return 0
		}
		if _, err := i.store.Settle(n.name, ip.Addr, false, now); err != nil {
			return 0
		}
		n.mu.Lock()
		delete(d.absent, ip.Addr)
		n.mu.Unlock()
		i.metrics.reconciled.WithLabelValues("gone").Inc()
		i.log.Info("ENI sync: an idle address is gone from the cloud (two reads agree); forgotten",
			"node", n.name, "eni", ip.ENIID, "ip", ip.Addr)
		return 1
	case ip.State == datastore.StateAssigned:
		if !seen || now.Sub(since) < i.cfg.ReadLag {
			return 0
		}
		n.mu.Lock()
		warned := d.warned[ip.Addr]
		d.warned[ip.Addr] = true
		n.mu.Unlock()
		if !warned {
			i.metrics.reconciled.WithLabelValues("assigned_missing").Inc()
			i.nodeEvent(n.name, "AssignedIPMissingFromENI", "%s of %s is not on ENI %s in the cloud", ip.Addr, ip.Owner, ip.ENIID)
			i.log.Error("ENI sync: a pod's address is not on its ENI in the cloud (two reads agree)",
				"node", n.name, "eni", ip.ENIID, "ip", ip.Addr, "owner", ip.Owner.String())
		}
	}
	return 0
}

// adoptExtras records cloud addresses of known ENIs that the datastore
// lacks, once two reads ReadLag apart list them: assigned when a wep on the
// node names the address, held for the running pod that uses it
// (HoldInUse), else held as an orphan (HoldOrphan) for the leaked-IP GC.
func (i *IPAM) adoptExtras(ctx context.Context, n *node, d *ipDrift, listed map[netip.Addr]string, recorded map[netip.Addr]bool,
	snap datastore.NodeSnapshot, now time.Time) {
	known := map[string]bool{}
	subnetOf := map[string]netip.Prefix{}
	for _, es := range snap.ENIs {
		known[es.ENI.ID] = true
		subnetOf[es.ENI.ID] = es.ENI.SubnetCIDR
	}
	var ready []netip.Addr
	n.mu.Lock()
	for a, eniID := range listed {
		if recorded[a] || !known[eniID] {
			continue
		}
		since, ok := d.extra[a]
		if !ok {
			d.extra[a] = now
			continue
		}
		if now.Sub(since) >= i.cfg.ReadLag {
			ready = append(ready, a)
		}
	}
	for a := range d.extra {
		if _, still := listed[a]; !still || recorded[a] {
			delete(d.extra, a)
		}
	}
	n.mu.Unlock()
	if len(ready) == 0 {
		return
	}
	claims, err := i.nodeClaims(ctx, n.name)
	if err != nil {
		i.log.Warn("ENI sync: cannot read the node's weps to adopt unknown cloud addresses", "node", n.name, "err", err)
		return
	}
	owners := map[netip.Addr]datastore.Owner{}
	for _, c := range claims {
		owners[c.Addr] = c.Owner
	}
	users, _ := n.podIPUsers()
	for _, a := range ready {
		if i.mayAct(n.name) != nil {
			return
		}
		eniID := listed[a]
		_, owned := owners[a]
		if cidr := subnetOf[eniID]; !owned && cidr.IsValid() && !cidr.Contains(a) {
			// A cross-subnet (PSTS) address no wep names: an ADD that
			// never recorded it, or a release that forgot it before its
			// cloud delete went through. It can serve no other pod.
			i.deleteStray(ctx, n.name, eniID, a.String())
			n.mu.Lock()
			delete(d.extra, a)
			n.mu.Unlock()
			i.metrics.reconciled.WithLabelValues("deleted_cross_subnet").Inc()
			i.log.Info("ENI sync: deleted a cross-subnet address no wep names (two reads agree)", "node", n.name,
				"eni", eniID, "ip", a)
			continue
		}
		outcome, err := i.recordExtra(n.name, eniID, a, owners, users, now)
		if err != nil {
			i.log.Warn("ENI sync: could not adopt a cloud address", "node", n.name, "eni", eniID, "ip", a, "err", err)
			continue
		}
		n.mu.Lock()
		delete(d.extra, a)
		n.mu.Unlock()
		i.metrics.reconciled.WithLabelValues(outcome).Inc()
		i.log.Info("ENI sync: recorded a cloud address the datastore lacked (two reads agree)", "node", n.name, "eni", eniID, "ip", a,
			"as", outcome)
	}
	n.refill()
}

// recordExtra records one cloud address the datastore lacked: assigned to
// the wep's pod that names it (owners). Unowned, it never joins the pool: a
// running pod may use it (its wep deleted out of band: held for it, users),
// or something outside the IPAM; the leaked-IP GC deletes such an orphan
// after its grace (leaked.go). It returns the outcome for the metric.
func (i *IPAM) recordExtra(node, eniID string, a netip.Addr, owners map[netip.Addr]datastore.Owner,
	users map[netip.Addr]datastore.PodKey, now time.Time) (string, error) {
	if o, owned := owners[a]; owned {
		_, err := i.store.AddAssignedIP(node, eniID, a, o, now)
		return "adopted", err
	}
	if user, used := users[a]; used {
		_, err := i.store.AddHeldIP(node, eniID, a, datastore.HoldInUse, now)
		if err == nil {
			i.heldInUse(node, a, user, "ENI sync")
		}
		return "held_in_use", err
	}
	_, err := i.store.AddHeldIP(node, eniID, a, datastore.HoldOrphan, now)
	return "orphan", err
}
