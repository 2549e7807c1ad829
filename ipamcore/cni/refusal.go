package cni

import (
	"context"
	"errors"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/cce-ipam/sharded/ipamcore/podip"
)

// The reply of a refused call stays what the reference CNI plugin reads
// (IsSuccess=false and ErrMsg); the kind of the refusal travels beside it in
// a gRPC trailer, for a replica that forwarded the call and must decide
// whether to route it again. The plugin ignores trailers.
const (
	// RefusalTrailer is the trailer key naming the kind of a refusal.
	RefusalTrailer = "cce-ipam-refusal"
	// RefusalNotHere is its value for a podip.ErrNotHere: this replica does
	// not serve the pod's node now.
	RefusalNotHere = "not-here"
)

// MarkRefusal is setRefusalTrailer for a handler that answers a call
// without this server (the shard router's fixed-IP moves).
func MarkRefusal(ctx context.Context, err error) { setRefusalTrailer(ctx, err) }

// setRefusalTrailer marks a failed call's kind on the wire. Outside a gRPC
// call (a direct method call in tests) there is no trailer to set, and the
// reply is the same either way, so that failure is ignored.
func setRefusalTrailer(ctx context.Context, err error) {
	if errors.Is(err, podip.ErrNotHere) {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(RefusalTrailer, RefusalNotHere))
	}
}

// RefusalError turns a failed reply back into an error: its text is errMsg,
// and it matches podip.ErrNotHere when the trailer (read with
// grpc.Trailer(&md) on the call) says the peer does not serve the node.
// Any other trailer, or none (a peer that does not mark refusals), gives a
// plain error.
func RefusalError(trailer metadata.MD, errMsg string) error {
	if slices.Contains(trailer.Get(RefusalTrailer), RefusalNotHere) {
		return &remoteRefusal{
			msg:  errMsg,
			kind: podip.ErrNotHere,
		}
	}
	return errors.New(errMsg)
}

// remoteRefusal is a peer's refusal: the peer's text, a kind of ours.
type remoteRefusal struct {
	msg  string
	kind error
}

func (e *remoteRefusal) Error() string { return e.msg }

func (e *remoteRefusal) Unwrap() error { return e.kind }
