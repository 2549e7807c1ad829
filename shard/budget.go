package shard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"

	"github.com/cce-ipam/sharded/cloud"
)

// The cloud budget split (I5). The cluster-wide rate and burst are divided
// evenly among the live replicas. Every replica's share is published in one
// object, the budget Lease, which is only ever changed by compare-and-swap:
//   - a replica lowers its local limiter first, then publishes the lower
//     share;
//   - it raises only up to what the others' published shares leave, by a CAS
//     on the object it read, and publishes before it raises locally.
// So the published shares never sum above the global budget, and each
// replica's actual rate is at most its published share. A replica whose
// lease is at risk loses its share at once (its gate closes) and must win it
// back by CAS; entries of replicas whose lease expired are dropped by
// whoever raises next (an expired replica is fenced: it makes no calls),
// once a direct read of that replica's Lease confirms the expiry. A replica
// that finds its own entry gone (or invalid) drops to zero and asks again:
// the room may have been taken. Entries that are not a usable share
// (negative, NaN, infinite, absurd) are ignored.
//
// Replicas may be configured with different budgets while a rolling update
// changes --bce-rate/--bce-burst. Each entry carries its replica's
// configured budget (Limit), and every replica splits the smallest budget
// of the live replicas: the old ones lower to the new, smaller budget, so
// a replica restarted with it finds room; a larger budget takes effect once
// no live replica is configured below it.

// Share is one replica's part of the budget. Busy tells the others that it
// could use more (see demandTarget).
type Share struct {
	Rate  float64 `json:"rate"`
	Burst int64   `json:"burst"`
	Busy  bool    `json:"busy,omitempty"`
	// Limit and LimitBurst are the cluster budget this replica was
	// configured with (0: not published, as by older versions).
	Limit      float64 `json:"limit,omitempty"`
	LimitBurst int64   `json:"limitBurst,omitempty"`
}

// effectiveGlobal is the budget in force: the smallest configured by own
// and by the live peers that published theirs.
func effectiveGlobal(own Share, live []string, self string, published map[string]Share) Share {
	eff := Share{Rate: own.Rate, Burst: own.Burst}
	for _, m := range live {
		s, ok := published[m]
		if m == self || !ok {
			continue
		}
		if s.Limit > 0 && s.Limit < eff.Rate {
			eff.Rate = s.Limit
		}
		if s.LimitBurst > 0 && s.LimitBurst < eff.Burst {
			eff.Burst = s.LimitBurst
		}
	}
	return eff
}

// budgetPeers is what the budget needs to know of the replicas: its own
// lease, and the others' as observed (the Fence's snapshot).
type budgetPeers interface {
	LeaseValid() bool
	peerExpired(m string, now time.Time) bool
	peerVersion(m string) string
	// recordShare tells the cloud gate whether a share is held now.
	recordShare(held bool)
}

// budgetDeps are the budget's connections and settings.
type budgetDeps struct {
	self         string
	setter       RateSetter // nil: no budget to split
	global       Share
	leases       coordclient.LeaseInterface // the coordination namespace's
	clock        clock.Clock
	peers        budgetPeers
	period       time.Duration // between adjustments
	followDemand bool
	log          *slog.Logger
	metrics      budgetMetrics
}

type budget struct {
	budgetDeps

	mu        sync.Mutex
	share     Share // what the local limiter allows now
	granted   bool  // share published and in force
	live      []string
	replicas  int              // replicas with a fresh Lease (per-operation split)
	published map[string]Share // the budget Lease as last watched, valid entries only
	invalid   string           // invalid entries last logged, to log each change once

	// Demand, measured on the limiter between adjustments.
	lastTaken, lastWaited int64
	lastAt                time.Time
	usage                 float64   // tokens per second, smoothed
	quietSince            time.Time // since when every adjustment looked idle (zero: not quiet)
	hot                   int       // adjustments in a row that used most of the share
	opShareN              int       // replicas the per-operation limits are split over
}

func newBudget(deps budgetDeps) *budget {
	return &budget{budgetDeps: deps}
}

