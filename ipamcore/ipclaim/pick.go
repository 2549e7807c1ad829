package ipclaim

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"slices"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/psts"
)

// maxExamined bounds the addresses one Pick looks at in its cache: every
// address of ranges up to a /12; larger ranges (IPv6) are sampled from a
// random start, where nearly every address is free.
const maxExamined = 1 << 20

// Pick reserves for h some address of ranges (all of subnetID) that
// usable accepts (nil: every address), and returns it. A claim h already
// holds in the ranges comes first (a retried ADD gets the address of the
// first attempt). Otherwise Pick walks the ranges in a random order (a
// random start and a random stride coprime to their size, so that replicas
// neither race for the same first address nor pile up behind the same run
// of taken ones), skips the addresses its cache shows held, cooling,
// blocked or corrupt (and those another Pick of this ledger is reserving
// right now), and tries Reserve on the others; a lost race costs one
// request and moves on. After Config.PickAttempts lost races it returns
// ErrTaken (the subnet is contended: retry); when the walk ends,
// ErrExhausted. Both are wrapped with the counts.
func (l *Ledger) Pick(ctx context.Context, subnetID string, ranges []psts.Range, usable func(netip.Addr) bool, h Holder,
	at Attachment) (netip.Addr, error) {
	addr, result, err := l.pick(ctx, subnetID, ranges, usable, h, at)
	l.metrics.picks.WithLabelValues(result).Inc()
	return addr, err
}

func (l *Ledger) pick(ctx context.Context, subnetID string, ranges []psts.Range, usable func(netip.Addr) bool, h Holder,
	at Attachment) (netip.Addr, string, error) {
	if usable == nil {
		usable = func(netip.Addr) bool { return true }
	}
	w, err := newWalk(ranges)
	if err != nil {
		return netip.Addr{}, "error", fmt.Errorf("pick from subnet %s: %w", subnetID, err)
	}
	if addr, ok := l.ownClaim(subnetID, w, usable, h); ok {
		if err := l.Reserve(ctx, subnetID, addr, h, at); err == nil {
			return addr, "ok", nil
		} else if !errors.Is(err, ErrTaken) {
			return netip.Addr{}, "error", fmt.Errorf("pick from subnet %s: %w", subnetID, err)
		}
	}
	examined, lost := 0, 0
	for it := w.shuffled(); examined < maxExamined; examined++ {
		addr, ok := it.next()
		if !ok {
			break
		}
		if !usable(addr) || l.skip(addr, h) {
			continue
		}
		name := cce.ClaimName(addr)
		if !l.startPick(name) {
			continue // another Pick here is reserving it
		}
		err := l.Reserve(ctx, subnetID, addr, h, at)
		l.donePick(name)
		if err == nil {
			return addr, "ok", nil
		}
		if !errors.Is(err, ErrTaken) {
			return netip.Addr{}, "error", fmt.Errorf("pick from subnet %s: %w", subnetID, err)
		}
		lost++
		l.metrics.lostRaces.Inc()
		if lost >= l.cfg.PickAttempts {
			return netip.Addr{}, "contended", fmt.Errorf("%w: pick from subnet %s lost %d races (%d addresses examined); "+
				"other replicas are picking from it or the claim cache is behind", ErrTaken, subnetID, lost, examined+1)
		}
	}
	return netip.Addr{}, "exhausted", fmt.Errorf("%w in subnet %s: %d of %s addresses of %s examined, none free and usable, %d races lost",
		ErrExhausted, subnetID, examined, w.total, rangesString(ranges), lost)
}

// ownClaim finds a claim h holds in the walk's ranges: its last
// reservation through this ledger, else the lowest the cache shows.
func (l *Ledger) ownClaim(subnetID string, w walk, usable func(netip.Addr) bool, h Holder) (netip.Addr, bool) {
	if addr, ok := l.recentOf(subnetID, h, l.clk.Now()); ok && w.contains(addr) && usable(addr) {
		return addr, true
	}
	objs, err := l.indexer.ByIndex(byHolder, h.String())
	if err != nil {
		return netip.Addr{}, false
	}
	var found []netip.Addr
	for _, o := range objs {
		c, ok := o.(*cce.IPClaim)
		if !ok || c.Spec.SubnetID != subnetID || Problem(c) != "" {
			continue
		}
		addr, _ := cce.AddrOfClaimName(c.Name)
		if w.contains(addr) && usable(addr) {
			found = append(found, addr)
		}
	}
	if len(found) == 0 {
		return netip.Addr{}, false
	}
	slices.SortFunc(found, netip.Addr.Compare)
	return found[0], true
}

