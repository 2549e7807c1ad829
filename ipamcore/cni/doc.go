// Package cni serves rpc.CNIBackend, the gRPC service the CNI plugin on every
// node calls for a pod's IP, in front of whatever allocates (a podip.Backend).
//
// It owns only what is the same for every request: decoding and validating
// the request into a PodRef (clear errors, nothing reaches the Backend on bad
// input), a hard per-request deadline, bounded concurrency (a call beyond the
// limit waits briefly for a slot, then gets a "busy, retry" answer: the wait
// is bounded in time, so the queue cannot grow without bound under a storm of
// pod starts), the wire shape of replies, and request metrics. Allocation itself —
// the datastore, the WorkloadEndpoint commit, forwarding to a node's owner —
// lives behind Backend.
//
//	srv := cni.NewServer(cni.DefaultConfig(), backend, logger, prometheus.NewRegistry())
//	rpc.RegisterCNIBackendServer(grpcServer, srv)
//
// Failures travel as IsSuccess=false with ErrMsg, never as gRPC status errors:
// the reference CNI plugin only reads IsSuccess. A refusal another replica may
// serve (podip.ErrNotHere) is also marked in the gRPC trailer
// "cce-ipam-refusal: not-here"; a replica that forwarded the call reads it
// back with RefusalError instead of matching the message's text:
//
//	var md metadata.MD
//	reply, err := client.AllocateIP(ctx, req, grpc.Trailer(&md))
//	if err == nil && !reply.IsSuccess {
//		err = cni.RefusalError(md, reply.ErrMsg) // errors.Is(err, podip.ErrNotHere)?
//	}
//
// A replica that forwards a call to the node's owner (package shard) calls
// the owner's CNIBackend, so a forwarded call passes two Servers. The
// request metrics tell the two hops apart by a hop label, entry or
// forwarded, given a test of forwarded calls:
//
//	cni.NewServer(cfg, router, logger, reg, cni.WithForwarded(shard.Forwarded))
//
// IP types: BCC is served, and so are unknown values (older plugins send 0 or
// garbage), as the reference does. An ADD of another IPAM's type (BBC,
// cross-VPC ENI, RoCE, ERI) fails with ErrUnsupportedIPType naming it; a DEL
// of any type is released as BCC, so it succeeds with no address when we
// hold nothing for the pod and never blocks the pod's teardown.
//
// Allocations and releases have separate concurrency limits (the reference
// counted allocations against the release limit too, so a burst of ADDs could
// starve DELs that free IPs).
package cni
