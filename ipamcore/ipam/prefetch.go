package ipam

import (
	"context"
	"sync"
	"time"

	"github.com/cce-ipam/sharded/cloud"
)

// A takeover's ENI list, read ahead of the takeover.
//
// When a replica dies, every survivor takes some of its nodes over at the
// same moment, and each rebuild starts with a VPC-wide ENI list. BCE allows
// ListENIs about once a second for the whole cluster, so the survivors'
// lists collide: measured with 3 replicas, the second survivor's list was
// turned away and served 1.4–2.7 s after the first, most of its failover
// once the lease wait was short. The shard layer sees the death coming (the
// holder's Lease stops changing well before a survivor may take over), so
// it asks for the list then (PrefetchENIs), and a takeover of those nodes
// starts from it.
//
// Why a list taken before the claim is as good as one taken after it: the
// rebuild never trusts a list for what it lacks or for an address no wep
// claims. The weps, the commit points, are still read after the claim; an
// address the list shows and no wep claims is held unsettled until the
// settle list, taken --cloud-read-lag after the takeover began, confirms
// it; an ENI or address the list misses is adopted by the ENI sync once two
// reads agree. A list taken before the claim is therefore one more lagging
// read, which BCE's own read lag makes any list already (shard/DESIGN.md, I2).

// prefetchedENIs is the last list read ahead, and the instances it covers
// (nil: every instance).
type prefetchedENIs struct {
	until      time.Time
	instances  map[string]bool
	byInstance map[string][]cloud.ENI
}

type prefetchSlot struct {
	mu  sync.Mutex
	got *prefetchedENIs
}

// PrefetchENIs lists the ENIs of the named nodes now, for a takeover of
// some of them within validFor (shard.ENIPrefetcher). A failure is only
// logged: the takeover then lists as it would have.
func (i *IPAM) PrefetchENIs(ctx context.Context, names []string, validFor time.Duration) {
	if len(names) == 0 || validFor <= 0 {
		return
	}
	select {
	case <-i.ready: // the Node informer names the instances
	case <-ctx.Done():
		return
	}
	instances := i.instancesOf(names)
	// Urgent as a takeover's own list: pods will wait on it.
	enis, err := i.deps.Cloud.ListENIs(cloud.Urgent(ctx), cloud.ListENIsOptions{VPCID: i.cfg.VPCID,
		NamePrefix: i.cfg.ClusterID + "/", Instances: instances})
	if err != nil {
		i.log.Warn("reading ENIs ahead of a takeover failed; a takeover lists them itself", "nodes", len(names), "err", err)
		return
	}
	i.prefetched.mu.Lock()
	i.prefetched.got = &prefetchedENIs{
		until:      i.deps.Clock.Now().Add(validFor),
		instances:  instances,
		byInstance: byInstanceOf(enis),
	}
	i.prefetched.mu.Unlock()
	i.metrics.prefetches.Inc()
	i.log.Info("read ENIs ahead of a takeover", "nodes", len(names), "enis", len(enis), "valid_for", validFor)
}

// validPrefetch returns the list read ahead while it may still be used.
func (i *IPAM) validPrefetch() *prefetchedENIs {
	i.prefetched.mu.Lock()
	p := i.prefetched.got
	i.prefetched.mu.Unlock()
	if p == nil || !i.deps.Clock.Now().Before(p.until) {
		return nil
	}
	return p
}

// splitPrefetched splits todo into the nodes a valid list read ahead covers
// and the rest, and returns that list (nil, and every node in rest, when
// there is none).
func (i *IPAM) splitPrefetched(todo []string) (listed map[string][]cloud.ENI, covered, rest []string) {
	p := i.validPrefetch()
	if p == nil {
		return nil, nil, todo
	}
	for _, n := range todo {
		id, known := i.instanceOf(n)
		if p.instances == nil || (known && p.instances[id]) {
			covered = append(covered, n)
		} else {
			rest = append(rest, n)
		}
	}
	return p.byInstance, covered, rest
}

// byInstanceOf groups attached ENIs by instance.
func byInstanceOf(enis []cloud.ENI) map[string][]cloud.ENI {
	out := map[string][]cloud.ENI{}
	for _, e := range enis {
		if e.InstanceID != "" {
			out[e.InstanceID] = append(out[e.InstanceID], e)
		}
	}
	return out
}
