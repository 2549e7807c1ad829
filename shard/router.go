package shard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/cce-ipam/sharded/ipamcore/cni"
	"github.com/cce-ipam/sharded/ipamcore/podip"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// Locator finds the node a call is about (ipam.IPAM implements it).
type Locator interface {
	PodNode(ctx context.Context, ref podip.PodRef) (string, error)
	// CallNode is the node the call names, when it is a known node: the
	// CNI plugin runs on the sandbox's node, so a DEL or CheckIP goes there
	// without a read. ok=false: EndpointNode reads the wep instead.
	CallNode(ref podip.PodRef) (node string, ok bool)
	EndpointNode(ctx context.Context, ref podip.PodRef) (string, bool, error)
	// NodeGone and ReleaseOnDeletedNode serve a DEL for a node that no
	// longer exists (no replica owns it, so it cannot be routed).
	NodeGone(ctx context.Context, node string) bool
	ReleaseOnDeletedNode(ctx context.Context, ref podip.PodRef) (podip.Endpoint, bool, error)
}

// Router is the podip.Backend of a sharded replica: a call for a node this
// replica serves goes to the local IPAM; one for a node another live replica
// holds is forwarded there in one authenticated hop (Forwarder); one for a
// node nobody holds right now (a hand-over) waits up to OwnerWait, then fails
// with a retryable error that kubelet retries.
type Router struct {
	fwd     *Forwarder
	local   podip.Backend
	locator Locator
	mover   Mover // serves fixed-IP moves for this replica's nodes (move.go); nil: none
	log     *slog.Logger
}

var _ podip.Backend = (*Router)(nil)

// RouterDeps are a Router's connections.
type RouterDeps struct {
	// Forwarder sends calls for other replicas' nodes.
	Forwarder *Forwarder
	// Local serves the calls for this replica's own nodes.
	Local podip.Backend
	// Locator finds a call's node; when it is a Mover too, it frees fixed
	// IPs moved away from this replica's nodes.
	Locator Locator
}

// NewRouter routes calls for one replica.
func NewRouter(deps RouterDeps, log *slog.Logger) *Router {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Router{
		fwd:     deps.Forwarder,
		local:   deps.Local,
		locator: deps.Locator,
		log:     log,
	}
	if m, ok := deps.Locator.(Mover); ok {
		r.mover = m
	}
	return r
}

// Allocate implements podip.Backend.
func (r *Router) Allocate(ctx context.Context, ref podip.PodRef) (podip.Endpoint, error) {
	node, err := r.locator.PodNode(ctx, ref)
	if err != nil {
		return podip.Endpoint{}, err // an unknown or unbound pod: nothing to route
	}
	ep, _, err := r.route(ctx, methodAllocate, node, ref,
		func(ctx context.Context) (podip.Endpoint, bool, error) {
			ep, err := r.local.Allocate(ctx, ref)
			return ep, err == nil, err
		},
		func(ctx context.Context, c rpc.CNIBackendClient) (podip.Endpoint, bool, error) {
			var trailer metadata.MD
			reply, err := c.AllocateIP(ctx, &rpc.AllocateIPRequest{
				K8SPodName:             ref.Name,
				K8SPodNamespace:        ref.Namespace,
				K8SPodInfraContainerID: ref.ContainerID,
				K8SNodeName:            ref.Node,
				IPType:                 rpc.IPType_BCCMultiENIMultiIPType,
			}, grpc.Trailer(&trailer))
			if err != nil {
				return podip.Endpoint{}, false, err
			}
			if !reply.GetIsSuccess() {
				return podip.Endpoint{}, false, cni.RefusalError(trailer, reply.GetErrMsg())
			}
			return fromWire(reply.GetENIMultiIP()), true, nil
		})
	return ep, err
}

// Release implements podip.Backend. The node is the one the call names
// when that is a known node (the sandbox's wep names it: ipam's
// REQUESTS.md), else the pod's wep's: the pod may already be gone.
func (r *Router) Release(ctx context.Context, ref podip.PodRef) (podip.Endpoint, bool, error) {
	node, ok := r.locator.CallNode(ref)
	if !ok {
		var err error
		node, ok, err = r.locator.EndpointNode(ctx, ref)
		if err != nil {
			return podip.Endpoint{}, false, err
		}
		if !ok {
			return podip.Endpoint{}, false, nil // nothing to free anywhere
		}
	}
	local := func(ctx context.Context) (podip.Endpoint, bool, error) { return r.local.Release(ctx, ref) }
	if r.locator.NodeGone(ctx, node) {
		// Nobody serves a deleted node, but its partition has a holder, and
		// only the holder's writes carry the fencing token the API server
		// accepts for the node's weps: the release goes there too.
		local = func(ctx context.Context) (podip.Endpoint, bool, error) {
			return r.locator.ReleaseOnDeletedNode(ctx, ref)
		}
	}
	return r.route(ctx, methodRelease, node, ref, local,
		func(ctx context.Context, c rpc.CNIBackendClient) (podip.Endpoint, bool, error) {
			reply, err := sendRelease(ctx, c, ref)
			if err != nil {
				return podip.Endpoint{}, false, err
			}
			if reply.GetENIMultiIP() == nil {
				return podip.Endpoint{}, false, nil
			}
			return fromWire(reply.GetENIMultiIP()), true, nil
		})
}

