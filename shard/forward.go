package shard

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// A call forwarded from one replica to the owner carries one metadata
// header, "x-cce-ipam-forward: <from>;<unix ms>;<mac>", where mac is
// HMAC-SHA256 under the shared forward key of the method, the pod, the
// sandbox, the sender and the time. A pod on the network cannot forge it
// without the key; a replayed header is only accepted for forwardSkew and
// only for the same call (which is idempotent). A forwarded call is never
// forwarded again: that is the hop limit.
const (
	headerForward = "x-cce-ipam-forward"
	forwardSkew   = 30 * time.Second
)

// ErrForgedForward is the refusal of a forward header that does not verify.
var ErrForgedForward = errors.New("forwarded call failed authentication")

type forwardedKey struct{}

// forwardedFrom returns the sending replica of a verified forwarded call.
func forwardedFrom(ctx context.Context) (string, bool) {
	from, ok := ctx.Value(forwardedKey{}).(string)
	return from, ok
}

// Authenticator signs and verifies forwarded calls.
type Authenticator struct {
	key []byte
	now func() time.Time
}

// NewAuthenticator uses key (nil or empty: unauthenticated, for development).
func NewAuthenticator(key []byte) *Authenticator {
	return &Authenticator{
		key: key,
		now: time.Now,
	}
}

func (a *Authenticator) mac(method, namespace, name, containerID, from string, ms int64) string {
	h := hmac.New(sha256.New, a.key)
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n%s\n%d", method, namespace, name, containerID, from, ms)
	return base64.RawStdEncoding.EncodeToString(h.Sum(nil))
}

// Sign returns the header value for a call.
func (a *Authenticator) Sign(method string, req podFields, from string) string {
	ms := a.now().UnixMilli()
	return from + ";" + strconv.FormatInt(ms, 10) + ";" +
		a.mac(method, req.GetK8SPodNamespace(), req.GetK8SPodName(), req.GetK8SPodInfraContainerID(), from, ms)
}

// Verify checks a header value for a call and returns the sender.
func (a *Authenticator) Verify(method string, req podFields, header string) (string, error) {
	parts := strings.Split(header, ";")
	if len(parts) != 3 || parts[0] == "" {
		return "", fmt.Errorf("%w: malformed header", ErrForgedForward)
	}
	ms, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: malformed time", ErrForgedForward)
	}
	if d := a.now().Sub(time.UnixMilli(ms)); d > forwardSkew || d < -forwardSkew {
		return "", fmt.Errorf("%w: stale or future timestamp (%s)", ErrForgedForward, d.Round(time.Second))
	}
	want := a.mac(method, req.GetK8SPodNamespace(), req.GetK8SPodName(), req.GetK8SPodInfraContainerID(), parts[0], ms)
	if !hmac.Equal([]byte(want), []byte(parts[2])) {
		return "", fmt.Errorf("%w: bad signature", ErrForgedForward)
	}
	return parts[0], nil
}

// podFields are the request fields the signature covers; every CNI request
// message has them.
type podFields interface {
	GetK8SPodName() string
	GetK8SPodNamespace() string
	GetK8SPodInfraContainerID() string
}

// UnaryInterceptor verifies forwarded calls before they reach the service:
// a call with a forward header that does not verify is refused with
// PermissionDenied; a verified one is marked so the router serves it here
// or refuses it, never forwarding again. Calls without the header (from the
// CNI plugin) pass unchanged.
func (r *Router) UnaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(headerForward)
	if len(vals) == 0 {
		return handler(ctx, req)
	}
	pf, ok := req.(podFields)
	if !ok || len(vals) != 1 {
		r.fwd.metrics.forwardRejected.Inc()
		return nil, status.Error(codes.PermissionDenied, ErrForgedForward.Error())
	}
	method := info.FullMethod
	move := isMove(md, info)
	if move {
		method = methodMove
	}
	from, err := r.fwd.auth.Verify(method, pf, vals[0])
	if err != nil {
		r.fwd.metrics.forwardRejected.Inc()
		r.log.Warn("rejected a forwarded call", "method", method, "err", err)
		return nil, status.Error(codes.PermissionDenied, err.Error())
	}
	ctx = context.WithValue(ctx, forwardedKey{}, from)
	if move {
		return r.serveMove(ctx, req)
	}
	return handler(ctx, req)
}

// Method names as gRPC reports them (and as the MAC covers them).
var (
	methodAllocate = "/" + rpc.CNIBackend_ServiceDesc.ServiceName + "/AllocateIP"
	methodRelease  = "/" + rpc.CNIBackend_ServiceDesc.ServiceName + "/ReleaseIP"
	methodCheck    = "/" + rpc.CNIBackend_ServiceDesc.ServiceName + "/CheckIP"
)
