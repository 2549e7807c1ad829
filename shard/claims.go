package shard

import (
	"context"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The claim I/O: a partition's claim is a Lease changed only by
// compare-and-swap. Each runs on a goroutine of its own and hands its
// outcome back to the loop on c.results; what it reads of the loop's state,
// it reads from the published snapshot.

// startAction launches the I/O of one Action; its outcome comes back through
// c.results.
func (c *Coordinator) startAction(ctx context.Context, a Action, claim Claim) {
	switch a.Kind {
	case ActClaim:
		c.inFlight.io++
		if c.inFlight.claims == 0 {
			c.inFlight.claimsSince = c.clock.Now()
		}
		c.inFlight.claims++
		go c.claim(ctx, a.Partition, claim)
	case ActServe:
		c.metrics.partitionsClaimed.Inc()
	case ActStop:
		// Nodes of the partition are stopped by reconcileNodes; a draining
		// partition is released once they all are.
		c.log.Info("stopping partition", "partition", a.Partition, "draining", !a.Fenced)
		if a.Fenced {
			c.metrics.handovers.WithLabelValues("fenced").Inc()
		}
	case ActRelease:
		c.inFlight.io++
		go func() {
			c.release(ctx, a.Partition, a.Version)
			c.results <- func() { c.inFlight.io-- }
		}()
	case ActReleaseOrphan:
		c.inFlight.io++
		c.log.Info("releasing a claim this replica no longer serves", "partition", a.Partition)
		go func() {
			c.release(ctx, a.Partition, a.Version)
			c.results <- func() {
				c.inFlight.io--
				c.own.OrphanReleased(a.Partition)
			}
		}()
	}
}

// claim CASes the partition's claim to this replica.
func (c *Coordinator) claim(ctx context.Context, p int, claim Claim) {
	won, written, reason := c.claimIO(ctx, p, claim)
	c.results <- func() {
		c.inFlight.io--
		c.inFlight.claims--
		if won {
			c.written[p] = writtenClaim{
				claim:    written,
				replaced: claim.Version,
			}
			c.metrics.handovers.WithLabelValues(reason).Inc()
		}
		if _, err := c.own.ClaimResult(p, won); err != nil {
			c.log.Error("claim result", "partition", p, "err", err)
		}
	}
}

func (c *Coordinator) claimIO(ctx context.Context, p int, claim Claim) (bool, Claim, string) {
	reason := "free"
	if claim.Holder != "" && claim.Holder != c.self {
		reason = "takeover"
		// Confirm the holder's expiry with a quorum read: a stale watch
		// must not make a live replica look dead.
		seen := c.fence.peerVersion(claim.Holder)
		l, err := c.kube.CoordinationV1().Leases(c.cfg.Namespace).Get(ctx, ReplicaLeaseName(claim.Holder), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			if seen != "" {
				return false, Claim{}, "" // gone only now: wait a duration from here
			}
		case err != nil:
			return false, Claim{}, ""
		case l.ResourceVersion != seen:
			return false, Claim{}, "" // renewed since we looked
		}
	} else if claim.Holder == c.self {
		reason = "reclaim"
	}
	won, ok := c.casClaim(ctx, p, claim)
	if !ok {
		return false, Claim{}, ""
	}
	old := claim
	if claim.Version == "" {
		old = Claim{} // there was no claim object
	}
	// Serve only once the API server's fencing policy has seen the CAS:
	// it then refuses the old holder's writes still in flight, and accepts
	// ours.
	c.awaitFence(ctx, p, old, won)
	return true, won, reason
}

// casClaim writes the claim of p to this replica: a create when there is
// no claim object, else an update of the version read. Every claim CAS
// moves the epoch on, a reclaim of our own claim after a lapse too: writes
// sent under the old token are refused from here on.
func (c *Coordinator) casClaim(ctx context.Context, p int, claim Claim) (Claim, bool) {
	client := c.kube.CoordinationV1().Leases(c.cfg.Namespace)
	now := metav1.NewMicroTime(c.clock.Now())
	if claim.Version == "" {
		l, err := client.Create(ctx, &coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name:   PartitionLeaseName(p),
				Labels: map[string]string{labelKind: kindPartition},
			},
			Spec: coordv1.LeaseSpec{
				HolderIdentity:   ptr.To(c.self),
				AcquireTime:      &now,
				LeaseTransitions: ptr.To(int32(1)),
			},
		}, metav1.CreateOptions{})
		if err != nil {
			if !apierrors.IsAlreadyExists(err) {
				c.log.Warn("claim failed", "partition", p, "err", err)
			}
			return Claim{}, false
		}
		return Claim{
			Holder:  c.self,
			Version: l.ResourceVersion,
			Epoch:   1,
		}, true
	}
	epoch := claim.Epoch + 1
	l := &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:            PartitionLeaseName(p),
			ResourceVersion: claim.Version,
			Labels:          map[string]string{labelKind: kindPartition},
		},
		Spec: coordv1.LeaseSpec{
			HolderIdentity:   ptr.To(c.self),
			AcquireTime:      &now,
			LeaseTransitions: ptr.To(int32(epoch)),
		},
	}
	l, err := client.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		if !apierrors.IsConflict(err) {
			c.log.Warn("claim failed", "partition", p, "err", err)
		}
		return Claim{}, false
	}
	return Claim{
		Holder:  c.self,
		Version: l.ResourceVersion,
		Epoch:   epoch,
	}, true
}

// release CASes a drained partition's claim to nobody; on a conflict it
// re-reads and retries while the claim still names us.
func (c *Coordinator) release(ctx context.Context, p int, version string) {
	client := c.kube.CoordinationV1().Leases(c.cfg.Namespace)
	// The epoch moves on with the release too (it never goes back, so a
	// later claim by the same holder has a token of its own).
	epoch, known := int64(0), false
	if s := c.fence.load(); p < len(s.claims) && s.claims[p].Version == version {
		epoch, known = s.claims[p].Epoch, true
	}
	if !known {
		cur, err := client.Get(ctx, PartitionLeaseName(p), metav1.GetOptions{})
		if err != nil || ptr.Deref(cur.Spec.HolderIdentity, "") != c.self {
			return
		}
		version, epoch = cur.ResourceVersion, int64(ptr.Deref(cur.Spec.LeaseTransitions, 0))
	}
	for attempt := 0; attempt < 5 && ctx.Err() == nil; attempt++ {
		l := &coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name:            PartitionLeaseName(p),
				ResourceVersion: version,
				Labels:          map[string]string{labelKind: kindPartition},
			},
			Spec: coordv1.LeaseSpec{
				HolderIdentity:   ptr.To(""),
				LeaseTransitions: ptr.To(int32(epoch + 1)),
			},
		}
		out, err := client.Update(ctx, l, metav1.UpdateOptions{})
		if err == nil {
			released := writtenClaim{
				claim: Claim{
					Version: out.ResourceVersion,
					Epoch:   epoch + 1,
				},
				replaced: version,
			}
			c.results <- func() { c.written[p] = released }
			c.metrics.handovers.WithLabelValues("released").Inc()
			return
		}
		cur, gerr := client.Get(ctx, PartitionLeaseName(p), metav1.GetOptions{})
		if gerr != nil || ptr.Deref(cur.Spec.HolderIdentity, "") != c.self {
			return // gone or someone else's: nothing of ours to release
		}
		version, epoch = cur.ResourceVersion, int64(ptr.Deref(cur.Spec.LeaseTransitions, 0))
	}
}
