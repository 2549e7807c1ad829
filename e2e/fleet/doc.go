// Package fleet runs the whole system as separate processes for e2e suites,
// benchmarks and the demo: a control plane (given, or its own from
// e2e/cluster), bce-sim, N cce-ipam replicas and an in-process kubelet
// simulator with M nodes that spreads its CNI calls over every replica.
//
// Every process gets free 127.0.0.1 ports and runs under e2e/supervisor (its
// own process group, SIGKILL as parent-death signal), so nothing outlives the
// test binary even when it is killed. Logs go to Dir: bce-sim.log,
// replica-<i>.log (appended across restarts), kubelet-sim.log.
//
//	f := fleet.Start(t, fleet.Options{Replicas: 3, Nodes: 10}) // stopped by t.Cleanup
//	r := f.Replica(1)
//	r.Kill()          // SIGKILL, waits until gone
//	r.Start(ctx)      // same ports again, waits for /readyz
//	r.Stop(); r.Cont() // SIGSTOP / SIGCONT
//	r.Terminate()     // SIGTERM, waits for a graceful exit
//	r.Restart(ctx)    // Terminate + Start
//	v, _ := r.Metric(ctx, "cce_ipam_shard_owned_nodes", nil)
//	r.TerminateWithin(40 * time.Second)
//	f.AddReplica(ctx); f.Replica(3).Remove(); f.RestartKubelet() // new endpoint list
//	f.AddReplicaWith(ctx, fleet.ReplicaOptions{OwnGossipKey: true, NoReadyWait: true}) // cannot join
//	f.CNIAddrs()                       // gRPC addresses of the live replicas
//	r.CNI().AllocateIP(ctx, req)       // a CNI call to this replica only
//	f.Running()                        // the live replicas whose process runs
//	holders, _ := f.Settle(ctx)        // running replicas agree: node -> holder
//	st, _ := r.ShardStatus(ctx)        // /shard/status: member name, members, partitions
//	f.SetFaults(ctx, bcesim.Faults{ErrorRate: map[bcesim.Op]float64{"*": 0.2}})
//	f.SetSimRateLimits(ctx, ...)       // lower limits: 429 RateLimit answers
//	st, _ := f.SimStats(ctx)           // bce-sim's per-op, per-second counters
//	f.RestartAPIServer(ctx, 2*time.Second) // only with the fleet's own control plane
//	chk, _ := f.Checker(invariants.Config{OrphanGrace: 30 * time.Second})
//	f.Kubelet().Stats()                // allocations, errors, latencies
//
// Outside tests (the demo, benchmarks) use New and Close:
//
//	f, err := fleet.New(ctx, fleet.Options{Replicas: 3, Nodes: 50, Dir: dir, KeepDir: true})
//	defer f.Close()
//
// Every replica joins the others through memberlist (a shared gossip key
// file), advertises its gRPC address for forwarding, signs forwarded calls
// with a shared key, and keeps its Lease in Options.LeaseNamespace. A fleet on
// its own control plane installs the chart's wep fencing policy and runs its
// replicas as the user it fences; on a SharedCluster (a package's control
// plane, one namespace per test) it does the same for LeaseNamespace only.
// Options.ReplicaArgsFunc and ReplicaEnvFunc give one replica flags or
// environment variables of its own (the product's test-only failpoints).
//
// A fleet owns its nodes: on a shared control plane run one fleet at a time
// (Close deletes the fleet's nodes and IPPools so the next one starts
// clean), since a replica serves every BCC node it sees.
package fleet
