package shard

import (
	"context"
	"time"

	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

// ENIPrefetcher is a NodeServer that can read the cloud's view of nodes
// ahead of a takeover (ipam.IPAM). When every survivor of a dead replica
// lists ENIs at its takeover, the lists collide at BCE's cluster-wide
// ListENIs limit (about 1/s) and the later ones wait; read ahead, they have
// the lease's remaining wait to spread over. ipamcore/ipam/prefetch.go says
// why a list read before the claim is safe to rebuild from.
type ENIPrefetcher interface {
	// PrefetchENIs lists the nodes' ENIs now, for a takeover of some of
	// them within validFor. It logs and drops a failure.
	PrefetchENIs(ctx context.Context, names []string, validFor time.Duration)
}

// prefetchState is the loop's record of the reads ahead.
type prefetchState struct {
	// done holds, per other replica, the Lease version whose staleness was
	// already read ahead for: one read per silence, not one per step.
	done     map[string]string
	inFlight bool
}

// prefetchForStale reads ahead the ENIs of the nodes held by replicas whose
// Lease has not changed for longer than the renew deadline: such a replica
// has stopped serving by its own clock if it is alive at all, and a survivor
// may take its nodes over once a whole lease duration has passed. Every
// survivor reads the nodes of all its partitions (the ring decides later who
// takes which; the VPC-wide list costs the same pages either way). A
// leaving replica hands over by release and needs none; a replica whose own
// lease is not valid cannot take over. One read at a time.
func (c *Coordinator) prefetchForStale(ctx context.Context, now time.Time, claims []Claim, nodes []string) {
	for m := range c.prefetch.done {
		if _, ok := c.seen[m]; !ok {
			delete(c.prefetch.done, m)
		}
	}
	pf, ok := c.nodes.(ENIPrefetcher)
	if !ok || c.prefetch.inFlight || c.leaving || !now.Before(c.own.LeaseValidUntil()) {
		return
	}
	stale := map[string]bool{}
	for m, o := range c.seen {
		if m == c.self || o.version == "" || o.leaving || now.Sub(o.since) <= c.cfg.RenewDeadline ||
			c.prefetch.done[m] == o.version {
			continue
		}
		stale[m] = true
		c.prefetch.done[m] = o.version
	}
	if len(stale) == 0 {
		return
	}
	var names []string
	for _, n := range nodes {
		if p := PartitionOf(c.cfg.Ring.Partitions, n); p < len(claims) && stale[claims[p].Holder] {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return
	}
	c.prefetch.inFlight = true
	validFor := c.cfg.LeaseDuration
	go func() {
		pf.PrefetchENIs(ctx, names, validFor)
		select {
		case c.results <- func() { c.prefetch.inFlight = false }:
		case <-ctx.Done():
		}
	}()
}

var _ ENIPrefetcher = (*ipam.IPAM)(nil)
