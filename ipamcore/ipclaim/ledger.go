package ipclaim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	ccetyped "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned/typed/cce/v1alpha1"
	cceinformers "github.com/cce-ipam/sharded/ipamcore/generated/informers/externalversions/cce/v1alpha1"
	ccelisters "github.com/cce-ipam/sharded/ipamcore/generated/listers/cce/v1alpha1"
)

// ErrTaken means the address is not the caller's to take: held by another
// pod, cooling after a free, blocked (in use outside the ledger) or corrupt,
// or a race for it was lost twice. From Pick: it lost Config.PickAttempts
// races; the subnet is contended (or the cache far behind), a retry may
// succeed.
var ErrTaken = errors.New("address taken")

// ErrExhausted means Pick found no address of the ranges that the cache
// showed neither held, cooling nor blocked and that the caller finds usable.
var ErrExhausted = errors.New("no free address")

// Ledger reserves and frees the addresses of exclusive subnets for pods,
// one IPClaim per address (see the package documentation). Every method is
// safe for concurrent use; none holds a lock across a request.
type Ledger struct {
	cfg     Config
	claims  ccetyped.IPClaimInterface
	lister  ccelisters.IPClaimLister
	synced  cache.InformerSynced
	indexer cache.Indexer
	clk     clock.PassiveClock
	log     *slog.Logger
	metrics *ledgerMetrics

	// What this ledger learnt before its cache may show it. seen holds,
	// per claim name, until when Pick skips it for anyone but its holder:
	// a claim this ledger just wrote, or read live held (or cooling) by
	// someone else. A held claim cannot become takeable within the cooling
	// period, so skipping it that long never skips a takeable one. recent
	// is each holder's last reservation, which a retried Pick returns
	// first.
	// inflight are the claims this ledger's Picks are reserving right now:
	// another Pick of the same ledger passes them by instead of racing.
	mu       sync.Mutex
	seen     map[string]seenClaim
	recent   map[Holder]recentClaim
	inflight map[string]bool
}

type seenClaim struct {
	until  time.Time
	holder Holder // zero: not held (cooling, blocked, corrupt)
}

type recentClaim struct {
	until    time.Time
	addr     netip.Addr
	subnetID string
}

// recentTTL is how long a reservation is remembered for its holder's next
// Pick; by then the cache has it.
const recentTTL = 30 * time.Second

// maxRemembered bounds seen and recent; past it, expired entries go.
const maxRemembered = 4096

