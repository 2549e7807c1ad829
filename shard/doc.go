// Package shard decides which cce-ipam replica serves which node, and routes
// CNI calls there.
//
// The pure parts: a consistent-hash Ring over the live members
// (buraksezer/consistent v1.0.0 with xxhash, a prime partition count and
// bounded load) that maps node → partition → owner, Ring.Balanced that
// evens out the members' shares of nodes given per-partition node counts,
// Table and Diff; Balancer, which decides when this replica publishes the
// node counts every replica balances with (the first live member, when the
// shares drift; a PublishBalance) and gives the table they balance to;
// Ownership, the state machine of one replica: it takes what the replica
// observed (a View: that table, the partition claims, the replicas in view,
// its budget share, the nodes still stopping, the time; and each lease
// renewal) and returns the Actions to carry out (claim, serve, stop,
// release), deciding the cold-start hold, the lapse rule and the release of
// orphaned claims on the way; and the plan of which nodes to start and stop.
//
// The driver, Coordinator, runs them against Leases in the API server
// (replica Leases, partition claims by compare-and-swap, the published node
// counts, the budget split) on one goroutine, and tells the IPAM which nodes
// to serve. It publishes its state as an immutable snapshot in a Fence, which
// answers the CNI path without a lock: may this replica write for a node
// (MayAct, FenceToken), and where does a call go (RouteOf). Router is the CNI
// backend that serves a call locally or, through the Forwarder, forwards it
// once (HMAC-authenticated) to the owner, or holds it while the node has no
// owner.
//
//	fence := shard.NewFence(cfg, self, clock.RealClock{}) // before the IPAM, which it fences
//	coord, _ := shard.New(cfg, self, addrs, shard.Deps{Fence: fence, Nodes: ipam, ...}, log, reg)
//	fwd := shard.NewForwarder(shard.ForwarderDeps{Self: self, Routes: fence, ...}, log, reg) // the IPAM moves fixed IPs through it
//	router := shard.NewRouter(shard.RouterDeps{Forwarder: fwd, Local: ipam, Locator: ipam}, log)
//	go coord.Run(ctx) // until ctx ends, then it hands its partitions over
//
//	ring, _ := shard.NewRing(shard.DefaultRingConfig(), []string{"ipam-a", "ipam-b", "ipam-c"})
//	owner := ring.Owner("node-10-0-1-7") // "ipam-b"
//
// The ring is deterministic for a member *set*: the order in which members
// joined does not matter, so every replica that sees the same members computes
// the same owners. A ring view is still only a hint: exclusivity (one replica
// allocating for a node at a time) is enforced by per-replica Leases in the
// API server and claims moved only by compare-and-swap, never by the ring
// alone. DESIGN.md has the state diagram and the argument for each invariant,
// including why the lock-free fence is never looser than the state.
package shard
