// Package spread runs the leader's PodSubnetTopologySpread controllers
// ("spread" for PodSubnetTopologySpread): the PSTS status controller and the
// PodSubnetTopologySpreadTable (PSTT) controller. Each is the client-go
// sample-controller loop: informers feed a rate-limited workqueue of object
// keys, and workers reconcile each key from the informer caches.
//
//	c, err := spread.New(spread.DefaultConfig(), spread.Deps{Kube: kube, CCE: cceClient, Metadata: meta}, log, reg)
//	// in the leader's OnStartedLeading(ctx):
//	err = c.Run(ctx) // returns when ctx ends, after every goroutine it started
//
// The status controller writes, for each PSTS, the subnets of its spec that
// pods can get addresses from (availableSubnets: a Subnet resource exists,
// is enabled, not exhausted, exclusive exactly when the strategy picks
// addresses itself, with a valid CIDR and ranges) and those they cannot
// (unavailableSubnets, with the reason in message); per subnet the number of
// pods holding one of its addresses (podCount, counted from the PSTS's
// WorkloadEndpoints that are not podDeleted, which the reference never
// did) and, when the spec asks, each address's pod (ipAllocations); and
// the pods annotated with the PSTS (podMatchedCount) and those of them that
// have an address (podAffectedCount). It writes with UpdateStatus, only
// when the status changed. PSTS, Subnet, wep and annotated-pod events
// requeue the PSTS they concern; every PSTS is also requeued each
// ResyncPeriod.
//
// The table controller keeps one PSTS per entry of a table, named by the
// entry and controlled by the table (the garbage collector deletes them with
// it): it creates missing ones, sets drifted specs back and deletes the
// owned ones no entry lists. It never takes over a PSTS it does not control:
// such an entry is refused, with a Warning event and the reason in the
// entry's status. The table's status is its PSTS statuses in spec order.
//
// The pod and wep informers are filtered as objects arrive, so the leader
// caches only the pods and weps of PSTS objects (informers.go).
package spread
