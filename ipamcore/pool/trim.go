package pool

import (
	"cmp"
	"slices"
	"time"
)

// PlanTrim picks idle addresses to return to the cloud when the node holds
// more than MaxIdle (plus what waiting allocations will take). The
// reference never trimmed, so a burst left addresses parked forever.
//
// Candidates exclude addresses that are still cooling (returning one would
// let the cloud hand it to another node while the old pod's state drains)
// and addresses younger than MinLifetime. Among the rest, the ones idle
// longest go first (ties by address, for determinism), at most TrimBatch.
//
// The caller must Hold the returned addresses in the datastore before
// deleting them, and delete only those Hold returns.
func PlanTrim(cfg Config, st NodeState, now time.Time) []IdleIP {
	excess := len(st.IdleIPs) - cfg.MaxIdle - st.Waiting
	if excess <= 0 {
		return nil
	}
	var cands []IdleIP
	for _, ip := range st.IdleIPs {
		if ip.ReadyAt.After(now) || now.Sub(ip.AddedAt) < cfg.MinLifetime {
			continue
		}
		cands = append(cands, ip)
	}
	slices.SortFunc(cands, func(a, b IdleIP) int {
		return cmp.Or(a.IdleSince.Compare(b.IdleSince), a.Addr.Compare(b.Addr))
	})
	return cands[:min(excess, cfg.TrimBatch, len(cands))]
}
