// Package invariants checks, from the outside, what the IPAM promises: it
// reads pods, WorkloadEndpoints, nodes and the cloud's ENIs and reports every
// broken invariant as a structured Violation.
//
//   - (a) DuplicateIP: no two live pods share an IP (I3); a terminating
//     pod whose WorkloadEndpoint is gone (its CNI DEL was applied) no
//     longer holds one;
//   - (b) MissingWEP, WEPMismatch, IPNotOnNode: each Running pod's IP is its
//     WorkloadEndpoint's and sits on an in-use ENI of its node's instance;
//   - (c) OrphanWEP: no WorkloadEndpoint outlives its pod by more than a
//     grace period (fixed-IP StatefulSet reservations excepted);
//   - (d) LeakedIPs, PoolBelowMin, LeakedCrossSubnetIP: every cloud IP on a
//     node's ENIs is named by a WorkloadEndpoint or idle, and the idle ones
//     stay within the pool's [min,max] (I4); an address outside its ENI's
//     subnet CIDR (a PSTS cross-subnet address) is never idle, so one that
//     no wep of the node names is leaked;
//   - (e) WEPNotOnENI, GhostWEP, WEPSharedIP (Config.WEPAddresses): every
//     address a WorkloadEndpoint names is on an in-use ENI of its node, and
//     no two weps name one address;
//   - (f) DatastoreMismatch (Config.Pools): each node's owner assigns in
//     its datastore exactly as many addresses as weps name on the node;
//   - (g) I7 (Config.Claims): UnclaimedWEP, UnclaimedIP, WEPSharedIP: every
//     address of an exclusive subnet that a wep names or an ENI holds has
//     an IPClaim held by the wep's pod (by some pod, for an ENI address),
//     past a grace, and no two weps name one; OutsidePSTS: a Running PSTS
//     pod's address lies in one of its PSTS's subnets. Pod and wep
//     addresses from other subnets pass (b) and (e) like any other: they
//     are on the node's ENIs and named by the pod's wep;
//   - I5 BudgetExceeded: CallLog accumulates the cloud's per-second call
//     counts over a run and checks every second against rate + burst.
//
// The cloud comes through a CloudView: SimView reads an in-process bce-sim,
// ProviderView lists through the BCE client (a bce-sim process or BCE).
// Every suite can end with
//
//	chk, _ := invariants.New(invariants.Config{
//		Namespaces: []string{ns}, OrphanGrace: 30 * time.Second,
//		Pool: &invariants.PoolBounds{Min: 2, Max: 6},
//	}, kube, cceClient, invariants.SimView(sim, clusterID+"/"))
//	if vs, err := chk.WaitClean(ctx, time.Second); err != nil {
//		t.Fatalf("invariants: %v\n%s", err, vs)
//	}
//
// Check is one snapshot; findings about Running pods are confirmed by reading
// the pod and WorkloadEndpoint again, so (a)-(c) can run during churn. Check
// (d) is meant for a settled cluster (WaitClean), since a pool overshoots
// while it grows and while released IPs cool down.
package invariants
