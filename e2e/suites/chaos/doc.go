// Package chaos is the seeded, time-bounded chaos suite: while pods churn,
// replicas are SIGKILLed and restarted, SIGSTOPped and resumed, cut off
// from their peers (each replica runs in its own network namespace), bce-sim
// answers 429s, 5xx, slowly or from a lagging replica, and kube-apiserver
// is restarted. Further faults aim at the hand-over paths:
//
//   - lag-handover: bce-sim's reads lag 1-3 s (below the replicas'
//     --cloud-read-lag) while a replica's nodes go to the others (SIGKILL,
//     graceful leave or partition) and come back;
//   - 5xx-storm: 50-95% of mutating and list calls answer 500 for 2-6 s;
//   - sts-move: pods of a fixed-IP StatefulSet (cce.io/sts-enable-fix-ip)
//     are deleted; the StatefulSet controller recreates them and the test,
//     their scheduler, binds each to a node another replica owns, so the
//     fixed IP moves between shards (the kubelet simulator drives the DEL
//     and the ADD);
//   - gc-drain: a replica leaves gracefully while GC (every 2 s) has work on
//     its nodes: churn pods deleted without a graceful DEL and the fixed-IP
//     and PSTS Fixed StatefulSets scaled down;
//   - psts-move: PodSubnetTopologySpread pods are deleted: pods of a PSTS
//     Fixed StatefulSet (exclusive subnet) and bare custom-reuse pods,
//     which the test creates again under their names; the test binds both
//     to a node another replica owns, and each must come back with its
//     address (its IPClaim keeps it the pod's). PSTS Elastic pods (the
//     cloud picks addresses of a shared subnet) churn throughout.
//
// Every run injects each of these at least once (after the duration if the
// draw did not bring one). The invariant checker runs throughout (also
// while reads lag: it reads bce-sim's true world) and at the end; besides
// (a)-(d) it checks (e) every WorkloadEndpoint's address on its node's ENI
// and no two weps on one address, (f) at the end that each owner's
// datastore assigns exactly the addresses weps name, (g) I7: every address
// of an exclusive subnet that a wep names or an ENI holds is held by its
// pod's IPClaim, and every PSTS pod's address is in its PSTS's subnets,
// and I5 at bce-sim: no second of the run saw more HTTP requests
// (throttled and 5xx-answered ones included) than the replicas' global
// rate + burst. The test prints the
// pods churned, the faults injected by kind and the violations.
//
//	E2E_CHAOS_DURATION  how long faults are drawn (default 45s: the
//	                    short profile of make test; make e2e-chaos runs 10m)
//	E2E_CHAOS_SEED      seed of the fault schedule and the churn (default 1)
//
// The same seed gives the same schedule of faults and pod operations; the
// processes' timing still differs from run to run.
package chaos