// New builds a ledger on the claims' informer. It adds an index (claims by
// holder) to the informer, which the caller starts (its factory's Start)
// and waits for (HasSynced) before the first Pick. The config must pass
// Validate (start from DefaultConfig); New panics on one that does not.
// clk nil is the real clock, log nil discards, reg nil registers nothing.
func New(cfg Config, client cceclient.Interface, informer cceinformers.IPClaimInformer, clk clock.PassiveClock,
	log *slog.Logger, reg prometheus.Registerer) *Ledger {
	if err := cfg.Validate(); err != nil {
		panic(fmt.Sprintf("ipclaim.New: %v", err))
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	inf := informer.Informer()
	if err := addHolderIndex(inf); err != nil {
		panic(fmt.Sprintf("ipclaim.New: %v", err))
	}
	return &Ledger{
		cfg:      cfg,
		claims:   client.CceV1alpha1().IPClaims(),
		lister:   informer.Lister(),
		synced:   inf.HasSynced,
		indexer:  inf.GetIndexer(),
		clk:      clk,
		log:      log,
		metrics:  newLedgerMetrics(reg),
		seen:     map[string]seenClaim{},
		recent:   map[Holder]recentClaim{},
		inflight: map[string]bool{},
	}
}

// byHolder indexes claims by "namespace/name" of their holder.
const byHolder = "ipclaim-holder"

func addHolderIndex(inf cache.SharedIndexInformer) error {
	if _, ok := inf.GetIndexer().GetIndexers()[byHolder]; ok {
		return nil // another ledger on the same informer added it
	}
	return inf.AddIndexers(cache.Indexers{byHolder: func(obj any) ([]string, error) {
		c, ok := obj.(*cce.IPClaim)
		if !ok {
			return nil, nil
		}
		if h, held := HolderOf(c); held {
			return []string{h.String()}, nil
		}
		return nil, nil
	}})
}

// HasSynced reports whether the claims' cache has listed every claim once.
func (l *Ledger) HasSynced() bool { return l.synced() }

// Lookup returns the cached claim of addr (no request); it may lag the API
// server. The object is shared with the cache: do not change it.
func (l *Ledger) Lookup(addr netip.Addr) (*cce.IPClaim, bool) {
	c, err := l.lister.Get(cce.ClaimName(addr))
	if err != nil {
		return nil, false
	}
	return c, true
}

// Reserve takes addr of subnetID for h, who may then add it to an ENI and
// name it in its wep. It creates the claim held by h; if the claim exists
// (per the cache, or the Create's AlreadyExists), it reads it (the cache, and the API server when the cached copy would
// refuse, since the cache may lag) and then:
//   - held by h already (a retried ADD, a Fixed pod asking for its old
//     address): nil, with an Update (compare-and-swap) only when at or the
//     subnet changed or half the orphan grace has passed since the last
//     Reserve, else after a live read confirms it;
//   - free, past its cooling and past notBefore: an Update carrying the
//     resourceVersion read (compare-and-swap) makes h the holder; a Conflict
//     re-reads once;
//   - otherwise ErrTaken (wrapped, with the reason).
//
// Other errors are the API server's.
func (l *Ledger) Reserve(ctx context.Context, subnetID string, addr netip.Addr, h Holder, at Attachment) error {
	result, err := l.reserve(ctx, subnetID, addr, h, at)
	l.metrics.reserves.WithLabelValues(result).Inc()
	if err != nil {
		return err // the caller logs it, if it is worth a line
	}
	l.log.Debug("ipclaim: reserved", "ip", addr, "subnet", subnetID, "holder", h, "result", result)
	return nil
}

func (l *Ledger) reserve(ctx context.Context, subnetID string, addr netip.Addr, h Holder, at Attachment) (string, error) {
	if !addr.IsValid() || !h.valid() || subnetID == "" {
		return resultError, fmt.Errorf("reserve %s of subnet %q for %q: an address, a subnet and a pod are required", addr, subnetID, h)
	}
	addr = addr.Unmap().WithZone("")
	now := l.clk.Now()
	if l.cached(cce.ClaimName(addr)) != nil {
		// It exists (claims are deleted only by the sweep, rarely): a
		// Create would only say so.
		return l.reserveExisting(ctx, subnetID, addr, h, at, now)
	}
	_, err := l.claims.Create(ctx, newClaim(subnetID, addr, h, at, now), metav1.CreateOptions{})
	if err == nil {
		l.reserved(subnetID, addr, h, now)
		return resultCreated, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return resultError, fmt.Errorf("reserve %s: create its claim: %w", addr, err)
	}
	return l.reserveExisting(ctx, subnetID, addr, h, at, now)
}

// reserveExisting is Reserve of a claim that exists. The cached copy saves
// a read when it allows a takeover, since the compare-and-swap catches a
// stale copy. The API server is read when the cached copy refuses (the
// cache may not have seen a free yet), after a lost compare-and-swap, and
// before saying "held by h already" without a write (h may have freed it
// since the cache saw it).
func (l *Ledger) reserveExisting(ctx context.Context, subnetID string, addr netip.Addr, h Holder, at Attachment,
	now time.Time) (string, error) {
	name := cce.ClaimName(addr)
	cur, live := l.cached(name), false
	read := func() error {
		var err error
		if cur, err = l.get(ctx, name); err != nil {
			return fmt.Errorf("reserve %s: %w", addr, err)
		}
		live = true
		return nil
	}
	if cur == nil || !l.allows(cur, h, now) {
		if err := read(); err != nil {
			return resultError, err
		}
	}
	for conflicts := 0; ; {
		if cur == nil {
			// Deleted since (a sweep): it was free; a second Reserve may
			// create it, this one reports the race.
			return resultTaken, fmt.Errorf("%w: the claim of %s was deleted while it was read", ErrTaken, addr)
		}
		result, update, refusal := l.decide(cur, subnetID, addr, h, at, now)
		switch {
		case refusal != nil:
			if live {
				holder, _ := HolderOf(cur)
				l.remember(name, holder, now)
			}
			return result, refusal
		case update == nil && live:
			l.reserved(subnetID, addr, h, now)
			return result, nil
		case update == nil:
			if err := read(); err != nil {
				return resultError, err
			}
			continue
		}
		_, err := l.claims.Update(ctx, update, metav1.UpdateOptions{})
		if err == nil {
			l.reserved(subnetID, addr, h, now)
			return result, nil
		}
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return resultError, fmt.Errorf("reserve %s: update its claim: %w", addr, err)
		}
		if conflicts++; conflicts == 2 {
			return resultTaken, fmt.Errorf("%w: %s changed under two compare-and-swaps in a row", ErrTaken, addr)
		}
		if err := read(); err != nil {
			return resultError, err
		}
	}
}