// errNoShare closes the cloud gate while this replica holds no budget.
var errNoShare = errors.New("no share of the BCE budget yet")

// held reports whether the replica may spend cloud calls: it holds a
// published, non-zero share, or there is no budget to split.
// recordHeldLocked tells the cloud gate whether a share is held now; under
// b.mu, so the gate sees the changes in the order they happen.
func (b *budget) recordHeldLocked() {
	b.peers.recordShare(b.heldLocked())
}

// held: a share is in force (or there is no budget to split), the rule the
// cloud gate applies.
func (b *budget) held() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.heldLocked()
}

func (b *budget) heldLocked() bool { return b.setter == nil || b.granted && b.share.Rate > 0 }

// current returns this replica's current share.
func (b *budget) current() Share {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.share
}

// Bounds of a usable share: no limiter runs faster (cloud's checkRate
// refuses rates above 1e9), and sums of bursts must not overflow int64.
const (
	maxShareRate  = 1e9
	maxShareBurst = 1 << 40
)

// validShare: a share that can be summed and used as a rate. Any other
// value in the Lease is not one a replica wrote (SetRate refuses it): a
// corruption, or a foreign writer.
func validShare(s Share) bool {
	return s.Rate >= 0 && s.Rate <= maxShareRate && s.Burst >= 0 && s.Burst <= maxShareBurst && // false for NaN
		s.Limit >= 0 && s.Limit <= maxShareRate && s.LimitBurst >= 0 && s.LimitBurst <= maxShareBurst
}

// parseShares decodes the shares annotation entry by entry, so that one bad
// entry does not hide the others. Invalid entries are left out (treated as
// zero) and named in invalid; err means the whole value is unreadable.
func parseShares(raw string) (shares map[string]Share, invalid []string, err error) {
	shares = map[string]Share{}
	if raw == "" {
		return shares, nil, nil
	}
	var entries map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &entries); err != nil {
		return map[string]Share{}, nil, err
	}
	for m, e := range entries {
		var s Share
		if json.Unmarshal(e, &s) != nil || !validShare(s) {
			invalid = append(invalid, m)
			continue
		}
		shares[m] = s
	}
	slices.Sort(invalid)
	return shares, invalid, nil
}

// observe takes the live set and the budget Lease from the loop.
func (b *budget) observe(l *coordv1.Lease, live []string, replicas int) {
	published := map[string]Share{}
	var invalid []string
	if l != nil {
		var err error
		published, invalid, err = parseShares(l.Annotations[annoShares])
		if err != nil {
			invalid = []string{"(unreadable: " + err.Error() + ")"} // treated as empty
		}
	}
	b.mu.Lock()
	b.live = slices.Clone(live)
	b.published = published
	b.replicas = replicas
	logIt := fmt.Sprint(invalid) != b.invalid
	b.invalid = fmt.Sprint(invalid)
	b.mu.Unlock()
	if logIt && len(invalid) > 0 {
		b.log.Warn("budget lease has invalid shares; ignoring them", "members", invalid)
	}
}

func (b *budget) loop(ctx context.Context) {
	if b.setter == nil {
		return
	}
	for ctx.Err() == nil {
		b.adjust(ctx)
		select {
		case <-ctx.Done():
		case <-b.clock.After(b.period):
		}
	}
}

const rateEpsilon = 1e-9

