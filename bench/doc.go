// Package bench is the cce-ipam benchmark: it runs the whole system as
// processes on this machine (a real etcd + kube-apiserver, bce-sim, cce-ipam
// replicas through e2e/fleet) and measures, side by side with a baseline in
// the same run:
//
//  1. warm AllocateIP latency and throughput, 1 and 3 replicas, against a
//     bare WorkloadEndpoint Create at the same concurrency;
//  2. failover after SIGKILL against memberlist's failure detection, with the default shard lease and a
//     3 s one, and the renewals' round trips (the margin before a lapse);
//  3. BCE calls to take nodes over against one paginated VPC-wide list;
//  4. memory per replica with 1 and with 3 replicas, and an idle replica's
//     (no node yet): the fixed cost;
//  5. the BCE budget at bce-sim while replicas join and leave, and (5b) ADDs per second
//     with the budget as the bottleneck, 1 and 3 replicas, follow-demand off and on;
//  6. cold start of 3 replicas against 1, and the replicas' API writes per
//     second once settled against their Lease renewals;
//  7. PSTS (Elastic and Fixed) AllocateIP latency against a warm AllocateIP
//     of the same waves;
//  8. the API server's cost of a CNI call (issue #28): requests per call
//     counted at the kube-apiserver, no knee at 1,000 ADDs and DELs against
//     the bare wep create / delete, CPU and allocations per call before and
//     after (a baseline binary built from a git revision), a noisy
//     neighbour with and without the chart's flow-control objects;
//  9. scale-out (issue #25): 1–4 replicas, each in a CPU cgroup capped at
//     the same share, warm ADDs and DELs per second against N times one
//     replica's, with each process's CPU to show what saturates.
//
// cmd/bench runs it (`make bench`, `make bench-long`):
//
//	err := bench.Run(ctx, bench.Config{Profile: bench.Profiles["short"],
//		BinDir: "bin", RepoRoot: ".", WorkDir: tmp, OutDir: "bench/results/2025-01-02"})
//
// The benchmark reports; it never fails on a number. Run returns
// ErrInvariant when the system broke an invariant (an IP handed to a second
// pod while the first still holds it, or a finding of e2e/invariants on the
// settled cluster). Every process is stopped on return, also on error or
// when ctx is cancelled (Ctrl-C).
package bench