// allows reports whether a cached claim lets h reserve it now.
func (l *Ledger) allows(c *cce.IPClaim, h Holder, now time.Time) bool {
	s, _ := stateAt(c, now, l.cfg.Cooling)
	holder, _ := HolderOf(c)
	return s == stateFree || (s == stateHeld && holder == h)
}

// decide is what a Reserve does with the claim it read: the result label,
// the Update to make (nil: none), or the refusal.
func (l *Ledger) decide(c *cce.IPClaim, subnetID string, addr netip.Addr, h Holder, at Attachment,
	now time.Time) (result string, update *cce.IPClaim, refusal error) {
	s, until := stateAt(c, now, l.cfg.Cooling)
	holder, _ := HolderOf(c)
	switch {
	case s == stateHeld && holder == h:
		if !needsRefresh(c, subnetID, at, now, l.cfg.OrphanGrace) {
			return resultHeld, nil, nil
		}
		u := c.DeepCopy()
		hold(u, subnetID, addr, h, at, now)
		return resultHeld, u, nil
	case s == stateFree:
		u := c.DeepCopy()
		hold(u, subnetID, addr, h, at, now)
		return resultReused, u, nil
	case s == stateHeld:
		return resultTaken, nil, fmt.Errorf("%w: %s is held by %s", ErrTaken, addr, holder)
	case s == stateCooling || s == stateBlocked:
		return resultTaken, nil, fmt.Errorf("%w: %s is %s until %s", ErrTaken, addr, s, until.UTC().Format(time.RFC3339))
	default:
		return resultTaken, nil, fmt.Errorf("%w: the claim of %s is corrupt: %s", ErrTaken, addr, Problem(c))
	}
}

// Free lets go of h's claim on addr: an Update (compare-and-swap) clears the
// holder and sets releasedAt; nobody takes the address for the cooling
// period. A claim that is absent, free or held by someone else is left
// alone (nil). Call it only once the address is off the cloud and no wep
// names it.
func (l *Ledger) Free(ctx context.Context, addr netip.Addr, h Holder) error {
	return l.release(ctx, addr, h, false)
}

// Block frees h's claim on addr, like Free, and keeps everyone off the
// address for Config.InUseBackoff (notBefore): the cloud said the address is
// in use outside the ledger (an address of a reference wep not yet adopted,
// one leaked on an ENI). A free claim gets the notBefore too; a claim held
// by someone else is left alone.
func (l *Ledger) Block(ctx context.Context, addr netip.Addr, h Holder) error {
	return l.release(ctx, addr, h, true)
}

// releaseAttempts bounds the compare-and-swaps of one Free: only the
// holder's own writes (a concurrent refresh) or the Keeper compete.
const releaseAttempts = 3

func (l *Ledger) release(ctx context.Context, addr netip.Addr, h Holder, block bool) error {
	kind := "free"
	if block {
		kind = "block"
	}
	if !addr.IsValid() || !h.valid() {
		return fmt.Errorf("%s %s for %q: an address and a pod are required", kind, addr, h)
	}
	addr = addr.Unmap().WithZone("")
	name := cce.ClaimName(addr)
	cur := l.cached(name)
	if holder, _ := heldBy(cur); holder != h {
		// The cache may not have seen h's Reserve yet.
		var err error
		if cur, err = l.get(ctx, name); err != nil {
			return fmt.Errorf("%s %s: %w", kind, addr, err)
		}
	}
	for attempt := 1; ; attempt++ {
		now := l.clk.Now()
		update := releaseUpdate(cur, h, now, block, l.cfg.InUseBackoff)
		if update == nil {
			return nil
		}
		_, err := l.claims.Update(ctx, update, metav1.UpdateOptions{})
		if err == nil {
			l.forgetRecent(addr, h)
			l.metrics.frees.WithLabelValues(kind).Inc()
			l.log.Debug("ipclaim: "+kind, "ip", addr, "holder", h)
			return nil
		}
		if (!apierrors.IsConflict(err) && !apierrors.IsNotFound(err)) || attempt == releaseAttempts {
			return fmt.Errorf("%s %s: update its claim: %w", kind, addr, err)
		}
		if cur, err = l.get(ctx, name); err != nil {
			return fmt.Errorf("%s %s: %w", kind, addr, err)
		}
	}
}