func (b *budget) adjust(ctx context.Context) {
	b.mu.Lock()
	live, published, replicas := b.live, b.published, b.replicas
	cur, granted := b.share, b.granted
	b.mu.Unlock()
	if !b.peers.LeaseValid() {
		if granted {
			b.log.Warn("lease at risk: giving up the budget share")
			b.set(Share{}, false)
		}
		return
	}
	if _, ok := published[b.self]; granted && !ok && b.ownShareGone(ctx) {
		// Someone dropped our entry (or the object was reset): the room may
		// have been handed out. Stop spending it, then ask again below.
		b.loseShare("this replica's share is gone from the budget lease")
		cur, granted = Share{}, false
	}
	busy, need := true, 0.0 // everyone busy: the even split
	if b.followDemand {
		busy, need = b.demand(cur)
	}
	want := demandTarget(effectiveGlobal(b.global, live, b.self, published), live, b.self, published, busy, need)
	b.setOpShare(replicas)
	switch {
	case want.Rate < cur.Rate*0.9-rateEpsilon || want.Burst < cur.Burst || (want.Rate == 0 && cur.Rate > 0):
		// Lower locally first, then tell the others.
		lower := Share{
			Rate:  math.Min(want.Rate, cur.Rate),
			Burst: min(want.Burst, cur.Burst),
			Busy:  busy,
		}
		b.set(lower, granted && lower.Rate > 0)
		if err := b.publish(ctx, func(map[string]Share) Share { return lower }); err != nil {
			b.log.Warn("publishing a lower budget share failed; retrying", "err", err)
		}
	case want.Rate > cur.Rate*1.1+rateEpsilon || want.Burst > cur.Burst || !granted:
		var got Share
		err := b.publish(ctx, func(shares map[string]Share) Share {
			// The budget in force by the object being changed: a peer may
			// have published a smaller one since the watch showed it.
			global := effectiveGlobal(b.global, live, b.self, shares)
			var others Share
			for m, s := range shares {
				if m != b.self {
					others.Rate += s.Rate
					others.Burst += s.Burst
				}
			}
			got = Share{
				Rate:  math.Max(0, math.Min(want.Rate, global.Rate-others.Rate)),
				Burst: max(0, min(want.Burst, global.Burst-others.Burst)),
				Busy:  busy,
			}
			// A residue of float sums (50 - (16.67 + 33.33) = 7e-15) is no
			// headroom: no limiter can run that slowly.
			if got.Burst < 1 || got.Rate <= cur.Rate || got.Rate < cloud.MinRate {
				got = cur // no headroom yet: keep what we have, say we want more
				got.Busy = busy
				if !granted {
					got = Share{Busy: busy}
				}
			}
			return got
		})
		if err != nil {
			b.log.Debug("raising the budget share failed; retrying", "err", err)
			return
		}
		if got.Rate > 0 && got.Burst >= 1 {
			b.set(got, true)
		}
	case busy != cur.Busy:
		flagged := cur
		flagged.Busy = busy
		if err := b.publish(ctx, func(map[string]Share) Share { return flagged }); err == nil {
			b.mu.Lock()
			b.share.Busy = busy
			b.mu.Unlock()
		}
	}
}

// errShareLost: a publish found this replica's entry gone from the Lease.
var errShareLost = errors.New("this replica's share is gone from the budget lease")

// loseShare drops a share that is no longer published (the gate closes);
// the next raise asks for one again by CAS.
func (b *budget) loseShare(why string) {
	b.mu.Lock()
	had := b.share
	b.mu.Unlock()
	b.log.Warn("dropping the budget share", "reason", why, "had", had.Rate)
	b.set(Share{}, false)
}

// ownShareGone confirms with a direct read of the budget Lease that this
// replica's entry is missing or invalid: a watch that has not caught up
// with our own publish shows none either. A failed read confirms nothing.
func (b *budget) ownShareGone(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, err := b.leases.Get(ctx, budgetLeaseName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true
	}
	if err != nil {
		b.log.Debug("reading the budget lease failed", "err", err)
		return false
	}
	shares, _, err := parseShares(l.Annotations[annoShares])
	_, ok := shares[b.self]
	return err != nil || !ok
}

// confirmExpired checks, with a direct read of m's replica Lease rather than
// the watch, that m is expired as this replica judged it: the Lease is still
// the version we saw a whole lease duration ago, or absent in both views. A
// stalled watch makes every peer look dead; their shares must stay (the same
// rule as a claim's takeover, claimIO).
func (b *budget) confirmExpired(ctx context.Context, m string) bool {
	seen := b.peers.peerVersion(m)
	l, err := b.leases.Get(ctx, ReplicaLeaseName(m), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return seen == "" // else gone only now: wait a lease duration from here
	case err != nil:
		return false
	}
	return seen != "" && l.ResourceVersion == seen
}

