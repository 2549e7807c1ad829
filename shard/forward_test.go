package shard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/cce-ipam/sharded/ipamcore/cni"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

func TestAuthenticator_SignVerify(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	a := NewAuthenticator(key)
	a.now = func() time.Time { return now }
	req := &rpc.AllocateIPRequest{K8SPodName: "web-0", K8SPodNamespace: "default", K8SPodInfraContainerID: "abc",
		K8SNodeName: "n1", IPType: rpc.IPType_BCCMultiENIMultiIPType}
	h := mustSign(t, a, methodAllocate, req, "r1-aa")
	if from, err := a.Verify(methodAllocate, req, h); err != nil || from != "r1-aa" {
		t.Fatalf("verify own signature: %q, %v", from, err)
	}
	other := NewAuthenticator([]byte("another key, another cluster...."))
	other.now = a.now
	cases := map[string]func() (string, error){
		"other key":    func() (string, error) { return other.Verify(methodAllocate, req, h) },
		"other method": func() (string, error) { return a.Verify(methodRelease, req, h) },
		"other node": func() (string, error) {
			r := proto.Clone(req).(*rpc.AllocateIPRequest)
			r.K8SNodeName = "n2"
			return a.Verify(methodAllocate, r, h)
		},
		"other sender": func() (string, error) { return a.Verify(methodAllocate, req, "r2-bb"+h[strings.Index(h, ";"):]) },
		"malformed":    func() (string, error) { return a.Verify(methodAllocate, req, "nonsense") },
		"empty sender": func() (string, error) { return a.Verify(methodAllocate, req, h[strings.Index(h, ";"):]) },
		"stale": func() (string, error) {
			late := NewAuthenticator(key)
			late.now = func() time.Time { return now.Add(forwardSkew + time.Second) }
			return late.Verify(methodAllocate, req, h)
		},
	}
	for name, verify := range cases {
		if _, err := verify(); !errors.Is(err, ErrForgedForward) {
			t.Errorf("%s: got %v, want ErrForgedForward", name, err)
		}
	}
}

// Every field of every CNI request message is covered: a signed request
// with any one field changed (found by reflection, so a field added to the
// proto later is covered too) does not verify.
func TestAuthenticator_EveryFieldIsCovered(t *testing.T) {
	a := NewAuthenticator([]byte("0123456789abcdef0123456789abcdef"))
	for method, req := range map[string]proto.Message{
		methodAllocate: &rpc.AllocateIPRequest{},
		methodRelease:  &rpc.ReleaseIPRequest{},
		methodMove:     &rpc.ReleaseIPRequest{},
		"/" + rpc.CNIBackend_ServiceDesc.ServiceName + "/CheckIP": &rpc.CheckIPRequest{},
	} {
		fields := req.ProtoReflect().Descriptor().Fields()
		if fields.Len() < 5 {
			t.Fatalf("%s: only %d fields", method, fields.Len())
		}
		for i := range fields.Len() {
			setField(t, req.ProtoReflect(), fields.Get(i), 1)
		}
		h := mustSign(t, a, method, req, "r1")
		if _, err := a.Verify(method, req, h); err != nil {
			t.Fatalf("%s: own signature: %v", method, err)
		}
		for i := range fields.Len() {
			fd := fields.Get(i)
			changed := proto.Clone(req)
			setField(t, changed.ProtoReflect(), fd, 2)
			if proto.Equal(changed, req) {
				// An empty message (CrossVPCENIRequest) has no value to
				// change; set or not is its change.
				changed.ProtoReflect().Clear(fd)
			}
			if _, err := a.Verify(method, changed, h); !errors.Is(err, ErrForgedForward) {
				t.Errorf("%s with %s changed: got %v, want ErrForgedForward", method, fd.Name(), err)
			}
			if fd.Kind() != protoreflect.MessageKind {
				continue
			}
			inner := fd.Message().Fields()
			for j := range inner.Len() {
				changed := proto.Clone(req)
				setField(t, changed.ProtoReflect().Mutable(fd).Message(), inner.Get(j), 2)
				if _, err := a.Verify(method, changed, h); !errors.Is(err, ErrForgedForward) {
					t.Errorf("%s with %s.%s changed: got %v, want ErrForgedForward", method, fd.Name(), inner.Get(j).Name(), err)
				}
			}
		}
	}
}

