// Package datastore is the in-memory IPAM state of the nodes one replica
// owns: node → ENI → secondary IPs, each idle, assigned to a pod sandbox,
// or held. It is pure: no goroutines, clients, logging or clock. Time is
// passed in as now, results come back as values and sentinel errors, and
// the caller does all cloud and API-server I/O (plan, then act).
//
// A replica drives it like this:
//
//	s, _ := datastore.New(datastore.Config{})           // 5s cooldown
//	rep, _ := s.Restore("node-a", in, now)               // on takeover: cloud ENIs + weps
//	for _, c := range rep.Conflicts { emitEvent(c) }     // never resolved silently
//	ip, err := s.Allocate("node-a", datastore.Request{Owner: o}, now) // CNI ADD
//	// errors.Is(err, ErrNoIdleIP): grow the pool (package pool plans it)
//	// *CoolingError: an address becomes usable at ReadyAt
//	s.Release("node-a", ip.Addr, o.ContainerID, now)     // CNI DEL, container-guarded
//	s.AddIPs("node-a", "eni-1", added, now)              // after a cloud batch add
//	held, _ := s.Hold("node-a", excess, datastore.HoldReleasing) // before DeletePrivateIP
//	s.RemoveIP("node-a", a)                              // after the cloud confirmed it
//	s.RemoveNode("node-a")                               // on hand-over; others untouched
//
// Cooling: a released address is not handed out by Allocate until Cooldown
// has passed, even when nothing else is idle; Allocate then returns a
// *CoolingError naming the time the first address is ready. We chose strict
// cooling (as the reference does) because the point of cooling is that the
// old pod's neighbour and conntrack state drains before a stranger gets the
// address; a CNI ADD that waits or retries for at most Cooldown is cheaper
// than misrouted traffic. AllocateSpecific ignores cooling: it is the same
// pod asking for its own fixed address.
//
// Concurrency: a Store is safe for concurrent use with per-node locking.
// Every operation on a node takes only that node's mutex (after a brief
// read lock on the node map), so nodes never wait on each other. Adding or
// removing addresses and ENIs also takes a short cross-node index lock
// that keeps an address or ENI on at most one node; Allocate and Release
// never take it. Lock order is node map, node, index. No lock is held
// between calls, so never hold a result across a cloud call and assume it
// is still true: use Hold to reserve addresses before deleting them.
package datastore
