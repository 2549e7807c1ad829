package cni

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/cce-ipam/sharded/ipamcore/podip"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// refusingBackend fails every call with err.
type refusingBackend struct{ err error }

func (b refusingBackend) Allocate(context.Context, podip.PodRef) (podip.Endpoint, error) {
	return podip.Endpoint{}, b.err
}

func (b refusingBackend) Release(context.Context, podip.PodRef) (podip.Endpoint, bool, error) {
	return podip.Endpoint{}, false, b.err
}

func (b refusingBackend) Check(context.Context, podip.PodRef) (podip.Endpoint, bool, error) {
	return podip.Endpoint{}, false, b.err
}

// failedCall is one method's reply as a forwarding replica reads it.
type failedCall struct {
	success bool
	errMsg  string
	trailer metadata.MD
}

// callEach runs AllocateIP, ReleaseIP and CheckIP for one pod, reading the
// trailer of each.
func callEach(t *testing.T, c rpc.CNIBackendClient) map[string]failedCall {
	t.Helper()
	ctx := context.Background()
	out := map[string]failedCall{}
	var md metadata.MD
	a, err := c.AllocateIP(ctx, allocReq("default", "web-0", "abc"), grpc.Trailer(&md))
	if err != nil {
		t.Fatalf("AllocateIP: gRPC error %v", err)
	}
	out[methodAllocate] = failedCall{a.GetIsSuccess(), a.GetErrMsg(), md}
	md = nil
	r, err := c.ReleaseIP(ctx, releaseReq("web-0", "abc"), grpc.Trailer(&md))
	if err != nil {
		t.Fatalf("ReleaseIP: gRPC error %v", err)
	}
	out[methodRelease] = failedCall{r.GetIsSuccess(), r.GetErrMsg(), md}
	md = nil
	k, err := c.CheckIP(ctx, checkReq("web-0", "abc"), grpc.Trailer(&md))
	if err != nil {
		t.Fatalf("CheckIP: gRPC error %v", err)
	}
	out[methodCheck] = failedCall{k.GetIsSuccess(), k.GetErrMsg(), md}
	return out
}

func TestServer_Refusal_NotHereTravelsInTrailer(t *testing.T) {
	notServed := podip.NotHere("node not served by this replica")
	c := serve(t, DefaultConfig(), refusingBackend{err: fmt.Errorf("%w: node-1", notServed)}, nil)
	for method, got := range callEach(t, c) {
		if got.success {
			t.Fatalf("%s: IsSuccess=true for a refused call", method)
		}
		// The plugin's view is unchanged: the method, the pod, the
		// backend's text.
		want := method + " default/web-0 (abc): node not served by this replica: node-1"
		if got.errMsg != want {
			t.Errorf("%s: ErrMsg = %q, want %q", method, got.errMsg, want)
		}
		if v := got.trailer.Get(RefusalTrailer); len(v) != 1 || v[0] != RefusalNotHere {
			t.Errorf("%s: trailer %s = %q, want [%q]", method, RefusalTrailer, v, RefusalNotHere)
		}
		err := RefusalError(got.trailer, got.errMsg)
		if !errors.Is(err, podip.ErrNotHere) {
			t.Errorf("%s: decoded refusal %v does not match podip.ErrNotHere", method, err)
		}
		if err.Error() != got.errMsg {
			t.Errorf("%s: decoded text %q, want the reply's %q", method, err.Error(), got.errMsg)
		}
	}
}

func TestServer_Refusal_OtherFailuresCarryNoKind(t *testing.T) {
	c := serve(t, DefaultConfig(), refusingBackend{err: errors.New("no idle IP on the node")}, nil)
	for method, got := range callEach(t, c) {
		if got.success || got.errMsg == "" {
			t.Fatalf("%s: reply success=%v msg=%q, want a failure", method, got.success, got.errMsg)
		}
		if v := got.trailer.Get(RefusalTrailer); len(v) != 0 {
			t.Errorf("%s: trailer %s = %q on an ordinary failure", method, RefusalTrailer, v)
		}
		if err := RefusalError(got.trailer, got.errMsg); errors.Is(err, podip.ErrNotHere) {
			t.Errorf("%s: an ordinary failure decodes as podip.ErrNotHere", method)
		}
	}
}

// A request refused before the backend (invalid, busy) is not a refusal of
// the node: routing it elsewhere cannot help.
func TestServer_Refusal_InvalidRequestCarriesNoKind(t *testing.T) {
	c := serve(t, DefaultConfig(), refusingBackend{err: podip.NotHere("never reached")}, nil)
	var md metadata.MD
	reply, err := c.AllocateIP(context.Background(), allocReq("Bad_NS", "web-0", "abc"), grpc.Trailer(&md))
	if err != nil {
		t.Fatal(err)
	}
	if reply.GetIsSuccess() {
		t.Fatal("invalid request succeeded")
	}
	if v := md.Get(RefusalTrailer); len(v) != 0 {
		t.Errorf("trailer %s = %q on an invalid request", RefusalTrailer, v)
	}
}

func TestRefusalError_Decodes(t *testing.T) {
	cases := []struct {
		name    string
		trailer metadata.MD
		notHere bool
	}{
		{"no trailer", nil, false},
		{"other keys", metadata.Pairs("x-other", RefusalNotHere), false},
		{"not here", metadata.Pairs(RefusalTrailer, RefusalNotHere), true},
		{"unknown kind", metadata.Pairs(RefusalTrailer, "gone-fishing"), false},
		{"several values", metadata.Pairs(RefusalTrailer, "later-kind", RefusalTrailer, RefusalNotHere), true},
		{"kind with spaces", metadata.Pairs(RefusalTrailer, " not-here"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := RefusalError(tc.trailer, "peer says no")
			if err == nil || err.Error() != "peer says no" {
				t.Fatalf("error = %v, want the reply's text", err)
			}
			if got := errors.Is(err, podip.ErrNotHere); got != tc.notHere {
				t.Fatalf("errors.Is(err, podip.ErrNotHere) = %v, want %v", got, tc.notHere)
			}
		})
	}
}

// FuzzRefusalError: whatever a peer sends in the trailer, the decoded error
// keeps the reply's text and is a podip.ErrNotHere exactly when one of the
// trailer's values is the not-here kind.
func FuzzRefusalError(f *testing.F) {
	f.Add(RefusalNotHere, "", "node not served by this replica")
	f.Add("gone-fishing", RefusalNotHere, "")
	f.Add("not-here\x00", "NOT-HERE", "\xff")
	f.Fuzz(func(t *testing.T, v1, v2, msg string) {
		md := metadata.MD{RefusalTrailer: {v1, v2}}
		err := RefusalError(md, msg)
		if err == nil || err.Error() != msg {
			t.Fatalf("RefusalError(%q, %q) = %v, want an error with the reply's text", md, msg, err)
		}
		want := v1 == RefusalNotHere || v2 == RefusalNotHere
		if got := errors.Is(err, podip.ErrNotHere); got != want {
			t.Fatalf("RefusalError(%q): errors.Is(ErrNotHere) = %v, want %v", md, got, want)
		}
	})
}