// setField gives a field a value that differs for each variant (a message:
// every field of it).
func setField(t *testing.T, m protoreflect.Message, fd protoreflect.FieldDescriptor, variant int) {
	t.Helper()
	if fd.IsList() || fd.IsMap() {
		t.Fatalf("field %s: lists and maps not handled by the test", fd.FullName())
	}
	var v protoreflect.Value
	switch fd.Kind() {
	case protoreflect.MessageKind:
		inner := m.NewField(fd).Message()
		for i := range fd.Message().Fields().Len() {
			setField(t, inner, fd.Message().Fields().Get(i), variant)
		}
		v = protoreflect.ValueOfMessage(inner)
	case protoreflect.StringKind:
		v = protoreflect.ValueOfString(fmt.Sprintf("%s-%d", fd.Name(), variant))
	case protoreflect.EnumKind:
		v = protoreflect.ValueOfEnum(protoreflect.EnumNumber(variant))
	case protoreflect.BoolKind:
		v = protoreflect.ValueOfBool(variant%2 == 1)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		v = protoreflect.ValueOfInt32(int32(variant))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		v = protoreflect.ValueOfInt64(int64(variant))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		v = protoreflect.ValueOfUint32(uint32(variant))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		v = protoreflect.ValueOfUint64(uint64(variant))
	default:
		t.Fatalf("field %s: kind %s not handled by the test", fd.FullName(), fd.Kind())
	}
	m.Set(fd, v)
}

