package shard

import (
	"slices"
	"sort"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"
)

// What the loop sees of the coordination Leases: the partition claims, the
// other replicas' Leases (and since when each is unchanged, by our clock),
// and from those the ring's live members.

// observed is what this replica last saw of another replica's Lease, and
// since when by its own clock: expiry is judged on local time only.
type observed struct {
	version string // "" while absent
	since   time.Time
	leaving bool
	grpc    string
	http    string
	gossip  string
}

// writtenClaim is a claim this replica wrote, kept until the watch shows it:
// replaced is the version the write superseded.
type writtenClaim struct {
	claim    Claim
	replaced string
}

// readLeases sorts the coordination Leases: the partition claims, the
// replica Leases by member, the budget Lease and the balance Lease.
func (c *Coordinator) readLeases(leases []*coordv1.Lease) (
	claims []Claim, present map[string]*coordv1.Lease, budgetLease, balanceLease *coordv1.Lease) {
	claims = make([]Claim, c.cfg.Ring.Partitions)
	present = map[string]*coordv1.Lease{}
	for _, l := range leases {
		switch l.Labels[labelKind] {
		case kindReplica:
			if m := l.Annotations[annoMember]; m != "" {
				present[m] = l
			}
		case kindPartition:
			if p, ok := partitionFromLease(l.Name); ok && p < len(claims) {
				claims[p] = Claim{
					Holder:  ptr.Deref(l.Spec.HolderIdentity, ""),
					Version: l.ResourceVersion,
					Epoch:   int64(ptr.Deref(l.Spec.LeaseTransitions, 0)),
				}
			}
		case kindBudget:
			budgetLease = l
		case kindBalance:
			if l.Name == balanceLeaseName {
				balanceLease = l
			}
		}
	}
	return claims, present, budgetLease, balanceLease
}

// applyWritten lets our own claim writes win over a watch that has not
// caught up with them, forgets writes the watch has shown, and keeps the
// result as the claims view that routing and status read.
func (c *Coordinator) applyWritten(claims []Claim) {
	for p, w := range c.written {
		if claims[p].Version == w.replaced {
			claims[p] = w.claim
		} else {
			delete(c.written, p)
		}
	}
	c.claims = claims
}

// observe records other replicas' Lease versions and when they changed.
func (c *Coordinator) observe(present map[string]*coordv1.Lease, now time.Time) {
	for m, l := range present {
		if m == c.self {
			continue
		}
		o := c.seen[m]
		if o.version != l.ResourceVersion {
			o.version, o.since = l.ResourceVersion, now
		}
		o.leaving = l.Annotations[annoLeaving] == "true"
		o.grpc, o.http, o.gossip = l.Annotations[annoGRPC], l.Annotations[annoHTTP], l.Annotations[annoGossip]
		c.seen[m] = o
	}
	for m, o := range c.seen {
		if _, ok := present[m]; !ok && o.version != "" {
			o.version, o.since = "", now
			c.seen[m] = o
		}
		if _, ok := present[m]; !ok && now.Sub(o.since) > 10*c.cfg.LeaseDuration {
			delete(c.seen, m) // long gone: forget
		}
	}
}

// expired: r's Lease has not changed (or been absent) for a whole
// LeaseDuration on our clock. A replica never seen counts as expired: its
// claim can only be a leftover of a process that is gone.
func (c *Coordinator) expired(r string, now time.Time) bool {
	if r == c.self {
		return false
	}
	o, ok := c.seen[r]
	return !ok || now.Sub(o.since) >= c.cfg.LeaseDuration
}

// liveMembers lists the ring's members: replicas whose Lease is fresh, who
// are not leaving and whom gossip sees, plus this one while its lease is
// valid.
func (c *Coordinator) liveMembers(now time.Time, gossip map[string]bool) []string {
	var live []string
	if now.Before(c.own.LeaseValidUntil()) && !c.leaving {
		live = append(live, c.self)
	}
	for m, o := range c.seen {
		if gossip != nil && !gossip[m] {
			continue
		}
		if o.version != "" && !o.leaving && !c.expired(m, now) {
			live = append(live, m)
		}
	}
	sort.Strings(live)
	return live
}

// freshReplicas counts the replicas with a fresh Lease, this one included,
// ring member or not yet: the per-operation limits are split over them (at
// a cold start that is the safer count).
func (c *Coordinator) freshReplicas(now time.Time) int {
	fresh := 1
	for m, o := range c.seen {
		if o.version != "" && !c.expired(m, now) {
			fresh++
		}
	}
	return fresh
}

// inView lists the replicas this one knows of, by gossip or by a fresh
// Lease, marked by how when they are not ring members: the cold-start
// settle waits for this list to stop changing.
func (c *Coordinator) inView(now time.Time, live []string, gossip map[string]bool) []string {
	in := slices.Clone(live)
	for m, o := range c.seen {
		if o.version != "" && !o.leaving && !c.expired(m, now) && !slices.Contains(live, m) {
			in = append(in, m+"(lease)")
		}
	}
	for m := range gossip {
		if !slices.Contains(live, m) {
			in = append(in, m+"(gossip)")
		}
	}
	sort.Strings(in)
	return in
}

// updateRing rebuilds the ring when the live members changed.
func (c *Coordinator) updateRing(live []string) error {
	if slices.Equal(live, c.live) && (c.ring != nil || len(live) == 0) {
		return nil
	}
	c.log.Info("ring members changed", "members", live, "was", c.live)
	c.live = live
	c.ring = nil
	if len(live) == 0 {
		return nil
	}
	ring, err := NewRing(c.cfg.Ring, live)
	if err != nil {
		return err
	}
	c.ring = ring
	return nil
}
