// Package ipam is the informer-driven IPAM for a dynamic set of owned nodes:
// it serves podip.Backend (AllocateIP / ReleaseIP / CheckIP) for the nodes it
// has been told to serve, keeps each node's warm pool of ENI secondary IPs
// through the cloud, and records every assignment as a WorkloadEndpoint.
//
// The pieces:
//   - datastore.Store (pure) holds node → ENI → IPs;
//   - this package does the I/O around it: cluster-wide informers only for
//     nodes, StatefulSets and Subnets; pods are watched per served node
//     (field selector spec.nodeName, as a kubelet watches its pods) and
//     WorkloadEndpoints read live or in pages, so a replica's memory follows
//     its share of the cluster; the cloud.Provider; and one pool worker per served node
//     that grows the pool when an allocation finds it empty (passive) or
//     idle falls below the minimum (active), and trims it above the max.
//
// Who serves which node is decided outside (one replica serving everything,
// or the shard layer): ServeNode builds one node's state from the cloud's
// ENIs and a quorum read of its WorkloadEndpoints, StopServingNode drops it;
// neither touches other nodes. Every cloud call made for a node carries the
// node's permission (cloud.ForNode with Deps.Fence): the client asks it
// before each HTTP attempt and ends the attempt at its deadline. GC and the
// ENI sync work on a node as in-flight work of it, like a CNI call, so
// StopServingNode waits for them (ending their contexts) and, once it has
// returned, nothing more is sent for the node (cloudfence.go).
//
//	cfg := ipam.DefaultConfig()        // or RegisterFlags on the command line
//	cfg.ClusterID, cfg.VPCID = "cce-x", "vpc-x"
//	ip, _ := ipam.New(cfg, ipam.Deps{Kube: kc, CCE: cc, Cloud: provider}, logger, reg)
//	go ip.Run(ctx)                     // informers + pool workers
//	_ = ip.ServeNode(ctx, "10.0.1.7")  // rebuild from cloud + weps
//	rpc.RegisterCNIBackendServer(grpcServer, cni.NewServer(cni.DefaultConfig(), ip, logger, reg))
//
// A refusal for a node this replica does not serve (ErrNodeNotServed,
// ErrFenced) is a podip.ErrNotHere: the caller routes the call again.
//
// The fast tests (fast_test.go, plain go test) drive the allocation,
// rollback, release and GC paths against an in-process bce-sim, fake
// clientsets and a fake clock; the integration tests (tag integration) add
// the real API server's semantics.
//
// The WorkloadEndpoint is the commit point of an allocation: the datastore
// marks an IP assigned first, the wep Create commits it, and a failed Create
// puts the IP back. A release deletes the wep first and only then frees the
// IP, so an IP is never free while a wep still names it. ADD and DEL of the
// same pod are serialised by a per-pod lock; different pods never wait on
// each other, and no lock is held across a cloud call.
//
// A running pod's status.podIP is a claim of its own (podipguard.go): an
// address a running pod uses with no wep giving it is held, never handed
// out, until the pod is gone. The GC (gc.go) frees what deleted pods and
// StatefulSets leave, deletes from the cloud every address of a served ENI
// that no wep names and no running pod uses once it stays so for the leak
// grace (leaked.go), and repairs weps naming the wrong ENI (repair.go).
//
// REQUESTS.md lists the API-server requests each CNI call makes, why each is
// there, and what a removal would need; requests_test.go and
// requests_integration_test.go pin them.
package ipam
