package ipam

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
)

// Per-ENI backoff after "subnet has no more IP" or "VM memory cannot attach
// more IP": 2s doubling to 60s, as the reference, so an exhausted ENI is not
// hammered while others may still grow.
const (
	backoffFirst = 2 * time.Second
	backoffMax   = 60 * time.Second
)

// poolWorker keeps one node's pool within [IdleMin, IdleMax]. It wakes on a
// poke (an allocation found the pool empty, a release overfilled it) and
// every PoolCheckPeriod. It is the only goroutine that calls the cloud for
// this node's pool, so nodes grow in parallel and one node never races
// itself.
func (i *IPAM) poolWorker(ctx context.Context, n *node) {
	tick := i.deps.Clock.NewTicker(i.cfg.PoolCheckPeriod)
	defer tick.Stop()
	n.poke() // bring a fresh node up to IdleMin at once
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.wake:
		case <-tick.C():
		}
		i.balance(ctx, n)
	}
}

// balance runs one round: grow while short, else trim while over.
func (i *IPAM) balance(ctx context.Context, n *node) {
	for ctx.Err() == nil {
		st, err := i.store.Stats(n.name, i.deps.Clock.Now())
		if err != nil {
			return // the node was dropped
		}
		need := i.cfg.IdleMin - st.Idle + n.waiters()
		if need > 0 {
			if !i.grow(ctx, n, st, need) {
				return
			}
			continue
		}
		if excess := st.Idle - st.Cooling - i.cfg.IdleMax; excess > 0 {
			i.trim(ctx, n, excess)
		}
		i.returnQueued(ctx, n)
		return
	}
}

// grow adds IPs on the ENI with the fewest addresses that may grow. It
// returns false when no ENI could take more (the caller stops the round).
func (i *IPAM) grow(ctx context.Context, n *node, st datastore.NodeStats, need int) bool {
	now := i.deps.Clock.Now()
	for _, e := range i.growOrder(n, st, now) {
		count := max(need, i.cfg.BatchAdd)
		if n.maxIPs > 0 {
			count = min(count, n.maxIPs-e.total)
		}
		count = min(count, cloud.MaxBatchIPs)
		for count > 0 {
			addrs, err := i.deps.Cloud.BatchAddPrivateIPs(ctx, e.id, cloud.BatchAddRequest{Count: count})
			if err == nil {
				i.addToStore(ctx, n, e.id, addrs)
				n.clearBackoff(e.id)
				return true
			}
			n.setLastError(err)
			i.metrics.poolErrors.WithLabelValues(cloud.ClassOf(err).String()).Inc()
			switch {
			case errors.Is(err, cloud.ErrSubnetHasNoMoreIP), errors.Is(err, cloud.ErrVMMemoryCannotAttachMoreIP):
				// Maybe a smaller batch still fits; then back off the ENI.
				if count > 1 {
					count /= 2
					continue
				}
				n.backOff(e.id, now)
			case errors.Is(err, cloud.ErrRateLimit):
				// The client already waited for tokens; pause before the
				// next ENI so a throttled cloud is not stormed.
				i.sleep(ctx, time.Duration(200+rand.IntN(1000))*time.Millisecond)
			default:
				i.log.Warn("growing the pool failed", "node", n.name, "eni", e.id, "err", err)
			}
			break
		}
	}
	return false
}

type eniLoad struct {
	id    string
	total int
}

// growOrder lists ENIs that may grow, fewest addresses first (spreads IPs and
// keeps each ENI under its memory cap longest).
func (i *IPAM) growOrder(n *node, st datastore.NodeStats, now time.Time) []eniLoad {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []eniLoad
	for _, e := range st.ENIs {
		if b, ok := n.backoff[e.ID]; ok && now.Before(b.until) {
			continue
		}
		total := e.Total + 1 // the primary IP counts against the cap
		if n.maxIPs > 0 && total >= n.maxIPs {
			continue
		}
		out = append(out, eniLoad{id: e.ID, total: total})
	}
	slices.SortFunc(out, func(a, b eniLoad) int { return a.total - b.total })
	return out
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

// trim returns the longest-idle addresses above IdleMax to the cloud. They
// are held first so that no allocation can take one mid-call.
func (i *IPAM) trim(ctx context.Context, n *node, excess int) {
	snap, err := i.store.Snapshot(n.name)
	if err != nil {
		return
	}
	var idle []datastore.IPInfo
	now := i.deps.Clock.Now()
	for _, e := range snap.ENIs {
		for _, ip := range e.IPs {
			if ip.State == datastore.StateIdle && !ip.Cooling(now) {
				idle = append(idle, ip)
			}
		}
	}
	slices.SortFunc(idle, func(a, b datastore.IPInfo) int { return a.IdleSince.Compare(b.IdleSince) })
	if len(idle) > excess {
		idle = idle[:excess]
	}
	byENI := map[string][]netip.Addr{}
	for _, ip := range idle {
		byENI[ip.ENIID] = append(byENI[ip.ENIID], ip.Addr)
	}
	for eniID, addrs := range byENI {
		held, err := i.store.Hold(n.name, addrs, datastore.HoldReleasing)
		if err != nil || len(held) == 0 {
			continue
		}
		i.deleteFromCloud(ctx, n, eniID, held)
	}
}

// deleteFromCloud deletes held addresses from the cloud and then forgets
// them; on failure they are put back into the pool.
func (i *IPAM) deleteFromCloud(ctx context.Context, n *node, eniID string, held []netip.Addr) {
	for chunk := range slices.Chunk(held, cloud.MaxBatchIPs) {
		strs := make([]string, len(chunk))
		for k, a := range chunk {
			strs[k] = a.String()
		}
		err := i.deps.Cloud.BatchDeletePrivateIPs(ctx, eniID, strs)
		if err != nil && !errors.Is(err, cloud.ErrPrivateIPNotFound) {
			n.setLastError(err)
			for _, a := range chunk {
				if _, uerr := i.store.Unhold(n.name, a, nil, i.deps.Clock.Now()); uerr != nil {
					i.log.Error("could not return a held IP to the pool", "node", n.name, "ip", a, "err", uerr)
				}
			}
			continue
		}
		for _, a := range chunk {
			if _, err := i.store.RemoveIP(n.name, a); err != nil {
				i.log.Error("could not forget a deleted IP", "node", n.name, "ip", a, "err", err)
			}
		}
		i.metrics.poolReturned.Add(float64(len(chunk)))
	}
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
		strs := make([]string, len(addrs))
		for k, a := range addrs {
			strs[k] = a.String()
		}
		if err := i.deps.Cloud.BatchDeletePrivateIPs(ctx, eniID, strs); err != nil && !errors.Is(err, cloud.ErrPrivateIPNotFound) {
			i.log.Warn("returning cross-subnet IPs failed; leaked-IP GC will reclaim them", "eni", eniID, "err", err)
		}
	}
}

func (n *node) backOff(eniID string, now time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	b := n.backoff[eniID]
	b.step = min(max(b.step*2, backoffFirst), backoffMax)
	b.until = now.Add(b.step)
	n.backoff[eniID] = b
}

func (n *node) clearBackoff(eniID string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.backoff, eniID)
	n.lastErr = nil
}

func (n *node) setLastError(err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.lastErr = err
}

// lastError is the pool's last cloud error, so that an allocation that gives
// up can say why the pool is empty.
func (n *node) lastError() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lastErr == nil {
		return errors.New("the pool worker has not added IPs yet")
	}
	return n.lastErr
}

func (i *IPAM) sleep(ctx context.Context, d time.Duration) {
	t := i.deps.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C():
	}
}
