package ipam

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/clock"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
	"github.com/cce-ipam/sharded/ipamcore/pool"
)

// poolWorker keeps one node's pool within [IdleMin, IdleMax]. It wakes on a
// poke (an allocation found the pool empty, a release overfilled it) and
// every PoolCheckPeriod. It is the only goroutine that calls the cloud for
// this node's pool, so nodes grow in parallel and one node never races
// itself. The decisions are package pool's plans; this only carries them out.
func (i *IPAM) poolWorker(ctx context.Context, n *node) {
	// Every cloud call of the worker is made for the node: it carries the
	// node's permission (see cloudfence.go).
	ctx = i.forNode(ctx, n.name)
	tick := i.deps.Clock.NewTicker(i.cfg.PoolCheckPeriod)
	defer tick.Stop()
	reads := settleReads{}
	n.poke() // bring a fresh node up to IdleMin at once
	for {
		// Wake for the earliest settling read too: the ticker may be
		// far away, and unsettled addresses are out of the pool.
		var settle <-chan time.Time
		var timer clock.Timer
		if due, ok := reads.next(); ok {
			timer = i.deps.Clock.NewTimer(max(due.Sub(i.deps.Clock.Now()), 0))
			settle = timer.C()
		}
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return
		case <-n.wake:
		case <-tick.C():
		case <-settle:
		}
		if timer != nil {
			timer.Stop()
		}
		i.settleTrims(ctx, n, reads)
		i.balance(ctx, n, reads)
	}
}

// balance grows the pool while plans say so and calls succeed, then trims
// what exceeds IdleMax and returns queued cross-subnet addresses.
func (i *IPAM) balance(ctx context.Context, n *node, reads settleReads) {
	for round := 0; round < 10 && ctx.Err() == nil; round++ {
		if i.mayAct(n.name) != nil {
			return // the node is moving away; the next owner keeps its pool
		}
		st, ok := i.poolState(n, reads)
		if !ok {
			return // the node was dropped
		}
		now := i.deps.Clock.Now()
		plan := pool.PlanGrow(i.poolCfg, n.capacity, st, n.backoffs(), now)
		if plan.Need == 0 {
			if trim := pool.PlanTrim(i.poolCfg, st, now); len(trim) > 0 {
				i.trim(ctx, n, trim, reads)
			}
			i.returnQueued(ctx, n)
			return
		}
		if plan.NewENI && plan.WaitingShort > 0 && len(plan.Adds) > 0 {
			// Allocations are waiting that the attached ENIs cannot serve
			// even once full: the next ENI is created on the side while
			// the adds fill them, so a burst's attach overlaps its adds
			// instead of following them.
			i.startENICreation(ctx, n.name, plan.ENIReason, false)
		}
		grew := i.grow(ctx, n, plan.Adds)
		if plan.NewENI && !grew {
			if !i.tryCreateENI(ctx, n, plan.ENIReason) {
				return
			}
			continue
		}
		if !grew {
			return
		}
	}
}

// tryCreateENI creates an ENI on the pool worker unless one is being
// created for the node already (ahead of demand, eniahead.go) or a recent
// attempt failed (backing off 10s, then 20s, … up to 5m, so a broken subnet
// is not hammered).
func (i *IPAM) tryCreateENI(ctx context.Context, n *node, reason string) bool {
	if !n.beginENI(i.deps.Clock.Now()) {
		return false
	}
	i.log.Info("node needs another ENI", "node", n.name, "reason", reason)
	err := i.createENI(ctx, n, true)
	n.endENI(i.deps.Clock.Now(), reason, err)
	return err == nil
}

// beyondRoom is how many addresses a new ENI of n is created holding: what
// the pool wants that the attached ENIs cannot take even once full
// (pool.GrowPlan.BeyondRoom), computed at the creation itself, since a
// burst's allocations keep arriving after the plan that asked for the ENI
// (the first plan of a 14-pod burst saw 1 waiting). The pool worker's
// unsettled trims are counted as idle here (their record is the worker's
// own): at worst the ENI brings fewer, and batch adds bring the rest.
func (i *IPAM) beyondRoom(n *node) int {
	st, ok := i.poolState(n, nil)
	if !ok {
		return 0
	}
	return pool.PlanGrow(i.poolCfg, n.capacity, st, n.backoffs(), i.deps.Clock.Now()).BeyondRoom
}

