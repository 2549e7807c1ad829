package suite

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cce-ipam/sharded/e2e/fleet"
)

// Ownership is one scrape of every running replica's shard gauges.
type Ownership struct {
	// Owned and Members are by replica index.
	Owned, Members map[int]int
	// Total is the sum of Owned.
	Total int
}

func (o Ownership) String() string {
	var parts []string
	for i := range 64 {
		if n, ok := o.Owned[i]; ok {
			parts = append(parts, fmt.Sprintf("r%d: %d nodes, sees %d members", i, n, o.Members[i]))
		}
	}
	return strings.Join(parts, "; ")
}

// ScrapeOwnership reads cce_ipam_shard_owned_nodes and
// cce_ipam_shard_members from every running, not removed replica.
func ScrapeOwnership(ctx context.Context, f *fleet.Fleet) (Ownership, error) {
	o := Ownership{
		Owned:   map[int]int{},
		Members: map[int]int{},
	}
	for _, r := range f.Live() {
		if !r.Running() {
			continue
		}
		ss, err := r.Metrics(ctx)
		if err != nil {
			return o, err
		}
		owned, ok1 := ss.Sum("cce_ipam_shard_owned_nodes", nil)
		members, ok2 := ss.Sum("cce_ipam_shard_members", nil)
		if !ok1 || !ok2 {
			return o, fmt.Errorf("replica %d exports no shard gauges", r.Index())
		}
		o.Owned[r.Index()], o.Members[r.Index()] = int(owned), int(members)
		o.Total += int(owned)
	}
	return o, nil
}

// WaitSharded waits until every running replica sees exactly the running
// replicas as members and the replicas together own every one of the
// fleet's nodes exactly once (by count), and returns that ownership.
func WaitSharded(ctx context.Context, t testing.TB, f *fleet.Fleet) Ownership {
	t.Helper()
	var last Ownership
	var lastErr error
	for {
		nodes := len(f.Nodes())
		o, err := ScrapeOwnership(ctx, f)
		last, lastErr = o, err
		if err == nil && o.Total == nodes && len(o.Owned) > 0 {
			settled := true
			for _, m := range o.Members {
				settled = settled && m == len(o.Owned)
			}
			// And the hand-overs are done: every live member holds what
			// the ring gives it (just after a join, the old owners still
			// serve everything).
			for _, r := range f.Live() {
				if settled && r.Running() {
					if err := converged(ctx, r); err != nil {
						settled, lastErr = false, err
					}
				}
			}
			if settled {
				return o
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("replicas did not settle on %d nodes: %v; last: %s (%v)", nodes, ctx.Err(), last, lastErr)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// converged asks a replica's /shard/status whether every live member holds
// the partitions the ring gives it.
func converged(ctx context.Context, r *fleet.Replica) error {
	st, err := r.ShardStatus(ctx)
	if err != nil {
		return err
	}
	for _, m := range st.Members {
		if m.Live && m.HeldPartitions != m.RingPartitions {
			return fmt.Errorf("replica %d sees %s holding %d partitions, the ring gives it %d",
				r.Index(), m.Name, m.HeldPartitions, m.RingPartitions)
		}
	}
	return nil
}