func mustSign(t *testing.T, a *Authenticator, method string, req proto.Message, from string) string {
	t.Helper()
	h, err := a.Sign(method, req, from)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// cniStub answers every CNI call with success (the calls that get past the
// router's interceptor).
type cniStub struct {
	rpc.UnimplementedCNIBackendServer
}

func (cniStub) AllocateIP(context.Context, *rpc.AllocateIPRequest) (*rpc.AllocateIPReply, error) {
	return &rpc.AllocateIPReply{IsSuccess: true}, nil
}

func (cniStub) ReleaseIP(context.Context, *rpc.ReleaseIPRequest) (*rpc.ReleaseIPReply, error) {
	return &rpc.ReleaseIPReply{IsSuccess: true}, nil
}

// Over a real gRPC connection: the forwarder's connection signs what it
// sends; a request changed after signing (here: by an interceptor behind
// the signing one, as a man in the middle would) is refused by the owner's
// interceptor with PermissionDenied, an unchanged one is served. A move
// whose old node is changed is refused too.
func TestForward_ChangedInFlightIsRefused(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	owner := &Router{fwd: NewForwarder(ForwarderDeps{Self: "r2", Auth: NewAuthenticator(key)}, nil, nil),
		log: slog.New(slog.DiscardHandler)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(owner.UnaryInterceptor))
	rpc.RegisterCNIBackendServer(srv, cniStub{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	sender := NewForwarder(ForwarderDeps{Self: "r1", Auth: NewAuthenticator(key)}, nil, nil)
	dial := func(tamper grpc.UnaryClientInterceptor) rpc.CNIBackendClient {
		c, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithChainUnaryInterceptor(sender.signCall, tamper))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return rpc.NewCNIBackendClient(c)
	}
	untouched := dial(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	renamed := dial(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		switch r := req.(type) {
		case *rpc.AllocateIPRequest:
			r.K8SNodeName = "another-node"
		case *rpc.ReleaseIPRequest:
			r.K8SNodeName = "another-node"
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	ctx := t.Context()
	alloc := func() *rpc.AllocateIPRequest {
		return &rpc.AllocateIPRequest{K8SPodName: "web-0", K8SPodNamespace: "default", K8SPodInfraContainerID: "abc",
			K8SNodeName: "n1", IPType: rpc.IPType_BCCMultiENIMultiIPType}
	}
	if reply, err := untouched.AllocateIP(ctx, alloc()); err != nil || !reply.GetIsSuccess() {
		t.Fatalf("an unchanged forwarded call: %v, %v", reply, err)
	}
	if _, err := renamed.AllocateIP(ctx, alloc()); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a forwarded AllocateIP with its node name changed: %v, want PermissionDenied", err)
	}
	move := func() *rpc.ReleaseIPRequest {
		return &rpc.ReleaseIPRequest{K8SPodName: "db-0", K8SPodNamespace: "ns", K8SPodInfraContainerID: "move:10.0.0.7@eni-a",
			K8SNodeName: "n1", IPType: rpc.IPType_BCCMultiENIMultiIPType}
	}
	moveCtx := metadata.AppendToOutgoingContext(ctx, headerMove, "1")
	// The owner has no Mover: an authenticated move reaches it and is
	// refused as not servable here, not as forged.
	if reply, err := untouched.ReleaseIP(moveCtx, move()); err != nil || reply.GetIsSuccess() ||
		!strings.Contains(reply.GetErrMsg(), "cannot move") {
		t.Fatalf("an unchanged move: %v, %v", reply, err)
	}
	if _, err := renamed.ReleaseIP(moveCtx, move()); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a move with its node name changed: %v, want PermissionDenied", err)
	}
}

// FuzzVerify: any header, for any request, is an error or a verified sender;
// never a panic.
func FuzzVerify(f *testing.F) {
	a := NewAuthenticator([]byte("0123456789abcdef"))
	req := &rpc.AllocateIPRequest{K8SPodName: "p", K8SPodNamespace: "n", K8SPodInfraContainerID: "c"}
	h, err := a.Sign(methodAllocate, req, "r0")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(h, "p", "n", "c")
	f.Add(";;", "", "", "")
	f.Add("a;99999999999999999999;x", "p", "n", "c")
	f.Fuzz(func(t *testing.T, header, pod, ns, cid string) {
		r := &rpc.AllocateIPRequest{K8SPodName: pod, K8SPodNamespace: ns, K8SPodInfraContainerID: cid}
		from, err := a.Verify(methodAllocate, r, header)
		if err == nil && from == "" {
			t.Fatal("verified with an empty sender")
		}
	})
}

// A peer's refusal is retried because of its kind, marked in the trailer,
// never because of its text; the local refusals are retried by kind too.
func TestRetryable_ByKindNotText(t *testing.T) {
	notHere := metadata.Pairs(cni.RefusalTrailer, cni.RefusalNotHere)
	for name, tc := range map[string]struct {
		err  error
		want bool
	}{
		"peer refusal marked not-here":  {cni.RefusalError(notHere, "AllocateIP ns/p (abc): no replica serves node n yet"), true},
		"peer text without the trailer": {cni.RefusalError(nil, "AllocateIP ns/p (abc): not the owner of the node"), false},
		"peer failure":                  {cni.RefusalError(metadata.MD{}, "AllocateIP ns/p (abc): no idle IP on the node"), false},
		"not the owner here":            {fmt.Errorf("%w: partition 3 is draining here", ErrNotOwner), true},
		"node not served by the IPAM":   {fmt.Errorf("%w: n", ipam.ErrNodeNotServed), true},
		"fenced IPAM write":             {fmt.Errorf("commit: %w", ipam.ErrFenced), true},
		"owner unreachable":             {status.Error(codes.Unavailable, "connection refused"), true},
		"ordinary failure":              {errors.New("no idle IP on the node"), false},
	} {
		if got := retryable(tc.err); got != tc.want {
			t.Errorf("%s: retryable(%v) = %v, want %v", name, tc.err, got, tc.want)
		}
	}
}

func TestTarget_SharesNeverExceedTheBudget(t *testing.T) {
	for _, global := range []Share{{Rate: 10, Burst: 5}, {Rate: 20, Burst: 10}, {Rate: 7, Burst: 3}, {Rate: 100, Burst: 1}} {
		for n := 1; n <= 9; n++ {
			var live []string
			for i := range n {
				live = append(live, string(rune('a'+i)))
			}
			var sum Share
			for _, m := range live {
				s := demandTarget(global, live, m, nil, true, 0) // all busy: the even split
				if s.Burst < 1 || s.Rate <= 0 {
					t.Fatalf("global %v, %d replicas: %s gets %v", global, n, m, s)
				}
				sum.Rate += s.Rate
				sum.Burst += s.Burst
			}
			if sum.Rate > global.Rate+1e-9 {
				t.Errorf("global %v, %d replicas: rates sum to %v", global, n, sum.Rate)
			}
			// Burst cannot go below one token each; within that, it never
			// exceeds the global burst.
			if sum.Burst > max(global.Burst, int64(n)) {
				t.Errorf("global %v, %d replicas: bursts sum to %d", global, n, sum.Burst)
			}
		}
	}
	if s := demandTarget(Share{Rate: 10, Burst: 5}, []string{"a", "b"}, "c", nil, true, 0); s != (Share{}) {
		t.Errorf("a replica outside the ring gets %v", s)
	}
}

// Demand-following: idle replicas keep what they use, the busy one gets the
// rest; the targets of any mix never sum above the budget once everyone has
// published its own.
func TestDemandTarget(t *testing.T) {
	global := Share{Rate: 30, Burst: 15}
	live := []string{"a", "b", "c"}
	// Nothing published yet: everyone counts as busy, even split.
	if s := demandTarget(global, live, "a", nil, true, 0); s.Rate != 10 {
		t.Fatalf("unpublished peers: %v, want 10/s", s)
	}
	// b and c idle, each holding 2.5/s (a quarter of fair): a gets 25.
	idle := map[string]Share{"b": {Rate: 2.5, Burst: 1}, "c": {Rate: 2.5, Burst: 1}}
	if s := demandTarget(global, live, "a", idle, true, 0); s.Rate != 25 {
		t.Fatalf("busy among idle peers: %v, want 25/s", s)
	}
	// An idle replica keeps twice its use, clamped to [fair/4, fair].
	for need, want := range map[float64]float64{0: 2.5, 4: 4, 50: 10} {
		if s := demandTarget(global, live, "b", nil, false, need); s.Rate != want {
			t.Errorf("idle with need %v: %v, want %v", need, s.Rate, want)
		}
	}
	// b turns busy: a and b split what c leaves.
	pub := map[string]Share{"a": {Rate: 25, Burst: 12, Busy: true}, "b": {Rate: 2.5, Burst: 1, Busy: true}, "c": {Rate: 2.5, Burst: 1}}
	sa := demandTarget(global, live, "a", pub, true, 0)
	sb := demandTarget(global, live, "b", pub, true, 0)
	sc := demandTarget(global, live, "c", pub, false, 1)
	if sa.Rate != 13.75 || sb.Rate != 13.75 {
		t.Fatalf("two busy, one idle: a %v b %v, want 13.75 each", sa, sb)
	}
	if sum := sa.Rate + sb.Rate + sc.Rate; sum > global.Rate+1e-9 {
		t.Fatalf("targets sum to %v above %v", sum, global.Rate)
	}
	if s := demandTarget(global, live, "z", pub, true, 0); s != (Share{}) {
		t.Errorf("a replica outside the ring gets %v", s)
	}
}
