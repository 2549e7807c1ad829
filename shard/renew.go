package shard

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The replica Lease: renewed every RenewPeriod; a renewal's validity counts
// from when its write was sent. The renewals run on their own goroutine and
// hand the new validity to the loop, which alone changes the state the fence
// is published from.

// leaseWriter is what the renewals keep between writes: the Lease as last
// written, and whether to say that this replica is leaving. The loop writes
// once more itself when it starts leaving, concurrently with the renewals.
type leaseWriter struct {
	mu      sync.Mutex
	cur     *coordv1.Lease // as last written; nil: create or re-read next time
	leaving atomic.Bool
}

func (w *leaseWriter) last() *coordv1.Lease {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cur
}

func (w *leaseWriter) set(l *coordv1.Lease) {
	w.mu.Lock()
	w.cur = l
	w.mu.Unlock()
}

// renewLoop keeps the replica Lease fresh. Renewals start every
// RenewPeriod from the previous one's send, not from its reply: a slow
// renewal does not also delay the next by a whole period. The lease lapses
// when no renewal is sent successfully within RenewDeadline, so waiting a
// period after a slow reply made two renewals of 1.6 s lapse a 4 s deadline
// (while the bench filled 5,000 nodes on a saturated 2-core machine, 5 of
// each replica's first 683 renewals took 1–4 s).
func (c *Coordinator) renewLoop(ctx context.Context) {
	for ctx.Err() == nil {
		sent := c.clock.Now()
		if renewed := c.writeLease(ctx); renewed != nil {
			select {
			case c.results <- renewed:
			case <-ctx.Done():
			}
			c.Kick()
		}
		wait := c.cfg.RenewPeriod - c.clock.Since(sent)
		if wait <= 0 {
			continue
		}
		select {
		case <-ctx.Done():
		case <-c.clock.After(wait):
		}
	}
}

// writeLease creates or renews the replica Lease. On success it returns
// what the loop must apply (renewed); nil when the write failed.
func (c *Coordinator) writeLease(ctx context.Context) func() {
	sent := c.clock.Now()
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RenewDeadline)
	defer cancel()
	out, err := c.putLease(ctx, c.wantLease(sent))
	c.metrics.renewDuration.Observe(c.clock.Since(sent).Seconds())
	if err != nil {
		c.metrics.renewFailures.Inc()
		c.log.Warn("renewing the replica lease failed", "err", err)
		return nil
	}
	c.lease.set(out)
	return func() { c.renewed(sent) }
}

// wantLease is the replica Lease as of a renewal sent at sent.
func (c *Coordinator) wantLease(sent time.Time) *coordv1.Lease {
	return &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:   ReplicaLeaseName(c.self),
			Labels: map[string]string{labelKind: kindReplica},
			Annotations: map[string]string{
				annoMember:  c.self,
				annoGRPC:    c.addrs.GRPC,
				annoHTTP:    c.addrs.HTTP,
				annoGossip:  c.gossipAddr(),
				annoLeaving: fmt.Sprint(c.lease.leaving.Load()),
			},
		},
		Spec: coordv1.LeaseSpec{
			HolderIdentity:       ptr.To(c.self),
			LeaseDurationSeconds: ptr.To(int32((c.cfg.LeaseDuration + time.Second - 1) / time.Second)),
			RenewTime:            ptr.To(metav1.NewMicroTime(sent)),
		},
	}
}

// putLease writes want: an update of the Lease as last written, else a
// create (adopting an existing object only if it names us).
func (c *Coordinator) putLease(ctx context.Context, want *coordv1.Lease) (*coordv1.Lease, error) {
	client := c.kube.CoordinationV1().Leases(c.cfg.Namespace)
	cur := c.lease.last()
	if cur != nil {
		want.ResourceVersion = cur.ResourceVersion
		want.Spec.AcquireTime = cur.Spec.AcquireTime
		out, err := client.Update(ctx, want, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			c.lease.set(nil) // re-create or re-read next time
		}
		return out, err
	}
	want.Spec.AcquireTime = want.Spec.RenewTime
	out, err := client.Create(ctx, want, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		return out, err
	}
	// A restart of this very process is impossible (names are unique per
	// process); adopt the object only if it names us.
	got, err := client.Get(ctx, want.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if h := ptr.Deref(got.Spec.HolderIdentity, ""); h != c.self {
		return nil, fmt.Errorf("replica lease %s is held by %q", want.Name, h)
	}
	want.ResourceVersion = got.ResourceVersion
	return client.Update(ctx, want, metav1.UpdateOptions{})
}

// renewed applies a successful renewal sent at sent (on the loop). The
// Ownership decides what a renewal after a lapse fences (Renewed).
func (c *Coordinator) renewed(sent time.Time) {
	lapsed, fenced := c.own.Renewed(sent, sent.Add(c.cfg.RenewDeadline))
	// The fenced partitions and the renewed lease are published together.
	c.publish()
	if !lapsed {
		return
	}
	// Our budget entry may have been dropped as an expired replica's: win
	// it back by CAS before calling the cloud again.
	c.budget.revoke()
	if len(fenced) > 0 {
		c.metrics.handovers.WithLabelValues("fenced").Add(float64(len(fenced)))
		c.log.Warn("lease lapsed: stopped serving every partition; each must be claimed again", "partitions", len(fenced))
	}
}

// deleteLease removes the replica Lease after a complete leave, so others
// drop this replica at once.
func (c *Coordinator) deleteLease() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := c.kube.CoordinationV1().Leases(c.cfg.Namespace).Delete(ctx, ReplicaLeaseName(c.self), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		c.log.Warn("deleting the replica lease failed; others drop us when it expires", "err", err)
	}
}

// gossipAddr is what the replica Lease advertises for joining gossip.
func (c *Coordinator) gossipAddr() string {
	if c.gossipAt == nil {
		return ""
	}
	return c.gossipAt()
}
