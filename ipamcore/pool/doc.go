// Package pool is the warm-pool arithmetic of the IPAM: pure functions that
// look at one node's counts and return plans. Nothing here calls the cloud,
// sleeps, or reads the clock; the controller carries the plans out and
// feeds the results back (plan, then act).
//
// A controller's per-node loop uses it like this:
//
//	capc, err := pool.CapacityFromAnnotations(node.Annotations, pool.DefaultCapacity())
//	// err: a malformed annotation (report it); capc is usable anyway
//	snap, _ := store.Snapshot(node.Name)
//	st := pool.StateFromSnapshot(snap, exhaustedSubnets)
//	st.Waiting, st.ENIPending = waitingADDs, eniBeingCreated
//	plan := pool.PlanGrow(cfg, capc, st, backoffs, now)
//	for _, a := range plan.Adds {                  // one BatchAddPrivateIP each
//		ips, err := cloud.AddIPs(a.ENIID, a.Count)
//		if isCapacityError(err) { backoffs[a.ENIID] = cfg.Backoff.Fail(backoffs[a.ENIID], a.Count, now); continue }
//		delete(backoffs, a.ENIID); store.AddIPs(node.Name, a.ENIID, ips, now)
//	}
//	if plan.NewENI { createENI(node) }
//	for _, ip := range pool.PlanTrim(cfg, st, now) { ... }
//	// trimming: held := store.Hold(node, addrs, datastore.HoldReleasing);
//	// delete only the held ones, then store.RemoveIP (Unhold when the delete
//	// certainly failed, store.Unsettle and a later store.Settle when its
//	// outcome is unclear).
//
// Bounds: the pool grows when idle < MinIdle (+ waiting allocations) and
// shrinks when idle > MaxIdle (+ waiting); growth never overshoots MaxIdle,
// so the two never fight. An ENI that answered "subnet has no more IP" or
// "VM memory cannot attach more IP" is skipped until its exponential
// backoff expires, and then tried with half the batch that failed.
package pool
