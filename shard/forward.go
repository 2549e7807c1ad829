package shard

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// A call forwarded from one replica to the owner carries one metadata
// header, "x-cce-ipam-forward: <from>;<unix ms>;<mac>", where mac is
// HMAC-SHA256 under the shared forward key of the method, the sender, the
// time and the whole request message (its deterministic protobuf encoding:
// every field, the node name, the IP type and a fixed-IP move's address
// included). The forwarder signs in a client interceptor, so what it signs
// is exactly the message it sends. A pod on the network cannot forge or
// alter one without the key; a replayed header is only accepted for
// forwardSkew and only for the same request (which is idempotent). A
// forwarded call is never forwarded again: that is the hop limit.
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

// Forwarded tells a call that another replica forwarded here, verified by
// the Router's UnaryInterceptor, from one a CNI plugin made: the test
// cni.WithForwarded takes, so that the CNI metrics count each call once.
func Forwarded(ctx context.Context) bool {
	_, ok := forwardedFrom(ctx)
	return ok
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

// deterministic encodes a request the same way on both ends: the receiver
// re-encodes the message it decoded, so the MAC needs no access to the
// bytes on the wire.
var deterministic = proto.MarshalOptions{Deterministic: true}

// mac covers the method, the sender, the time and the encoded request, each
// length-prefixed so no two different calls share an input.
func (a *Authenticator) mac(method, from string, ms int64, body []byte) string {
	h := hmac.New(sha256.New, a.key)
	for _, part := range [][]byte{[]byte(method), []byte(from), []byte(strconv.FormatInt(ms, 10)), body} {
		var n [binary.MaxVarintLen64]byte
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(part)))])
		h.Write(part)
	}
	return base64.RawStdEncoding.EncodeToString(h.Sum(nil))
}

// Sign returns the header value for a call of method with req.
func (a *Authenticator) Sign(method string, req proto.Message, from string) (string, error) {
	body, err := deterministic.Marshal(req)
	if err != nil {
		return "", fmt.Errorf("sign %s: %w", method, err)
	}
	ms := a.now().UnixMilli()
	return from + ";" + strconv.FormatInt(ms, 10) + ";" + a.mac(method, from, ms, body), nil
}

// Verify checks a header value for a call of method with req and returns
// the sender.
func (a *Authenticator) Verify(method string, req proto.Message, header string) (string, error) {
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
	body, err := deterministic.Marshal(req)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrForgedForward, err)
	}
	if !hmac.Equal([]byte(a.mac(method, parts[0], ms, body)), []byte(parts[2])) {
		return "", fmt.Errorf("%w: bad signature", ErrForgedForward)
	}
	return parts[0], nil
}

// ForwardKeyFromGossipKey derives the forward key of a deployment that has
// only a gossip key (HMAC-SHA256 of the gossip key over a fixed label), so
// that the gossip encryption key is never used as an HMAC key itself.
func ForwardKeyFromGossipKey(gossipKey []byte) []byte {
	h := hmac.New(sha256.New, gossipKey)
	h.Write([]byte("cce-ipam forward key v1"))
	return h.Sum(nil)
}

// signedMethod is the name a call is signed under: a fixed-IP move is a
// ReleaseIP with headerMove, signed under its own name so that neither can
// pass for the other.
func signedMethod(fullMethod string, move bool) string {
	if move {
		return methodMove
	}
	return fullMethod
}

// signCall is the client interceptor of the connections to other replicas
// (only forwarded calls use them): it signs the request being sent.
func (f *Forwarder) signCall(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	msg, ok := req.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "forward %s: not a protobuf request", method)
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	header, err := f.auth.Sign(signedMethod(method, len(md.Get(headerMove)) > 0 && method == methodRelease), msg, f.self)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	return invoker(metadata.AppendToOutgoingContext(ctx, headerForward, header), method, req, reply, cc, opts...)
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
	msg, ok := req.(proto.Message)
	if !ok || len(vals) != 1 {
		r.fwd.metrics.forwardRejected.Inc()
		return nil, status.Error(codes.PermissionDenied, ErrForgedForward.Error())
	}
	move := isMove(md, info)
	method := signedMethod(info.FullMethod, move)
	from, err := r.fwd.auth.Verify(method, msg, vals[0])
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
)
