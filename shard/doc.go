// Package shard decides which cce-ipam replica serves which node, and routes
// CNI calls there.
//
// The pure parts: a consistent-hash Ring over the live members
// (buraksezer/consistent v1.0.0 with xxhash, a prime partition count and
// bounded load) that maps node → partition → owner, Ring.Balanced that
// evens out the members' shares of nodes given per-partition node counts,
// Table and Diff, and Ownership, the fenced state machine of one replica's
// partitions. The driver, Coordinator, runs Ownership against Leases in the
// API server (replica Leases, partition claims by compare-and-swap, the
// published node counts, the budget split) and tells
// the IPAM which nodes to serve; Router is the CNI backend that serves a call
// locally, forwards it once (HMAC-authenticated) to the owner, or holds it
// while the node has no owner. DESIGN.md has the state diagram and the
// argument for each invariant.
//
//	ring, err := shard.NewRing(shard.RingConfig{}, []string{"ipam-a", "ipam-b", "ipam-c"})
//	owner := ring.Owner("node-10-0-1-7")          // "ipam-b"
//	next, _ := shard.NewRing(shard.RingConfig{}, []string{"ipam-a", "ipam-c"})
//	moves, _ := shard.Diff(ring.Table(), next.Table()) // partitions that changed owner
//
// The ring is deterministic for a member *set*: the order in which members
// joined does not matter, so every replica that sees the same members computes
// the same owners. A ring view is still only a hint: exclusivity (one replica
// allocating for a node at a time) is enforced by per-replica Leases in the API
// server, never by the ring alone: Ownership (ownership.go) is the pure state
// machine of that fencing, and DESIGN.md argues each invariant.
package shard
