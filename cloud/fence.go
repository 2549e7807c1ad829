package cloud

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrFenced matches a call that stopped because a node permission it
// carries (ForNode) ended: refused before an attempt (that attempt was
// never sent), or an attempt cut off at the permission's deadline (which
// may have reached BCE).
var ErrFenced = errors.New("cloud: the permission to act for the node has ended")

type permKey struct{}

// permission is one link of the chain of node permissions a context carries.
type permission struct {
	node string
	may  func() (until time.Time, err error)
	next *permission
}

// ForNode returns ctx for calls made for one node. may says whether this
// replica may still act for the node, and until when (zero: no end); the
// IPAM passes its fence (ipam.Fence.MayAct).
//
// Client asks may before every HTTP attempt of such a call, retries
// included, and before and after its token wait, as it checks the gate: a
// refusal fails the call with class Canceled, matching ErrFenced and the
// refusal, and sends nothing more. Each attempt ends at the deadline may
// returned, so no request is still being sent for the node once its
// permission has ended. A context may carry several permissions (ForNode
// of a ForNode context: a fixed IP moved from one node to another acts for
// both); all of them must hold, and the earliest deadline applies.
func ForNode(ctx context.Context, node string, may func() (until time.Time, err error)) context.Context {
	next, _ := ctx.Value(permKey{}).(*permission)
	return context.WithValue(ctx, permKey{}, &permission{node: node, may: may, next: next})
}

// nodePermitted asks every permission ctx carries. It returns the earliest
// deadline (zero: none), or the first refusal as an *Error of class
// Canceled. last, when not nil, is the failure of the attempt before: the
// call is refused a retry.
func nodePermitted(ctx context.Context, op, resource string, last *Error) (time.Time, *Error) {
	var until time.Time
	for p, _ := ctx.Value(permKey{}).(*permission); p != nil; p = p.next {
		u, err := p.may()
		if err == nil && !u.IsZero() && !time.Now().Before(u) {
			err = fmt.Errorf("permission ended at %s", u.Format(time.RFC3339Nano))
		}
		if err != nil {
			msg := "fenced: node " + p.node + ": " + err.Error()
			if last != nil {
				msg += "; not retried after " + last.Class.String() + ": " + last.Message
			}
			return time.Time{}, &Error{Op: op, Resource: resource, Class: ClassCanceled, Message: msg,
				cause: fmt.Errorf("%w: %w", ErrFenced, err)}
		}
		if !u.IsZero() && (until.IsZero() || u.Before(until)) {
			until = u
		}
	}
	return until, nil
}