// revoke closes the gate until a share is won again by CAS.
func (b *budget) revoke() {
	b.mu.Lock()
	b.share, b.granted = Share{}, false
	b.recordHeldLocked()
	b.mu.Unlock()
	b.metrics.rate.Set(0)
	b.metrics.burst.Set(0)
}

// OpSharer scales the per-operation limits (cloud.Client implements it).
type OpSharer interface {
	SetOpShare(f float64) error
}

// setOpShare gives this replica 1/n of every per-operation limit. These
// are not negotiated by CAS: while replicas join, an operation may briefly
// be over-shared, and the cloud answers 429, which the client retries.
func (b *budget) setOpShare(n int) {
	o, ok := b.setter.(OpSharer)
	if !ok || n < 1 || n == b.opShareN {
		return
	}
	if err := o.SetOpShare(1 / float64(n)); err != nil {
		b.log.Error("setting the per-operation limits failed", "err", err)
		return
	}
	b.opShareN = n
}

// set applies a share to the local limiter.
func (b *budget) set(s Share, granted bool) {
	if s.Rate > 0 && s.Burst >= 1 {
		if err := b.setter.SetRate(s.Rate, s.Burst); err != nil {
			b.log.Error("setting the cloud rate failed", "err", err)
			granted = false
		}
	}
	b.mu.Lock()
	changed := b.share != s || b.granted != granted
	b.share, b.granted = s, granted
	b.recordHeldLocked()
	b.mu.Unlock()
	b.metrics.rate.Set(s.Rate)
	b.metrics.burst.Set(float64(s.Burst))
	if changed {
		b.log.Info("budget share", "rate", s.Rate, "burst", s.Burst, "granted", granted)
	}
}

// publish CASes this replica's entry (computed from the current shares by
// mine) into the budget Lease, dropping entries of replicas whose expiry a
// direct read of their Lease confirms, and invalid entries. If this replica
// holds a share but the Lease read for the CAS has no (valid) entry for it,
// it writes nothing, drops its share and returns errShareLost: writing the
// old share back unchecked could put the sum above the budget.
func (b *budget) publish(ctx context.Context, mine func(shares map[string]Share) Share) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	b.mu.Lock()
	held := b.granted
	b.mu.Unlock()
	confirmed := map[string]bool{} // expiry confirmed by a direct read, per member
	for attempt := 0; attempt < 5; attempt++ {
		lost := false
		err := casAnnotations(ctx, b.leases, budgetLeaseName, kindBudget, func(a map[string]string) {
			shares, invalid, err := parseShares(a[annoShares])
			if err != nil {
				// A corrupt object: start over; every replica finds its
				// share gone, drops it and asks again.
				b.log.Warn("budget lease has unreadable shares; resetting", "err", err)
			} else if len(invalid) > 0 {
				b.log.Warn("budget lease has invalid shares; dropping them", "members", invalid)
			}
			if _, ok := shares[b.self]; held && !ok {
				lost = true
				return
			}
			now := b.clock.Now()
			var suspects []string
			for m := range shares {
				if m != b.self && b.peers.peerExpired(m, now) {
					suspects = append(suspects, m)
				}
			}
			for _, m := range suspects {
				ok, done := confirmed[m]
				if !done {
					ok = b.confirmExpired(ctx, m)
					confirmed[m] = ok
				}
				if ok {
					delete(shares, m)
				}
			}
			s := mine(shares)
			// The entry stays at a zero rate too: it carries this
			// replica's configured budget, which the others must honour
			// before it can get any share.
			s.Limit, s.LimitBurst = b.global.Rate, b.global.Burst
			shares[b.self] = s
			raw, _ := json.Marshal(shares)
			a[annoShares] = string(raw)
		})
		if lost {
			b.loseShare("this replica's share is gone from the budget lease")
			return errShareLost
		}
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return errors.New("budget lease: too many conflicts")
}
