// Package membership tells every cce-ipam replica which replicas are alive,
// and elects one of them leader for the singleton duties.
//
// Gossip (hashicorp/memberlist, LAN profile) does discovery, fast failure
// detection and the address book: each member advertises a small versioned
// Meta (gRPC address, version, start time, a leaving flag). A replica joins
// the seeds, the headless Service's DNS name and the addresses of a seed
// source (SetSeedSource: the gossip addresses the replicas publish in their
// shard Leases, so that a cold start needs no DNS: CoreDNS's pods may be
// waiting for IPs from us), and keeps joining every address that is not yet
// a live member, so a cold start cannot leave islands. Member names are the pod name plus a random suffix, unique per
// process. Gossip is encrypted when a key file is given.
//
//	cfg := membership.Config{NamePrefix: pod, JoinDNS: "cce-ipam-gossip.kube-system.svc",
//		GRPCAddr: podIP + ":9090", GossipKeyFile: "/etc/cce-ipam/gossip.key"}
//	m, err := membership.New(cfg, time.Now(), log, reg) // reads the key; starts nothing
//	go m.Run(ctx) // on ctx end: announce Leaving, Leave, Shutdown, then return
//	for ev := range m.Events() { // one consumer, in memberlist's order, Seq 1, 2, 3, …
//		if ev.Type == membership.EventLeave && ev.Failed { /* crashed, not drained */ }
//		names := []string{}
//		for _, mem := range m.Members() { names = append(names, mem.Name) }
//		ring, _ := shard.NewRing(shard.RingConfig{}, names) // owners; mem.Meta.GRPCAddr to forward
//	}
//
// Peers whose meta does not decode (garbage, another application on the port)
// are never admitted. A replica that shuts down gracefully first sets Leaving
// in its meta (an EventUpdate elsewhere), then leaves (EventLeave, Failed
// false); a crash shows as EventLeave with Failed true after the failure
// detector's suspicion timeout.
//
// Leader election uses client-go's leaderelection over a Lease whose holder
// identity is the member name:
//
//	el, err := membership.NewElector(membership.LeaderConfig{Namespace: "kube-system"},
//		clientset, m.Name(), membership.LeaderCallbacks{OnStartedLeading: runSingletons}, log, reg)
//	go el.Run(ctx) // on ctx end: stop the duty, then release the Lease
//
// Neither gossip nor the leader Lease fences anything: a membership view is a
// hint, and exclusive node ownership is enforced by per-replica Leases in the
// API server (package shard).
package membership
