// Package rpc is the CNI plugin ↔ IPAM wire contract: the gRPC service
// rpc.CNIBackend with AllocateIP, ReleaseIP and CheckIP.
//
// rpc.proto is the source; rpc.pb.go and rpc_grpc.pb.go are generated from it
// by generate.sh (`make generate`) and committed. The proto package, message
// names and field numbers are those of the reference CCE IPAM, so that its
// unmodified CNI plugin can call cce-ipam. TestGeneratedCodeMatchesProto fails
// when the committed code no longer matches rpc.proto.
//
// A server registers an implementation with
//
//	rpc.RegisterCNIBackendServer(grpcServer, backend)
//
// and a client (the CNI plugin, or a replica forwarding to a node's owner)
// calls
//
//	reply, err := rpc.NewCNIBackendClient(conn).AllocateIP(ctx, &rpc.AllocateIPRequest{...})
//
// Failures travel as IsSuccess=false with ErrMsg, never as gRPC errors, as the
// reference plugin expects.
package rpc
