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
	"google.golang.org/grpc/status"

	"github.com/cce-ipam/sharded/ipamcore/podip"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// Forwarder sends a call to the replica that serves its node, in one
// authenticated hop, waiting while the node has no owner. It needs only the
// routing table, so it is built before the IPAM, which sends fixed-IP moves
// through it (FreeMovedIP); the Router, built after the IPAM, adds the local
// side. Neither points back at the other.
type Forwarder struct {
	routes    Routes
	self      string
	ownerWait time.Duration
	poll      time.Duration
	auth      *Authenticator
	log       *slog.Logger
	metrics   routerMetrics

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// Routes answers where a call for a node goes now (Fence implements it).
type Routes interface {
	RouteOf(node string) Route
}

// ForwarderDeps are a Forwarder's connections.
type ForwarderDeps struct {
	// Self is this replica's member name (it signs forwarded calls).
	Self string
	// Routes is this replica's routing table (the Coordinator's Fence).
	Routes Routes
	// Auth signs and verifies forwarded calls.
	Auth *Authenticator
	// OwnerWait bounds the wait for a node without an owner
	// (Config.OwnerWait).
	OwnerWait time.Duration
}

// NewForwarder forwards the calls of one replica; it registers the routing
// metrics.
func NewForwarder(deps ForwarderDeps, log *slog.Logger, reg prometheus.Registerer) *Forwarder {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Forwarder{
		routes:    deps.Routes,
		self:      deps.Self,
		ownerWait: deps.OwnerWait,
		poll:      100 * time.Millisecond,
		auth:      deps.Auth,
		log:       log,
		metrics:   newRouterMetrics(reg),
		conns:     map[string]*grpc.ClientConn{},
	}
}

// Close drops the connections to other replicas.
func (f *Forwarder) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for addr, c := range f.conns {
		_ = c.Close()
		delete(f.conns, addr)
	}
}

// call is one routed call: where it goes, and how it is served at each end.
type call struct {
	node string
	// local serves it here; nil: this side cannot (the call is refused
	// when the node's partition is this replica's).
	local func(context.Context) (podip.Endpoint, bool, error)
	// remote sends it to the owner.
	remote func(context.Context, rpc.CNIBackendClient) (podip.Endpoint, bool, error)
	// nodeGone, when set, is asked after a refusal: a deleted node will never
	// be served again, and the call ends with gone.
	nodeGone func(context.Context, string) bool
	gone     func(context.Context) (podip.Endpoint, bool, error)
}

// route runs a call where its node is served, waiting while it has no owner.
func (f *Forwarder) route(ctx context.Context, c call) (podip.Endpoint, bool, error) {
	from, forwarded := forwardedFrom(ctx)
	wait := f.ownerWait
	if forwarded {
		// The sender keeps waiting and re-routes; we only bridge a short gap
		// (our claim won, the node still rebuilding).
		wait = min(wait, 3*time.Second)
	}
	deadline := time.Now().Add(wait)
	waited := false
	var lastErr error
	for {
		rt := f.routes.RouteOf(c.node)
		switch {
		case rt.Local && c.local == nil:
			return podip.Endpoint{}, false, fmt.Errorf("%w: node %s (partition %d) is this replica's, but not served yet; retry",
				ErrNotOwner, c.node, rt.Partition)
		case rt.Local:
			ep, ok, err := c.local(ctx)
			if err == nil || !retryable(err) {
				f.waited(waited, err)
				return ep, ok, err
			}
			lastErr = err
		case rt.GRPC != "" && !forwarded:
			ep, ok, err := f.forward(ctx, rt, c.remote)
			if err == nil || !retryable(err) {
				f.waited(waited, err)
				return ep, ok, err
			}
			lastErr = err
		}
		if lastErr != nil && c.nodeGone != nil && c.nodeGone(ctx, c.node) {
			return c.gone(ctx)
		}
		if !time.Now().Before(deadline) || ctx.Err() != nil {
			f.metrics.ownerWaits.WithLabelValues("timeout").Inc()
			msg := fmt.Sprintf("no replica serves node %s (partition %d) yet; retry", c.node, rt.Partition)
			if forwarded {
				msg = fmt.Sprintf("forwarded by %s, but this replica does not serve node %s", from, c.node)
			}
			if lastErr != nil {
				msg += " (last: " + lastErr.Error() + ")"
			}
			return podip.Endpoint{}, false, fmt.Errorf("%w: %s", ErrNotOwner, msg)
		}
		waited = true
		select {
		case <-ctx.Done():
		case <-time.After(f.poll):
		}
	}
}

func (f *Forwarder) waited(waited bool, err error) {
	if waited && err == nil {
		f.metrics.ownerWaits.WithLabelValues("served").Inc()
	}
}

// forward sends the call to the owner; the connection signs it (signCall).
func (f *Forwarder) forward(ctx context.Context, rt Route,
	remote func(context.Context, rpc.CNIBackendClient) (podip.Endpoint, bool, error),
) (podip.Endpoint, bool, error) {
	conn, err := f.conn(rt.GRPC)
	if err != nil {
		return podip.Endpoint{}, false, fmt.Errorf("%w: %w", ErrNotOwner, err)
	}
	ep, ok, err := remote(ctx, rpc.NewCNIBackendClient(conn))
	switch {
	case err == nil:
		f.metrics.forwarded.WithLabelValues("ok").Inc()
	case retryable(err):
		f.metrics.forwarded.WithLabelValues("not_owner").Inc()
	default:
		f.metrics.forwarded.WithLabelValues("error").Inc()
	}
	return ep, ok, err
}

func (f *Forwarder) conn(addr string) (*grpc.ClientConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.conns[addr]; ok {
		return c, nil
	}
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(f.signCall))
	if err != nil {
		return nil, err
	}
	f.conns[addr] = c
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
