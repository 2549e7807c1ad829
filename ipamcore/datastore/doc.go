// Package datastore is the in-memory IPAM state of the nodes one replica
// owns: node → ENI → secondary IPs, each idle, assigned to a pod sandbox,
// or held. It is pure: no goroutines, clients, logging or clock; time comes
// in as now, results go out as values and sentinel errors, and the caller
// does all cloud and API-server I/O (plan, then act).
//
//	s, _ := datastore.New(datastore.DefaultConfig())  // 5s cooldown
//	rep, _ := s.Restore(node, in, now)                 // takeover: cloud ENIs + weps
//	for _, c := range rep.Conflicts { event(c) }       // reported, never resolved here
//	ip, err := s.Allocate(node, datastore.Request{Owner: o}, now) // CNI ADD
//	// ErrNoIdleIP: grow the pool (package pool); *CoolingError: retry at ReadyAt
//	s.Release(node, ip.Addr, o.ContainerID, now)       // CNI DEL, container-guarded
//	s.AddIPs(node, "eni-1", added, now)                // after a cloud batch add
//	held, _ := s.Hold(node, excess, datastore.HoldReleasing) // before DeletePrivateIP
//	s.RemoveIP(node, a)                                // after the cloud confirmed it
//	s.RemoveNode(node)                                 // hand-over; other nodes untouched
//
// Cooling is strict, as in the reference: Allocate never hands out an
// address released less than Cooldown ago, even when nothing else is idle,
// because the old pod's neighbour and conntrack state must drain before a
// stranger gets it; a CNI ADD waiting at most Cooldown is cheaper than
// misrouted traffic. AllocateSpecific ignores cooling (the same pod wants
// its own fixed address back).
//
// Concurrency: a Store is safe for concurrent use with per-node locking.
// Operations on a node take only that node's mutex after a brief read of
// the node map, so nodes never wait on each other; AddNode, RemoveNode and
// Restore write the map. Adding or removing addresses and ENIs also takes a
// short index lock that keeps each on one node; Allocate and Release never
// do. No lock outlives a call: Hold addresses before deleting them.
package datastore