// beginENI claims the node's one ENI creation: false while another runs or
// a failed one backs off. endENI must follow a true.
func (n *node) beginENI(now time.Time) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.creatingENI || n.eniRetryAt.After(now) {
		return false
	}
	n.creatingENI = true
	return true
}

// endENI ends the creation beginENI claimed, backing off after a failure.
func (n *node) endENI(now time.Time, reason string, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.creatingENI = false
	if err != nil {
		n.eniBackoff = min(max(2*n.eniBackoff, 10*time.Second), 5*time.Minute)
		n.eniRetryAt = now.Add(n.eniBackoff)
		n.planNote = fmt.Sprintf("node needs another ENI (%s): %v", reason, err)
		return
	}
	n.eniBackoff, n.eniRetryAt, n.planNote = 0, time.Time{}, ""
}

// eniCreating reports an ENI creation in progress for the node.
func (n *node) eniCreating() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.creatingENI
}

// poolState is what the planner sees of n. The addresses of this worker's
// own unclear trims are held unsettled, which the planner counts as idle;
// they are taken out of that count again: the pool asked for them to go, and
// the delete most likely went through, so waiting pods must not wait for
// their settling read.
func (i *IPAM) poolState(n *node, reads settleReads) (pool.NodeState, bool) {
	snap, err := i.store.Snapshot(n.name)
	if err != nil {
		return pool.NodeState{}, false
	}
	st := pool.StateFromSnapshot(snap, i.exhaustedSubnets())
	st = reads.uncount(st, snap)
	st.Waiting = n.waiters()
	st.ENIPending = n.eniCreating()
	if now := i.deps.Clock.Now(); st.Waiting > 0 && now.Before(n.takenOverUntil) {
		st = pool.UsableNow(st, snap, now)
	}
	return st, true
}

// exhaustedSubnets are the subnets whose Subnet resource says they have no
// free IP (kept current by package subnet): the planner skips their ENIs.
func (i *IPAM) exhaustedSubnets() map[string]bool {
	list, err := i.subnets.List(labels.Everything())
	if err != nil {
		return nil
	}
	out := map[string]bool{}
	for _, s := range list {
		if s.Status.HasNoMoreIP {
			out[s.Name] = true
		}
	}
	return out
}

// grow carries out a plan's adds; it reports whether any IPs were added.
// A capacity error halves the batch at once (4 → 2 → 1, as the reference:
// the ENI or subnet may still have room for fewer); only when a single IP
// does not fit is the ENI backed off.
func (i *IPAM) grow(ctx context.Context, n *node, adds []pool.Add) bool {
	added := false
	for _, add := range adds {
		for count := add.Count; count > 0; {
			addrs, err := i.deps.Cloud.BatchAddPrivateIPs(ctx, add.ENIID, cloud.BatchAddRequest{Count: count})
			if err == nil {
				i.addToStore(ctx, n, add.ENIID, addrs)
				n.setBackoff(add.ENIID, pool.Backoff{})
				added = true
				break
			}
			n.setCloudError(err)
			i.metrics.poolErrors.WithLabelValues(cloud.ClassOf(err).String()).Inc()
			switch {
			case errors.Is(err, cloud.ErrSubnetHasNoMoreIP), errors.Is(err, cloud.ErrVMMemoryCannotAttachMoreIP):
				if count > 1 {
					count /= 2
					continue
				}
				n.setBackoff(add.ENIID, i.poolCfg.Backoff.Fail(n.backoffs()[add.ENIID], 1, i.deps.Clock.Now()))
				if errors.Is(err, cloud.ErrSubnetHasNoMoreIP) {
					// Not even one address: say so on the Subnet, so that new
					// ENIs and PSTS pods skip it until the Subnet controller
					// sees addresses free again (the reference meant to and
					// wrote the object back unchanged).
					i.declareNoMoreIP(ctx, i.eniSubnet(n.name, add.ENIID), err)
				}
			case errors.Is(err, cloud.ErrRateLimit):
				// The client already backed off; pause before the next
				// call so a throttled cloud is not stormed.
				i.sleep(ctx, time.Duration(200+rand.IntN(1000))*time.Millisecond)
				return added
			default:
				i.log.Warn("growing the pool failed", "node", n.name, "eni", add.ENIID, "err", err)
			}
			break
		}
	}
	return added
}

