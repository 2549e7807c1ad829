package ipam

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cce-ipam/sharded/cloud"
)

// Cloud calls are fenced per node (I1). Every cloud call made for a node
// carries the node's permission (forNode): the cloud client asks the fence
// before every HTTP attempt, retries included, refuses once it says no, and
// ends each attempt at the permission's deadline. The pool worker's calls
// carry it for their whole life; the CNI path's cloud calls (fixed IPs)
// carry it too.
//
// Work for a node that runs elsewhere (a GC pass, the ENI sync, a leaked
// ENI's delete) is in-flight work of the node (acquireWork), as a CNI call
// is: it runs only while the node is served, and StopServingNode ends its
// context and waits for it. So once StopServingNode has returned, this
// replica sends nothing more for the node; the previous owner's requests BCE
// had already taken are what the next owner's ReadLag settling is for.
//
// A leaked ENI of a deleted node is served by nobody. With a fence the
// holder of the node's partition deletes it, under the node's fence (the
// fence answers for a node's partition, served or not), so the delete has a
// deadline like any other. Without a fence the leader deletes it
// (forLeaderSweep), with the permission "this replica leads and the node is
// still gone", which has none.

// forNode marks ctx for cloud calls made for the node (cloud.ForNode, with
// the fence). Without a fence (one replica serving everything) ctx is
// returned as is.
func (i *IPAM) forNode(ctx context.Context, node string) context.Context {
	if i.deps.Fence == nil {
		return ctx
	}
	return cloud.ForNode(ctx, node, func() (time.Time, error) { return i.mayActUntil(node) })
}

// acquireWork registers work for a served node that does not run on its
// pool worker (GC, the ENI sync) as in flight on the node, as acquire does
// for a CNI call, so that StopServingNode waits for it. The context it
// returns carries the node's permission (forNode) and ends when the node
// stops being served: a drain cuts the work's cloud call off rather than
// wait for it. ok=false: the node is not served here, skip it. done must be
// called.
func (i *IPAM) acquireWork(ctx context.Context, name string) (_ context.Context, n *node, done func(), ok bool) {
	n, release, ok := i.acquire(name)
	if !ok {
		return ctx, nil, nil, false
	}
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(n.life, cancel)
	return i.forNode(ctx, name), n, func() {
		stop()
		cancel()
		release()
	}, true
}

var errNotLeader = errors.New("this replica no longer leads")

// forLeaderSweep marks ctx for the leader's delete of a leaked ENI of the
// deleted node, when there is no fence. The permission is this replica's
// leadership and the node's absence from the node cache (a node that came
// back under the same name is served again), asked before every attempt; it
// has no deadline. Every call passes the replica's gate as well.
func (i *IPAM) forLeaderSweep(ctx context.Context, node string) context.Context {
	return cloud.ForNode(ctx, node, func() (time.Time, error) {
		if i.deps.IsLeader != nil && !i.deps.IsLeader() {
			return time.Time{}, errNotLeader
		}
		if _, err := i.nodes.Get(node); err == nil {
			return time.Time{}, fmt.Errorf("node %s exists again", node)
		}
		return time.Time{}, nil
	})
}