// releaseUpdate is the Update a Free (or Block) by h makes to c, or nil
// when it leaves c alone.
func releaseUpdate(c *cce.IPClaim, h Holder, now time.Time, block bool, backoff time.Duration) *cce.IPClaim {
	if c == nil {
		return nil
	}
	holder, held := heldBy(c)
	var notBefore *time.Time
	if block {
		t := now.Add(backoff)
		notBefore = &t
	}
	switch {
	case held && holder == h:
		u := c.DeepCopy()
		release(u, now, notBefore)
		return u
	case !held && block && (c.Spec.NotBefore == nil || c.Spec.NotBefore.Before(stamp(*notBefore))):
		u := c.DeepCopy()
		u.Spec.NotBefore = stamp(*notBefore)
		return u
	}
	return nil
}

// heldBy is HolderOf for a claim that may be nil.
func heldBy(c *cce.IPClaim) (Holder, bool) {
	if c == nil {
		return Holder{}, false
	}
	return HolderOf(c)
}

// cached returns the cache's copy of a claim, or nil.
func (l *Ledger) cached(name string) *cce.IPClaim {
	c, err := l.lister.Get(name)
	if err != nil {
		return nil
	}
	return c
}

// get reads a claim from the API server; nil when it does not exist.
func (l *Ledger) get(ctx context.Context, name string) (*cce.IPClaim, error) {
	c, err := l.claims.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read its claim: %w", err)
	}
	return c, nil
}

// remember makes Pick skip a claim seen held by holder (zero: not held)
// for the cooling period, for anyone but its holder.
func (l *Ledger) remember(name string, holder Holder, now time.Time) {
	if l.cfg.Cooling <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.seen) >= maxRemembered {
		for n, s := range l.seen {
			if !now.Before(s.until) {
				delete(l.seen, n)
			}
		}
	}
	l.seen[name] = seenClaim{until: now.Add(l.cfg.Cooling), holder: holder}
}

// reserved records h's reservation of addr: held by h (remember) and h's
// latest (recent).
func (l *Ledger) reserved(subnetID string, addr netip.Addr, h Holder, now time.Time) {
	l.remember(cce.ClaimName(addr), h, now)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.recent) >= maxRemembered {
		for k, r := range l.recent {
			if !now.Before(r.until) {
				delete(l.recent, k)
			}
		}
	}
	l.recent[h] = recentClaim{until: now.Add(recentTTL), addr: addr, subnetID: subnetID}
}

// forgetRecent drops h's reservation of addr after h let go of it.
func (l *Ledger) forgetRecent(addr netip.Addr, h Holder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r, ok := l.recent[h]; ok && r.addr == addr {
		delete(l.recent, h)
	}
	delete(l.seen, cce.ClaimName(addr))
}

// recentlySeen reports whether Pick should skip a claim for h: seen held by
// another pod, or not held, within the cooling period.
func (l *Ledger) recentlySeen(name string, h Holder, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.seen[name]
	return ok && now.Before(s.until) && s.holder != h
}

// recentOf returns h's latest reservation in subnetID, if still remembered.
func (l *Ledger) recentOf(subnetID string, h Holder, now time.Time) (netip.Addr, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.recent[h]
	if !ok || r.subnetID != subnetID || !now.Before(r.until) {
		return netip.Addr{}, false
	}
	return r.addr, true
}

// startPick marks a claim as being reserved by a Pick; false when another
// Pick of this ledger is at it already. donePick unmarks it.
func (l *Ledger) startPick(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inflight[name] {
		return false
	}
	l.inflight[name] = true
	return true
}

func (l *Ledger) donePick(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.inflight, name)
}
