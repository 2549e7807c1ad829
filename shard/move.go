package shard

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/cce-ipam/sharded/ipamcore/cni"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/podip"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// A fixed-IP StatefulSet pod recreated on a node of another replica takes
// its address along: the address must first leave the old node's ENI, and
// only the old node's owner may do that (I1), forgetting it in the same step.
// The new node's owner asks it through the router, in one forwarded hop.
//
// The wire is the CNI service's ReleaseIP (no new RPC, so the forward port
// stays the CNI port): K8SNodeName is the old node, the sandbox field
// carries "move:<ip>@<eni>" and a headerMove marks the call. The forward MAC
// covers the sandbox field under its own method name (methodMove), so a
// move cannot be forged from a signed ReleaseIP, nor its address changed.
const (
	headerMove = "x-cce-ipam-fixed-ip-move"
	movePrefix = "move:"
)

var methodMove = methodRelease + "#fixed-ip-move"

// Mover is what serves a move on the old node's owner (ipam.IPAM).
type Mover interface {
	FreeMovedIP(ctx context.Context, node, namespace, name string, addr netip.Addr, eniID string) error
}

var _ ipam.FixedIPMover = (*Forwarder)(nil)

// FreeMovedIP implements ipam.FixedIPMover: it asks the replica that serves
// node to free the address there, waiting (as any call does) while node has
// no owner. The IPAM frees addresses of the nodes whose partitions it holds
// itself; a node of this replica's that is not served yet is refused
// (retryable).
func (f *Forwarder) FreeMovedIP(ctx context.Context, node, namespace, name string, addr netip.Addr, eniID string) error {
	// A move is this replica's own call, even when the ADD that needs it
	// was forwarded here: it may be forwarded once more.
	ctx = context.WithValue(ctx, forwardedKey{}, nil)
	ref := moveRef(node, namespace, name, addr, eniID)
	_, _, err := f.route(ctx, call{
		node: node,
		remote: func(ctx context.Context, c rpc.CNIBackendClient) (podip.Endpoint, bool, error) {
			ctx = metadata.AppendToOutgoingContext(ctx, headerMove, "1")
			if _, err := sendRelease(ctx, c, ref); err != nil {
				return podip.Endpoint{}, false, err
			}
			return podip.Endpoint{}, true, nil
		},
	})
	return err
}

// moveRef is a move as a pod call: the sandbox field names the address and
// its ENI (the forward MAC covers it).
func moveRef(node, namespace, name string, addr netip.Addr, eniID string) podip.PodRef {
	return podip.PodRef{
		Namespace:   namespace,
		Name:        name,
		Node:        node,
		ContainerID: movePrefix + addr.String() + "@" + eniID,
	}
}

// freeMovedIP serves a move forwarded to this replica: here, by the Mover
// (the IPAM, which frees it also when the node was deleted), or refused.
func (r *Router) freeMovedIP(ctx context.Context, node, namespace, name string, addr netip.Addr, eniID string) error {
	if r.mover == nil {
		return fmt.Errorf("%w: this replica cannot move fixed IPs", ErrNotOwner)
	}
	_, _, err := r.fwd.route(ctx, call{
		node: node,
		local: func(ctx context.Context) (podip.Endpoint, bool, error) {
			return podip.Endpoint{}, true, r.mover.FreeMovedIP(ctx, node, namespace, name, addr, eniID)
		},
	})
	return err
}

// parseMove reads the sandbox field of a move.
func parseMove(field string) (netip.Addr, string, error) {
	rest, ok := strings.CutPrefix(field, movePrefix)
	if !ok {
		return netip.Addr{}, "", fmt.Errorf("not a fixed-IP move: %q", field)
	}
	ip, eniID, ok := strings.Cut(rest, "@")
	addr, err := netip.ParseAddr(ip)
	if !ok || err != nil || eniID == "" {
		return netip.Addr{}, "", fmt.Errorf("malformed fixed-IP move %q", field)
	}
	return addr, eniID, nil
}

// serveMove handles a forwarded move (already authenticated as methodMove)
// here, or refuses it as not the owner: never forwarded again.
func (r *Router) serveMove(ctx context.Context, req any) (any, error) {
	rel, ok := req.(*rpc.ReleaseIPRequest)
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "a fixed-IP move must be a ReleaseIP request")
	}
	addr, eniID, err := parseMove(rel.GetK8SPodInfraContainerID())
	if err != nil || rel.GetK8SNodeName() == "" || rel.GetK8SPodName() == "" || rel.GetK8SPodNamespace() == "" {
		if err == nil {
			err = fmt.Errorf("a fixed-IP move needs the node, the pod's namespace and name")
		}
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := r.freeMovedIP(ctx, rel.GetK8SNodeName(), rel.GetK8SPodNamespace(), rel.GetK8SPodName(), addr, eniID); err != nil {
		cni.MarkRefusal(ctx, err)
		return &rpc.ReleaseIPReply{IsSuccess: false, ErrMsg: err.Error()}, nil
	}
	return &rpc.ReleaseIPReply{IsSuccess: true}, nil
}

// isMove reports whether an incoming call is a fixed-IP move.
func isMove(md metadata.MD, info *grpc.UnaryServerInfo) bool {
	return len(md.Get(headerMove)) > 0 && info.FullMethod == methodRelease
}