// sendRelease sends a ReleaseIP for ref (a DEL or, with headerMove in ctx, a
// fixed-IP move) to the owner; a refusal comes back as its error.
func sendRelease(ctx context.Context, c rpc.CNIBackendClient, ref podip.PodRef) (*rpc.ReleaseIPReply, error) {
	var trailer metadata.MD
	reply, err := c.ReleaseIP(ctx, &rpc.ReleaseIPRequest{
		K8SPodName:             ref.Name,
		K8SPodNamespace:        ref.Namespace,
		K8SPodInfraContainerID: ref.ContainerID,
		K8SNodeName:            ref.Node,
		IPType:                 rpc.IPType_BCCMultiENIMultiIPType,
	}, grpc.Trailer(&trailer))
	if err != nil {
		return nil, err
	}
	if !reply.GetIsSuccess() {
		return nil, cni.RefusalError(trailer, reply.GetErrMsg())
	}
	return reply, nil
}

// Check implements podip.Backend. The wep is the record, so any replica can
// answer by reading it; the owner of the node the call names answers from
// what it wrote, without a read. So a CheckIP for a known node goes to its
// owner once (no wait for a node without one); anything else, or a forward
// that fails, is answered here.
func (r *Router) Check(ctx context.Context, ref podip.PodRef) (podip.Endpoint, bool, error) {
	node, ok := r.locator.CallNode(ref)
	if !ok {
		return r.local.Check(ctx, ref)
	}
	if _, forwarded := forwardedFrom(ctx); !forwarded {
		if rt := r.fwd.routes.RouteOf(node); !rt.Local && rt.GRPC != "" {
			ep, ok, err := r.fwd.forward(ctx, rt,
				func(ctx context.Context, c rpc.CNIBackendClient) (podip.Endpoint, bool, error) {
					reply, err := c.CheckIP(ctx, &rpc.CheckIPRequest{
						K8SPodName:             ref.Name,
						K8SPodNamespace:        ref.Namespace,
						K8SPodInfraContainerID: ref.ContainerID,
						K8SNodeName:            ref.Node,
					})
					if err != nil {
						return podip.Endpoint{}, false, err
					}
					if !reply.GetIsSuccess() {
						// Truthful "no IP" and refusals look alike on the
						// wire: read it here.
						return podip.Endpoint{}, false, errCheckHere
					}
					return fromWire(reply.GetENIMultiIP()), true, nil
				})
			if err == nil {
				return ep, ok, nil
			}
		}
	}
	return r.local.Check(ctx, ref)
}

// errCheckHere sends a CheckIP the owner did not confirm to a local read.
var errCheckHere = errors.New("check locally")

// route sends a call for node where it is served: locally, forwarded, or
// (for a node deleted meanwhile) to gone.
func (r *Router) route(ctx context.Context, method, node string, ref podip.PodRef,
	local func(context.Context) (podip.Endpoint, bool, error),
	remote func(context.Context, rpc.CNIBackendClient) (podip.Endpoint, bool, error),
) (podip.Endpoint, bool, error) {
	return r.fwd.route(ctx, call{
		node:     node,
		local:    local,
		remote:   remote,
		nodeGone: r.locator.NodeGone,
		gone: func(ctx context.Context) (podip.Endpoint, bool, error) {
			if method == methodRelease {
				return r.locator.ReleaseOnDeletedNode(ctx, ref)
			}
			return podip.Endpoint{}, false, fmt.Errorf("node %s no longer exists", node)
		},
	})
}

func fromWire(w *rpc.ENIMultiIPReply) podip.Endpoint {
	if w == nil {
		return podip.Endpoint{}
	}
	return podip.Endpoint{
		IP: w.GetIP(), Type: w.GetType(), MAC: w.GetMac(), Gateway: w.GetGw(), ENIID: w.GetENIID(),
		Node: w.GetNode(), SubnetID: w.GetSubnetID(), EnableFixIP: w.GetEnableFixIP(), FixIPDeletePolicy: w.GetFixIPDeletePolicy(),
	}
}