// addToStore records IPs the cloud confirmed. Should the store refuse one
// (it cannot, unless the cloud handed out an address we hold elsewhere), the
// address is returned to the cloud so nothing leaks.
func (i *IPAM) addToStore(ctx context.Context, n *node, eniID string, addrs []string) {
	parsed := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		p, err := netip.ParseAddr(a)
		if err != nil {
			i.log.Error("cloud returned an unparsable address", "eni", eniID, "ip", a)
			continue
		}
		parsed = append(parsed, p)
	}
	if err := i.store.AddIPs(n.name, eniID, parsed, i.deps.Clock.Now()); err != nil {
		i.log.Error("datastore refused cloud-confirmed IPs; returning them to the cloud", "node", n.name, "eni", eniID, "err", err)
		if derr := i.deps.Cloud.BatchDeletePrivateIPs(ctx, eniID, addrs); derr != nil {
			i.log.Error("returning refused IPs failed; leaked-IP GC will reclaim them", "eni", eniID, "err", derr)
		}
		return
	}
	i.metrics.poolAdded.Add(float64(len(parsed)))
	n.refill()
}

// trim returns planned idle addresses to the cloud. They are held first so
// that no allocation can take one while the delete is in flight.
func (i *IPAM) trim(ctx context.Context, n *node, plan []pool.IdleIP, reads settleReads) {
	byENI := map[string][]netip.Addr{}
	for _, ip := range plan {
		byENI[ip.ENIID] = append(byENI[ip.ENIID], ip.Addr)
	}
	for eniID, addrs := range byENI {
		held, err := i.store.Hold(n.name, addrs, datastore.HoldReleasing)
		if err != nil || len(held) == 0 {
			continue
		}
		i.deleteFromCloud(ctx, n, eniID, held, reads)
	}
}

// deleteFromCloud deletes held addresses from the cloud and then forgets
// them. A failure that certainly changed nothing puts them back into the
// pool. One whose outcome is unclear (a 5xx, a timeout or reset after the
// request went out: BCE may have applied the delete) marks them unsettled
// in the datastore (HoldUnsettled, as an unclear fixed-IP delete or a
// takeover's unconfirmed address), and reads records the GetENI that
// settles them ReadLag later (settle.go): handing out an address that is
// no longer on the ENI would give a pod an IP that does not route, or one
// the subnet gives to someone else.
func (i *IPAM) deleteFromCloud(ctx context.Context, n *node, eniID string, held []netip.Addr, reads settleReads) {
	for chunk := range slices.Chunk(held, cloud.MaxBatchIPs) {
		err := i.batchDelete(ctx, eniID, chunk)
		if err == nil {
			for _, a := range chunk {
				if _, err := i.store.RemoveIP(n.name, a); err != nil {
					i.log.Error("could not forget a deleted IP", "node", n.name, "ip", a, "err", err)
				}
			}
			i.metrics.poolReturned.Add(float64(len(chunk)))
			continue
		}
		n.setCloudError(err)
		class := cloud.ClassOf(err)
		i.metrics.poolErrors.WithLabelValues(class.String()).Inc()
		if deleteNotApplied(err) {
			i.log.Warn("trimming the pool failed; the IPs stay in the pool", "node", n.name, "eni", eniID,
				"ips", len(chunk), "class", class.String(), "err", err)
			for _, a := range chunk {
				if _, uerr := i.store.Unhold(n.name, a, nil, i.deps.Clock.Now()); uerr != nil {
					i.log.Error("could not return a held IP to the pool", "node", n.name, "ip", a, "err", uerr)
				}
			}
			continue
		}
		due := i.deps.Clock.Now().Add(i.cfg.ReadLag)
		for _, a := range chunk {
			if uerr := i.store.Unsettle(n.name, a); uerr != nil {
				i.log.Error("could not mark an IP unsettled", "node", n.name, "ip", a, "err", uerr)
				continue
			}
			reads.owe(a, eniID, due)
		}
		i.log.Warn("trimming the pool had an unclear outcome; the IPs stay out of the pool until a read of the ENI settles them",
			"node", n.name, "eni", eniID, "ips", chunk, "class", class.String(), "settle_in", i.cfg.ReadLag, "err", err)
	}
}