// skip reports whether Pick should not try addr: its cache (or a recent
// read) shows the claim held by another, cooling, blocked or corrupt.
func (l *Ledger) skip(addr netip.Addr, h Holder) bool {
	name := cce.ClaimName(addr)
	now := l.clk.Now()
	if l.recentlySeen(name, h, now) {
		return true
	}
	c := l.cached(name)
	if c == nil {
		return false
	}
	return !l.allows(c, h, now)
}

func rangesString(ranges []psts.Range) string {
	s := ""
	for i, r := range ranges {
		if i > 0 {
			s += ","
		}
		s += r.String()
	}
	return s
}

// walk is the addresses of some ranges, numbered from 0 in order.
type walk struct {
	ranges []psts.Range
	sizes  []*big.Int
	total  *big.Int
}

func newWalk(ranges []psts.Range) (walk, error) {
	w := walk{ranges: ranges, total: new(big.Int)}
	for _, r := range ranges {
		if !r.First.IsValid() || !r.Last.IsValid() || r.First.Zone() != "" || r.Last.Zone() != "" ||
			r.First.Is4In6() || r.Last.Is4In6() || r.First.BitLen() != r.Last.BitLen() || r.Last.Less(r.First) {
			return walk{}, fmt.Errorf("range %s is not two plain addresses of one family in order", r)
		}
		if len(w.ranges) > 0 && r.First.BitLen() != w.ranges[0].First.BitLen() {
			return walk{}, fmt.Errorf("ranges %s and %s are of two families", w.ranges[0], r)
		}
		size := r.Size()
		w.sizes = append(w.sizes, size)
		w.total.Add(w.total, size)
	}
	return w, nil
}

func (w walk) contains(a netip.Addr) bool {
	for _, r := range w.ranges {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

// at returns address number i (0 <= i < total).
func (w walk) at(i *big.Int) netip.Addr {
	off := new(big.Int).Set(i)
	for k, size := range w.sizes {
		if off.Cmp(size) < 0 {
			return addOffset(w.ranges[k].First, off)
		}
		off.Sub(off, size)
	}
	panic(fmt.Sprintf("ipclaim: walk index %s out of %s", i, w.total))
}

func addOffset(a netip.Addr, off *big.Int) netip.Addr {
	n := new(big.Int).SetBytes(a.AsSlice())
	n.Add(n, off)
	b := make([]byte, a.BitLen()/8)
	n.FillBytes(b)
	out, _ := netip.AddrFromSlice(b)
	return out
}

// order visits every address once: start, start+stride, ... modulo total,
// with stride coprime to total.
type order struct {
	w                walk
	cur, stride      *big.Int
	left, one, total *big.Int
}

// shuffled is a random order: a random start and stride.
func (w walk) shuffled() *order {
	if w.total.Sign() == 0 {
		return w.order(new(big.Int), big.NewInt(1))
	}
	start, _ := rand.Int(rand.Reader, w.total)
	stride, _ := rand.Int(rand.Reader, w.total)
	return w.order(start, stride)
}

// order visits from start with the first stride at or above stride that is
// coprime to the total.
func (w walk) order(start, stride *big.Int) *order {
	one := big.NewInt(1)
	s := new(big.Int).Set(stride)
	if w.total.Sign() > 0 {
		s.Mod(s, w.total)
	}
	gcd := new(big.Int)
	for w.total.Cmp(one) > 0 && (s.Sign() == 0 || gcd.GCD(nil, nil, s, w.total).Cmp(one) != 0) {
		s.Add(s, one)
		s.Mod(s, w.total)
	}
	cur := new(big.Int).Set(start)
	if w.total.Sign() > 0 {
		cur.Mod(cur, w.total)
	}
	return &order{w: w, cur: cur, stride: s, left: new(big.Int).Set(w.total), one: one, total: w.total}
}

func (o *order) next() (netip.Addr, bool) {
	if o.left.Sign() == 0 {
		return netip.Addr{}, false
	}
	o.left.Sub(o.left, o.one)
	a := o.w.at(o.cur)
	o.cur.Add(o.cur, o.stride)
	if o.cur.Cmp(o.total) >= 0 {
		o.cur.Sub(o.cur, o.total)
	}
	return a, true
}
