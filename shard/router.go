package shard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/cce-ipam/sharded/ipamcore/cni"
	"github.com/cce-ipam/sharded/ipamcore/podip"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// Locator finds the node a call is about (ipam.IPAM implements it).
type Locator interface {
	PodNode(ctx context.Context, ref podip.PodRef) (string, error)
	EndpointNode(ctx context.Context, ref podip.PodRef) (string, bool, error)
	// NodeGone and ReleaseOnDeletedNode serve a DEL for a node that no
	// longer exists (no replica owns it, so it cannot be routed).
	NodeGone(ctx context.Context, node string) bool
	ReleaseOnDeletedNode(ctx context.Context, ref podip.PodRef) (podip.Endpoint, bool, error)
}

// Router is the podip.Backend of a sharded replica: a call for a node this
// replica serves goes to the local IPAM; one for a node another live replica
// holds is forwarded there in one authenticated hop; one for a node nobody
// holds right now (a hand-over) waits up to OwnerWait, then fails with a
// retryable error that kubelet retries.
type Router struct {
	routes    Routes
	self      string
	ownerWait time.Duration
	local     podip.Backend
	locator   Locator
	mover     Mover // serves fixed-IP moves for this replica's nodes (move.go); nil: none
	auth      *Authenticator
	log       *slog.Logger
	metrics   routerMetrics
	poll      time.Duration

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

var _ podip.Backend = (*Router)(nil)

// Routes answers where a call for a node goes now (Fence implements it).
type Routes interface {
	RouteOf(node string) Route
}

// RouterDeps are a Router's connections.
type RouterDeps struct {
	// Self is this replica's member name (it signs forwarded calls).
	Self string
	// Routes is this replica's routing table (the Coordinator's Fence).
	Routes Routes
	// Local serves the calls for this replica's own nodes.
	Local podip.Backend
	// Locator finds a call's node; when it is a Mover too, it frees fixed
	// IPs moved away from this replica's nodes.
	Locator Locator
	// Auth signs and verifies forwarded calls.
	Auth *Authenticator
	// OwnerWait bounds the wait for a node without an owner
	// (Config.OwnerWait).
	OwnerWait time.Duration
}

// NewRouter routes calls for one replica.
func NewRouter(deps RouterDeps, log *slog.Logger, reg prometheus.Registerer) *Router {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Router{
		routes:    deps.Routes,
		self:      deps.Self,
		ownerWait: deps.OwnerWait,
		local:     deps.Local,
		locator:   deps.Locator,
		auth:      deps.Auth,
		log:       log,
		metrics:   newRouterMetrics(reg),
		poll:      100 * time.Millisecond,
		conns:     map[string]*grpc.ClientConn{},
	}
	if m, ok := deps.Locator.(Mover); ok {
		r.mover = m
	}
	return r
}

// Close drops the connections to other replicas.
func (r *Router) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for addr, c := range r.conns {
		_ = c.Close()
		delete(r.conns, addr)
	}
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

// Release implements podip.Backend. The node comes from the pod's wep: the
// pod may already be gone.
func (r *Router) Release(ctx context.Context, ref podip.PodRef) (podip.Endpoint, bool, error) {
	node, ok, err := r.locator.EndpointNode(ctx, ref)
	if err != nil {
		return podip.Endpoint{}, false, err
	}
	if !ok {
		return podip.Endpoint{}, false, nil // nothing to free anywhere
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
			var trailer metadata.MD
			reply, err := c.ReleaseIP(ctx, &rpc.ReleaseIPRequest{
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
			if reply.GetENIMultiIP() == nil {
				return podip.Endpoint{}, false, nil
			}
			return fromWire(reply.GetENIMultiIP()), true, nil
		})
}

// Check implements podip.Backend: the wep is the record, any replica can
// answer it.
func (r *Router) Check(ctx context.Context, ref podip.PodRef) (podip.Endpoint, bool, error) {
	return r.local.Check(ctx, ref)
}

// route runs a call where its node is served, waiting while it has no owner.
func (r *Router) route(ctx context.Context, method, node string, ref podip.PodRef,
	local func(context.Context) (podip.Endpoint, bool, error),
	remote func(context.Context, rpc.CNIBackendClient) (podip.Endpoint, bool, error),
) (podip.Endpoint, bool, error) {
	gone := func() (podip.Endpoint, bool, error) {
		if method == methodRelease {
			return r.locator.ReleaseOnDeletedNode(ctx, ref)
		}
		return podip.Endpoint{}, false, fmt.Errorf("node %s no longer exists", node)
	}
	from, forwarded := forwardedFrom(ctx)
	wait := r.ownerWait
	if forwarded {
		// The sender keeps waiting and re-routes; we only bridge a short gap
		// (our claim won, the node still rebuilding).
		wait = min(wait, 3*time.Second)
	}
	deadline := time.Now().Add(wait)
	waited := false
	var lastErr error
	for {
		rt := r.routes.RouteOf(node)
		switch {
		case rt.Local:
			ep, ok, err := local(ctx)
			if err == nil || !retryable(err) {
				r.waited(waited, err)
				return ep, ok, err
			}
			lastErr = err
		case rt.GRPC != "" && !forwarded:
			ep, ok, err := r.forward(ctx, method, rt, ref, remote)
			if err == nil || !retryable(err) {
				r.waited(waited, err)
				return ep, ok, err
			}
			lastErr = err
		}
		// A node deleted meanwhile will never be served again.
		if lastErr != nil && r.locator.NodeGone(ctx, node) {
			return gone()
		}
		if !time.Now().Before(deadline) || ctx.Err() != nil {
			r.metrics.ownerWaits.WithLabelValues("timeout").Inc()
			msg := fmt.Sprintf("no replica serves node %s (partition %d) yet; retry", node, rt.Partition)
			if forwarded {
				msg = fmt.Sprintf("forwarded by %s, but this replica does not serve node %s", from, node)
			}
			if lastErr != nil {
				msg += " (last: " + lastErr.Error() + ")"
			}
			return podip.Endpoint{}, false, fmt.Errorf("%w: %s", ErrNotOwner, msg)
		}
		waited = true
		select {
		case <-ctx.Done():
		case <-time.After(r.poll):
		}
	}
}

func (r *Router) waited(waited bool, err error) {
	if waited && err == nil {
		r.metrics.ownerWaits.WithLabelValues("served").Inc()
	}
}

// forward sends the call to the owner, signed.
func (r *Router) forward(ctx context.Context, method string, rt Route, ref podip.PodRef,
	remote func(context.Context, rpc.CNIBackendClient) (podip.Endpoint, bool, error),
) (podip.Endpoint, bool, error) {
	conn, err := r.conn(rt.GRPC)
	if err != nil {
		return podip.Endpoint{}, false, fmt.Errorf("%w: %w", ErrNotOwner, err)
	}
	req := &rpc.AllocateIPRequest{K8SPodName: ref.Name, K8SPodNamespace: ref.Namespace, K8SPodInfraContainerID: ref.ContainerID}
	ctx = metadata.AppendToOutgoingContext(ctx, headerForward, r.auth.Sign(method, req, r.self))
	ep, ok, err := remote(ctx, rpc.NewCNIBackendClient(conn))
	switch {
	case err == nil:
		r.metrics.forwarded.WithLabelValues("ok").Inc()
	case retryable(err):
		r.metrics.forwarded.WithLabelValues("not_owner").Inc()
	default:
		r.metrics.forwarded.WithLabelValues("error").Inc()
	}
	return ep, ok, err
}

func (r *Router) conn(addr string) (*grpc.ClientConn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.conns[addr]; ok {
		return c, nil
	}
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	r.conns[addr] = c
	return c, nil
}

// retryable: the node is (momentarily) not served where we asked — here
// (ErrNotOwner, the IPAM's refusals) or at the peer (its refusal, typed by
// the trailer: cni.RefusalError) — or the owner could not be reached; routing
// again may find the right place.
func retryable(err error) bool {
	if errors.Is(err, podip.ErrNotHere) {
		return true
	}
	// Transport errors (the owner died mid-call) come back as gRPC status
	// errors; the call is idempotent, so it is tried again where it now goes.
	return status.Code(err) == codes.Unavailable
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