// deleteNotApplied reports whether a failed delete certainly changed
// nothing in the cloud: BCE refused it before acting (throttled, invalid,
// unauthorised, over a quota) or this client never sent it (a NoWait call
// skipped for want of a token). Anything else (a 5xx, a transport error,
// a context that ended while the request may have been out, an unknown
// failure) may have been applied.
func deleteNotApplied(err error) bool {
	switch cloud.ClassOf(err) {
	case cloud.ClassRateLimit, cloud.ClassInvalidRequest, cloud.ClassAuth, cloud.ClassQuotaExceeded:
		return true
	case cloud.ClassCanceled:
		return errors.Is(err, cloud.ErrWouldWait)
	}
	return false
}

// queueReturn schedules a cross-subnet address (already forgotten by the
// store) for deletion from the cloud by the pool worker.
func (n *node) queueReturn(addr netip.Addr, eniID string) {
	n.mu.Lock()
	if n.returns == nil {
		n.returns = map[string][]netip.Addr{}
	}
	n.returns[eniID] = append(n.returns[eniID], addr)
	n.mu.Unlock()
	n.poke()
}

func (i *IPAM) returnQueued(ctx context.Context, n *node) {
	n.mu.Lock()
	queued := n.returns
	n.returns = nil
	n.mu.Unlock()
	for eniID, addrs := range queued {
		for chunk := range slices.Chunk(addrs, cloud.MaxBatchIPs) {
			if err := i.batchDelete(ctx, eniID, chunk); err != nil {
				// The store no longer knows them: keep them queued, or
				// nothing would ever return them.
				i.log.Warn("returning cross-subnet IPs failed; will retry", "eni", eniID, "err", err)
				n.mu.Lock()
				if n.returns == nil {
					n.returns = map[string][]netip.Addr{}
				}
				n.returns[eniID] = append(n.returns[eniID], chunk...)
				n.mu.Unlock()
			}
		}
	}
}

// batchDelete deletes up to MaxBatchIPs addresses of one ENI; addresses the
// cloud no longer has count as deleted.
func (i *IPAM) batchDelete(ctx context.Context, eniID string, addrs []netip.Addr) error {
	strs := make([]string, len(addrs))
	for k, a := range addrs {
		strs[k] = a.String()
	}
	err := i.deps.Cloud.BatchDeletePrivateIPs(ctx, eniID, strs)
	if errors.Is(err, cloud.ErrPrivateIPNotFound) {
		return nil
	}
	return err
}

func (n *node) setBackoff(eniID string, b pool.Backoff) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if b == (pool.Backoff{}) {
		delete(n.backoff, eniID)
		n.lastErr, n.planNote = nil, ""
		return
	}
	n.backoff[eniID] = b
}

func (n *node) backoffs() map[string]pool.Backoff {
	n.mu.Lock()
	defer n.mu.Unlock()
	return maps.Clone(n.backoff)
}

func (n *node) setCloudError(err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.lastErr = err
}

// lastError says why the pool is empty: the last cloud error and what the
// planner would need, so that an allocation that gives up can tell the pod.
func (n *node) lastError() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.lastErr != nil && n.planNote != "":
		return fmt.Errorf("%w; %s", n.lastErr, n.planNote)
	case n.lastErr != nil:
		return n.lastErr
	case n.planNote != "":
		return errors.New(n.planNote)
	}
	return errors.New("the pool worker has not added IPs yet")
}

func (i *IPAM) sleep(ctx context.Context, d time.Duration) {
	t := i.deps.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C():
	}
}
