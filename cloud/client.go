package cloud

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/baidubce/bce-sdk-go/bce"
	"github.com/baidubce/bce-sdk-go/services/eni"
	"github.com/baidubce/bce-sdk-go/services/vpc"
	"github.com/prometheus/client_golang/prometheus"
)

// Client implements Provider over bce-sdk-go.
type Client struct {
	cfg       Config
	sdkConfig *bce.BceClientConfiguration
	transport *http.Transport
	limiter   *Limiter
	opLimits  map[string]*Limiter // per operation, scaled with the share
	paces     map[string]*Limiter // per operation, its whole (cluster-wide) limit: see takeTokens
	m         *metrics
	log       *slog.Logger
	secrets   []string // redacted from every error message
	gate      atomic.Pointer[func() error]
	// gateway is the CCE gateway's host:port and tokens its token source
	// when Config.UsesGateway; tokens is nil otherwise.
	gateway string
	tokens  *tokenSource
	urgent  sync.Map // operation → *urgentCalls
}

var _ Provider = (*Client)(nil)

// New validates cfg, loads credentials and returns a Client. It starts no
// goroutines. logger may be nil; reg may be nil (metrics then go nowhere).
func New(cfg Config, logger *slog.Logger, reg prometheus.Registerer, opts ...Option) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("cloud config: %w", err)
	}
	var ak, sk string
	var err error
	if cfg.UsesGateway() {
		// The SDK signs only when it has credentials: placeholders make it
		// call the gateway signer, which sends no bce-auth-v1 signature.
		ak, sk = "cce-gateway", "cce-gateway"
	} else if ak, sk, err = cfg.credentials(); err != nil {
		return nil, err
	}
	sdkCfg, err := newSDKConfig(cfg, ak, sk)
	if err != nil {
		return nil, fmt.Errorf("cloud credentials: %w", err)
	}
	lim, err := NewLimiter(cfg.Rate, cfg.Burst)
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 100
	c := &Client{cfg: cfg, sdkConfig: sdkCfg, transport: tr, limiter: lim, m: newMetrics(reg), log: logger,
		secrets: []string{sk, ak}, opLimits: map[string]*Limiter{}, paces: map[string]*Limiter{}}
	for op, l := range cfg.OpLimits {
		ol, err := NewLimiter(l.Rate, l.Burst)
		if err != nil {
			return nil, fmt.Errorf("limit of %s: %w", op, err)
		}
		c.opLimits[op] = ol
		if c.paces[op], err = NewLimiter(max(MinRate, l.Rate*paceMargin), l.Burst); err != nil {
			return nil, fmt.Errorf("pace of %s: %w", op, err)
		}
	}
	c.m.rate.Set(cfg.Rate)
	c.m.burst.Set(float64(cfg.Burst))
	if cfg.UsesGateway() {
		c.secrets = nil // placeholders, nothing to hide
		if c.gateway, err = gatewayHostPort(cfg.GatewayEndpoint, cfg.Region); err != nil {
			return nil, err
		}
		if c.tokens, err = newTokenSource(cfg, logger, reg); err != nil {
			return nil, err
		}
		logger.Info("BCE calls go through the CCE gateway", "gateway", c.gateway, "remoteHost", cfg.endpoint(),
			"tokenSecret", cfg.GatewayTokenSecret, "tokenDir", cfg.GatewayTokenDir)
	}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// SetRate changes the client-side rate limit at run time (see
// Limiter.SetRate): the shard layer gives each replica its share of the
// cluster-wide budget.
func (c *Client) SetRate(rate float64, burst int64) error {
	if err := c.limiter.SetRate(rate, burst); err != nil {
		return err
	}
	c.m.rate.Set(rate)
	c.m.burst.Set(float64(burst))
	return nil
}

// SetOpShare scales every per-operation limit to the fraction f of its
// configured (cluster-wide) value; a burst never goes below one token.
func (c *Client) SetOpShare(f float64) error {
	if !(f > 0) || f > 1 {
		return fmt.Errorf("operation share %v outside (0,1]", f)
	}
	for op, l := range c.cfg.OpLimits {
		sh := l.Share(f)
		if err := c.opLimits[op].SetRate(sh.Rate, sh.Burst); err != nil {
			return fmt.Errorf("limit of %s: %w", op, err)
		}
	}
	return nil
}

type noWaitKey struct{}

// ErrWouldWait fails a NoWait call whose operation has no token at once.
var ErrWouldWait = errors.New("the operation's rate limit has no token now")

// NoWait marks ctx so that a call fails with ErrWouldWait rather than wait
// for its operation's bucket: housekeeping (the periodic ENI sync) yields
// scarce tokens (ListENIs: about one a second for the cluster) to the calls
// that serve pods, such as a takeover's rebuild. It also fails while an
// Urgent call of the same operation is in flight or ended less than
// urgentQuiet ago.
func NoWait(ctx context.Context) context.Context { return context.WithValue(ctx, noWaitKey{}, true) }

// urgentQuiet is how long after an Urgent call of an operation ends that
// NoWait calls of it keep yielding. Replicas take over together (a
// failover's survivors each take a share of the dead one's nodes), and the
// one whose list BCE turned away retries on the cluster's next token: the
// periodic sync of a replica that had just finished its own takeover took
// that token (bench: one survivor's 16-node takeover took 4.3 s, the
// other's 1.5 s).
const urgentQuiet = 5 * time.Second

// urgentCalls tracks one operation's Urgent calls.
type urgentCalls struct {
	inFlight atomic.Int32
	lastEnd  atomic.Int64 // unix ns
}

func (c *Client) urgentCallsOf(op string) *urgentCalls {
	u, _ := c.urgent.LoadOrStore(op, &urgentCalls{})
	return u.(*urgentCalls)
}

// urgentNearby: an Urgent call of op is in flight or ended < urgentQuiet ago.
func (c *Client) urgentNearby(op string) bool {
	v, ok := c.urgent.Load(op)
	if !ok {
		return false
	}
	u := v.(*urgentCalls)
	if u.inFlight.Load() > 0 {
		return true
	}
	return time.Since(time.Unix(0, u.lastEnd.Load())) < urgentQuiet
}

type urgentKey struct{}

// Urgent marks ctx for a call that pods are waiting on and that must not
// queue behind this replica's share of its operation's limit: a takeover's
// ENI list. With N replicas a share refills one ListENIs token every N
// seconds, so a takeover that found it just spent by the periodic sync
// waited up to N s on top of the lease expiry (a failover's survivor: 3.75 s
// for 8 nodes, with 3 replicas). An urgent call spends the share's token
// when there is one (so housekeeping then yields) and otherwise goes
// without. The shared budget still applies, and should BCE's own limit for
// the operation turn it away, the RateLimit retry spaces it by the
// operation's cluster-wide interval, and retries twenty times as often as an
// ordinary call (see urgentThrottleRetries).
func Urgent(ctx context.Context) context.Context { return context.WithValue(ctx, urgentKey{}, true) }

// Option adds something a Client is built with.
type Option func(*Client)

// WithGate installs a check made before every attempt, before and after the
// token wait: while it returns an error no request is sent (the call fails
// with class Canceled). The shard layer closes the gate of a replica whose
// lease is at risk or that holds no share of the budget, so a paused or
// cut-off replica spends none of the cluster's budget.
func WithGate(gate func() error) Option {
	return func(c *Client) {
		if gate != nil {
			c.gate.Store(&gate)
		}
	}
}

// mayAttempt is the check before an HTTP attempt and before its token
// wait: the replica's gate, then every node permission ctx carries
// (ForNode). It returns the attempt's deadline (zero: none) or the refusal;
// last is the previous attempt's failure, nil before the first.
func (c *Client) mayAttempt(ctx context.Context, op, resource string, last *Error) (time.Time, *Error) {
	if err := c.gateErr(); err != nil {
		return time.Time{}, &Error{Op: op, Resource: resource, Class: ClassCanceled, Message: "gated: " + err.Error(), cause: err}
	}
	return nodePermitted(ctx, op, resource, last)
}

func (c *Client) gateErr() error {
	if g := c.gate.Load(); g != nil {
		return (*g)()
	}
	return nil
}

// Usage reports the shared bucket's tokens taken so far and how many takes
// had to wait (see Limiter.Usage).
func (c *Client) Usage() (taken, waited int64) { return c.limiter.Usage() }

// OpRate returns an operation's current limit (0, 0 when it has none).
func (c *Client) OpRate(op string) (float64, int64) {
	if l := c.opLimits[op]; l != nil {
		return l.Rate()
	}
	return 0, 0
}

// Rate returns the current client-side rate and burst.
func (c *Client) Rate() (float64, int64) { return c.limiter.Rate() }

// Close drops idle connections.
func (c *Client) Close() { c.transport.CloseIdleConnections() }

func (c *Client) redact(s string) string {
	for _, secret := range c.secrets {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, "[REDACTED]")
		}
	}
	return s
}

// do runs one logical call: wait for a token, call the SDK (which itself
// never retries: see newSDKConfig), and retry here what may succeed later:
// RateLimit after a jittered backoff (up to ThrottleRetries), 5xx and
// transport failures after an exponential jittered backoff (up to
// SDKRetries). Every HTTP attempt takes its own token of the shared bucket
// and passes the gate first, so the requests BCE sees never exceed the
// tokens taken (I5); it also asks the node permissions ctx carries
// (ForNode) and ends at their deadline, so nothing is sent for a node this
// replica may no longer act for (I1). Every attempt is timed; the final
// result is counted once by class.
func (c *Client) do(ctx context.Context, op, resource string, fn func(s *sdkSet) error) error {
	if ctx.Value(urgentKey{}) != nil {
		u := c.urgentCallsOf(op)
		u.inFlight.Add(1)
		defer func() {
			u.lastEnd.Store(time.Now().UnixNano())
			u.inFlight.Add(-1)
		}()
	} else if ctx.Value(noWaitKey{}) != nil && c.urgentNearby(op) {
		return c.skipped(op, resource, "an urgent call of the operation is in flight or just ended")
	}
	var st callState
	for {
		if done, err := c.attempt(ctx, op, resource, fn, &st); done {
			return err
		}
	}
}

// callState is what one attempt of a logical call leaves to the next.
type callState struct {
	throttled           bool // the last attempt was answered RateLimit
	throttles, failures int
	last                *Error // the previous attempt's failure
}

// attempt makes one HTTP attempt of a logical call: the gate, the tokens,
// the gate again (the wait may have outlasted the permission), the request,
// and the decision to retry. done reports that the call is over, with err
// its (counted) result; otherwise the caller goes again.
func (c *Client) attempt(ctx context.Context, op, resource string, fn func(s *sdkSet) error, st *callState) (done bool, err error) {
	if _, e := c.mayAttempt(ctx, op, resource, st.last); e != nil {
		return true, c.count(op, e)
	}
	if err := c.takeTokens(ctx, op, resource, st); err != nil {
		return true, err
	}
	until, e := c.mayAttempt(ctx, op, resource, st.last)
	if e != nil {
		return true, c.count(op, e)
	}
	e, cut, retryable := c.send(ctx, op, resource, until, fn)
	if e == nil {
		c.m.calls.WithLabelValues(op, "ok").Inc()
		return true, nil
	}
	st.last, st.throttled = e, false
	backoff, retry := c.retryAfter(ctx, op, resource, e, cut, retryable, st)
	if !retry {
		return true, c.count(op, e)
	}
	if sleepCtx(ctx, backoff) != nil {
		return true, c.count(op, &Error{Op: op, Resource: resource, Class: ClassCanceled, Message: ctx.Err().Error(), cause: ctx.Err()})
	}
	return false, nil
}

// count records a call's final failure by class and returns it.
func (c *Client) count(op string, e *Error) error {
	c.m.calls.WithLabelValues(op, e.Class.String()).Inc()
	return e
}

// takeTokens waits for an attempt's tokens: the operation's own limit (this
// replica's share of it; for an urgent attempt, its pace), then the shared
// bucket. A retry after RateLimit takes no second token of the
// operation's own limit: BCE did not count the rejected call, and the
// backoff already spaced the retry by the operation's cluster-wide interval
// (waiting for this replica's share too kept a takeover's ENI list, which
// collides with the other survivors', seconds behind theirs). A retry after
// a 5xx does take one: BCE counted the failed call. A non-nil error ends the
// call and is already counted.
//
// An urgent attempt, which the share does not hold back, paces itself at
// the operation's whole, cluster-wide limit (c.paces, a little under it,
// which every attempt of the operation spends from): BCE's bucket counts at
// least this replica's own calls, so an attempt sent while they have
// emptied it is turned away for certain. An urgent list that sent its pages
// back to back had every page after the first refused once, then retried
// after a backoff of 1-1.5 intervals (a lone replica's takeover of 1,000
// ENIs listed in 5 pages: 8 ListENIs calls; paced, 7).
func (c *Client) takeTokens(ctx context.Context, op, resource string, st *callState) error {
	var waited time.Duration
	var err error
	urgent := ctx.Value(urgentKey{}) != nil
	if ol := c.opLimits[op]; ol != nil && !st.throttled {
		switch {
		case urgent:
			ol.TryTake() // spent if there, so housekeeping yields; never waited for
		case ctx.Value(noWaitKey{}) != nil:
			if !ol.TryTake() {
				if st.last != nil { // a retry: report why the call failed
					return c.count(op, st.last)
				}
				return c.skipped(op, resource, ErrWouldWait.Error())
			}
		default:
			waited, err = ol.Wait(ctx)
		}
	}
	if pace := c.paces[op]; pace != nil && err == nil {
		if urgent {
			var w time.Duration
			w, err = pace.Wait(ctx)
			waited += w
		} else {
			// Counted, never waited for: the share above paces these.
			pace.TryTake()
		}
	}
	if err == nil {
		var w time.Duration
		w, err = c.limiter.Wait(ctx)
		waited += w
	}
	c.m.wait.WithLabelValues(op).Observe(waited.Seconds())
	if err != nil {
		return c.count(op, &Error{Op: op, Resource: resource, Class: ClassCanceled, Message: err.Error(), cause: err})
	}
	return nil
}

// paceMargin keeps an operation's pace a little under BCE's limit: BCE
// debits its bucket when a request arrives, later than the pace's token was
// taken, and the next request may arrive sooner after it than the pace
// spaced them.
const paceMargin = 0.9

// send makes the HTTP attempt, ended at the node permissions' deadline
// (until) if there is one. It returns nil on success, else the classified
// failure, whether the attempt was cut short by the caller's context or the
// deadline, and whether the SDK's rule would retry it.
func (c *Client) send(ctx context.Context, op, resource string, until time.Time,
	fn func(s *sdkSet) error) (e *Error, cut, retryable bool) {
	actx, cancel := ctx, context.CancelFunc(func() {})
	if !until.IsZero() {
		actx, cancel = context.WithDeadline(ctx, until)
	}
	defer cancel()
	signer, tok, e := c.signer(actx, op, resource)
	if e != nil {
		return e, false, false
	}
	s := c.newSDKSet(actx, signer)
	start := time.Now()
	err := fn(s)
	s.rt.close()
	c.m.latency.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err == nil {
		return nil, false, false
	}
	e = classify(actx, op, resource, err)
	cut = actx.Err() != nil // the caller's context ended, or the permission's deadline passed
	if cut && ctx.Err() == nil {
		e.Message = "the node's permission ended during the attempt: " + e.Message
		e.cause = fmt.Errorf("%w: %w", ErrFenced, actx.Err())
	}
	e.Message = c.redact(e.Message)
	if tok != "" {
		e.Message = strings.ReplaceAll(e.Message, tok, "[REDACTED]")
	}
	return e, cut, sdkRetryable(err, s.rt)
}

// retryAfter decides whether a failed attempt is tried again, and after how
// long: RateLimit up to ThrottleRetries (more for an urgent call), 5xx and
// transport failures up to SDKRetries unless the attempt was cut short.
func (c *Client) retryAfter(ctx context.Context, op, resource string, e *Error, cut, retryable bool,
	st *callState) (time.Duration, bool) {
	switch {
	case e.Class == ClassRateLimit:
		c.m.throttled.WithLabelValues(op).Inc()
		if st.throttles < c.throttleRetries(ctx) {
			st.throttles++
			st.throttled = true
			backoff := c.throttleBackoff(op)
			c.log.Debug("bce throttled, backing off", "op", op, "resource", resource, "attempt", st.throttles, "backoff", backoff)
			return backoff, true
		}
	case !cut && st.failures < c.cfg.SDKRetries && retryable:
		backoff := c.failureBackoff(st.failures)
		st.failures++
		c.log.Debug("bce call failed, retrying", "op", op, "resource", resource, "retry", st.failures, "backoff", backoff, "err", e.Message)
		return backoff, true
	}
	return 0, false
}

// errBadMarker is a truncated list page whose next marker cannot be used:
// following it could loop or skip pages.
func errBadMarker(op, marker string) *Error {
	return &Error{Op: op, Class: ClassServer, Message: fmt.Sprintf("truncated page with unusable nextMarker %q", marker)}
}

// sdkRetryable is the SDK's own retry rule (bce.BackOffRetryPolicy), which
// this client now applies itself: a request that failed in transport (unless
// the context or the attempt's timeout ended it), 500, 502, 503, a 400 with
// code Http400, and RequestExpired (a retry is signed afresh).
func sdkRetryable(err error, rt *ctxTransport) bool {
	var se *bce.BceServiceError
	var ce *bce.BceClientError
	switch {
	case errors.As(err, &se):
		switch se.StatusCode {
		case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable:
			return true
		case http.StatusBadRequest:
			return se.Code == "Http400"
		}
		return se.Code == bce.EREQUEST_EXPIRED
	case errors.As(err, &ce):
		// Only a request that was sent: the SDK's argument checks fail
		// with the same type, and would fail again.
		return rt.sent() && !strings.Contains(ce.Message, "context deadline exceeded") &&
			!strings.Contains(ce.Message, "context canceled")
	}
	return false
}

// failureBackoff is the wait before retry n (from 0) of a call that failed
// with 5xx or in transport: the SDK's SDKRetryBase·2^n capped at 20 s, with
// jitter × [0.5, 1.5) so that replicas hit by one outage do not retry in step.
func (c *Client) failureBackoff(n int) time.Duration {
	const maxDelay = 20 * time.Second
	d := c.cfg.SDKRetryBase
	for i := 0; i < n && d < maxDelay; i++ { // doubling, not a shift: no overflow
		d *= 2
	}
	d = min(d, maxDelay)
	return time.Duration(float64(d) * (0.5 + rand.Float64()))
}

// skipped fails a NoWait call that would have had to wait.
func (c *Client) skipped(op, resource, why string) error {
	c.m.calls.WithLabelValues(op, ClassCanceled.String()).Inc()
	return &Error{Op: op, Resource: resource, Class: ClassCanceled, Message: "skipped: " + why, cause: ErrWouldWait}
}

// urgentThrottleRetries multiplies ThrottleRetries for an Urgent call. When
// several replicas take over at once (a cold start, a failover's survivors),
// their lists collide at BCE's ListENIs limit and each page may be turned
// away several times; giving up after ThrottleRetries threw away the pages
// already read and put the whole takeover behind the coordinator's retry
// (a 3,000-node cold start: one replica failed its list after 6 s and
// started over). The retries stay spaced by the operation's interval.
// Four times as many were too few for 5 replicas starting on 5,000 nodes
// (5 pages each at 1 ListENIs/s): lists failed after ~15 s of a page's
// retries, batches of 1,000 nodes backed off and started over, and
// serving every node took minutes. A page of a list already begun is
// worth waiting for: with the default ThrottleRetries (3), an urgent call
// now bears 60 refusals (about a minute at ListENIs' interval).
const urgentThrottleRetries = 20

func (c *Client) throttleRetries(ctx context.Context) int {
	if ctx.Value(urgentKey{}) != nil && c.cfg.ThrottleRetries > 0 {
		return c.cfg.ThrottleRetries * urgentThrottleRetries
	}
	return c.cfg.ThrottleRetries
}

// throttleBackoff is the jittered wait before retrying a call BCE answered
// RateLimit: ThrottleBackoff × [1, 6), and for an operation with a
// cluster-wide limit at least its interval × [1, 1.5), since BCE's bucket for
// it refills no sooner (ListENIs: 1/s).
func (c *Client) throttleBackoff(op string) time.Duration {
	d := time.Duration(float64(c.cfg.ThrottleBackoff) * (1 + 5*rand.Float64()))
	if l, ok := c.cfg.OpLimits[op]; ok && l.Rate > 0 {
		d = max(d, time.Duration(float64(time.Second)/l.Rate*(1+0.5*rand.Float64())))
	}
	return d
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// validID rejects IDs that would change the request path or query.
func validID(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, r := range s {
		if r != '-' && r != '_' && r != '.' && (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') {
			return false
		}
	}
	return true
}

func validIP(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

// maxPages guards pagination against a server that never stops.
const maxPages = 100_000

// ListENIs implements Provider.
func (c *Client) ListENIs(ctx context.Context, opts ListENIsOptions) ([]ENI, error) {
	const op = "ListENIs"
	for _, id := range []string{opts.VPCID, opts.InstanceID} {
		if id != "" && !validID(id) {
			return nil, invalid(op, id, "malformed ID")
		}
	}
	for _, ip := range opts.PrivateIPs {
		if !validIP(ip) {
			return nil, invalid(op, "", "malformed address %q", ip)
		}
	}
	want := map[string]bool{}
	for _, ip := range opts.PrivateIPs {
		want[ip] = true
	}
	var out []ENI
	marker := ""
	seen := map[string]bool{}
	for page := 0; ; page++ {
		if page == maxPages {
			return nil, &Error{Op: op, Class: ClassServer, Message: "pagination did not end"}
		}
		var res *listENIResult
		err := c.do(ctx, op, opts.VPCID, func(s *sdkSet) error {
			var err error
			res, err = listENIPage(s.eni, &eni.ListEniArgs{VpcId: opts.VPCID, InstanceId: opts.InstanceID, Name: opts.NamePrefix,
				Marker: marker, MaxKeys: c.cfg.PageSize, PrivateIpAddress: opts.PrivateIPs})
			return err
		})
		if err != nil {
			return nil, err
		}
		for i := range res.ENIs {
			if !standardENI(res.ENIs[i].TrafficMode) {
				continue // an ERI or RoCE interface: not a pod ENI (traffic.go)
			}
			r := &res.ENIs[i].Eni
			// BCE matches the name loosely and a single address by suffix:
			// keep exactly what was asked for.
			if !strings.HasPrefix(r.Name, opts.NamePrefix) || (opts.InstanceID != "" && r.InstanceId != opts.InstanceID) ||
				(opts.Instances != nil && !opts.Instances[r.InstanceId] && r.InstanceId != "" &&
					ENIStatus(r.Status) != ENIStatusAvailable) {
				continue
			}
			e := fromSDKENI(r)
			if len(want) > 0 && !holdsAny(&e, want) {
				continue
			}
			out = append(out, e)
		}
		if !res.IsTruncated {
			return out, nil
		}
		if res.NextMarker == "" || seen[res.NextMarker] {
			return nil, errBadMarker(op, res.NextMarker)
		}
		seen[res.NextMarker] = true
		marker = res.NextMarker
	}
}

func holdsAny(e *ENI, want map[string]bool) bool {
	for _, ip := range e.PrivateIPs {
		if want[ip.Address] {
			return true
		}
	}
	return false
}

// GetENI implements Provider.
func (c *Client) GetENI(ctx context.Context, eniID string) (*ENI, error) {
	const op = "GetENI"
	if !validID(eniID) {
		return nil, invalid(op, eniID, "malformed ENI ID")
	}
	var res *eni.Eni
	err := c.do(ctx, op, eniID, func(s *sdkSet) error {
		var err error
		res, err = s.eni.GetEniDetail(eniID)
		return err
	})
	if err != nil {
		return nil, err
	}
	e := fromSDKENI(res)
	return &e, nil
}

// CreateENI implements Provider.
func (c *Client) CreateENI(ctx context.Context, req CreateENIRequest) (string, error) {
	const op = "CreateENI"
	switch {
	case req.Name == "" || len(req.Name) > 256:
		return "", invalid(op, req.SubnetID, "name must be 1 to 256 characters")
	case !validID(req.SubnetID):
		return "", invalid(op, req.SubnetID, "malformed subnet ID")
	case len(req.SecurityGroupIDs) == 0 && len(req.EnterpriseSecurityGroupIDs) == 0:
		return "", invalid(op, req.SubnetID, "an ENI needs security groups or enterprise security groups")
	case len(req.SecurityGroupIDs) > 0 && len(req.EnterpriseSecurityGroupIDs) > 0:
		return "", invalid(op, req.SubnetID, "an ENI takes security groups or enterprise security groups, not both")
	case req.PrimaryIP != "" && !validIP(req.PrimaryIP):
		return "", invalid(op, req.SubnetID, "malformed primary address %q", req.PrimaryIP)
	case req.SecondaryIPs < 0 || req.SecondaryIPs > MaxCreateSecondaryIPs:
		return "", invalid(op, req.SubnetID, "%d secondary addresses: want 0 to %d", req.SecondaryIPs, MaxCreateSecondaryIPs)
	}
	ips := make([]eni.PrivateIp, 1, 1+req.SecondaryIPs)
	ips[0] = eni.PrivateIp{Primary: true, PrivateIpAddress: req.PrimaryIP}
	for range req.SecondaryIPs {
		ips = append(ips, eni.PrivateIp{}) // auto-assigned by BCE
	}
	args := &eni.CreateEniArgs{ClientToken: newClientToken(), Name: req.Name, SubnetId: req.SubnetID,
		SecurityGroupIds: req.SecurityGroupIDs, EnterpriseSecurityGroupIds: req.EnterpriseSecurityGroupIDs,
		Description: req.Description, PrivateIpSet: ips}
	var id string
	err := c.do(ctx, op, req.SubnetID, func(s *sdkSet) error {
		res, err := s.eni.CreateEni(args)
		if err == nil {
			id = res.EniId
		}
		return err
	})
	if err == nil && id == "" {
		return "", &Error{Op: op, Resource: req.SubnetID, Class: ClassServer, Message: "BCE returned no ENI ID"}
	}
	return id, err
}

// AttachENI implements Provider.
func (c *Client) AttachENI(ctx context.Context, eniID, instanceID string) error {
	return c.attachDetach(ctx, "AttachENI", eniID, instanceID, func(s *sdkSet, a *eni.EniInstance) error {
		return s.eni.AttachEniInstance(a)
	})
}

// DetachENI implements Provider.
func (c *Client) DetachENI(ctx context.Context, eniID, instanceID string) error {
	return c.attachDetach(ctx, "DetachENI", eniID, instanceID, func(s *sdkSet, a *eni.EniInstance) error {
		return s.eni.DetachEniInstance(a)
	})
}

func (c *Client) attachDetach(ctx context.Context, op, eniID, instanceID string, fn func(*sdkSet, *eni.EniInstance) error) error {
	if !validID(eniID) || !validID(instanceID) {
		return invalid(op, eniID, "malformed ENI or instance ID")
	}
	args := &eni.EniInstance{EniId: eniID, InstanceId: &instanceID, ClientToken: newClientToken()}
	return c.do(ctx, op, eniID, func(s *sdkSet) error { return fn(s, args) })
}

// DeleteENI implements Provider.
func (c *Client) DeleteENI(ctx context.Context, eniID string) error {
	const op = "DeleteENI"
	if !validID(eniID) {
		return invalid(op, eniID, "malformed ENI ID")
	}
	args := &eni.DeleteEniArgs{EniId: eniID, ClientToken: newClientToken()}
	return c.do(ctx, op, eniID, func(s *sdkSet) error { return s.eni.DeleteEni(args) })
}

// AddPrivateIP implements Provider.
func (c *Client) AddPrivateIP(ctx context.Context, eniID, ip string) (string, error) {
	const op = "AddPrivateIP"
	if !validID(eniID) || (ip != "" && !validIP(ip)) {
		return "", invalid(op, eniID, "malformed ENI ID or address %q", ip)
	}
	args := &eni.EniPrivateIpArgs{EniId: eniID, PrivateIpAddress: ip, ClientToken: newClientToken()}
	var got string
	err := c.do(ctx, op, eniID, func(s *sdkSet) error {
		res, err := s.eni.AddPrivateIp(args)
		if err == nil {
			got = res.PrivateIpAddress
		}
		return err
	})
	return got, err
}

// BatchAddPrivateIPs implements Provider.
func (c *Client) BatchAddPrivateIPs(ctx context.Context, eniID string, req BatchAddRequest) ([]string, error) {
	const op = "BatchAddPrivateIP"
	switch {
	case !validID(eniID):
		return nil, invalid(op, eniID, "malformed ENI ID")
	case (req.Count > 0) == (len(req.IPs) > 0) || req.Count < 0:
		return nil, invalid(op, eniID, "give either a positive count or explicit addresses")
	case req.Count > MaxBatchIPs || len(req.IPs) > MaxBatchIPs:
		return nil, invalid(op, eniID, "at most %d addresses per call", MaxBatchIPs)
	}
	for _, ip := range req.IPs {
		if !validIP(ip) {
			return nil, invalid(op, eniID, "malformed address %q", ip)
		}
	}
	ips := req.IPs
	if ips == nil {
		ips = []string{}
	}
	args := &eni.EniBatchPrivateIpArgs{
		EniId:                 eniID,
		PrivateIpAddresses:    ips,
		PrivateIpAddressCount: req.Count,
		ClientToken:           newClientToken(),
	}
	var got []string
	err := c.do(ctx, op, eniID, func(s *sdkSet) error {
		res, err := s.eni.BatchAddPrivateIp(args)
		if err == nil {
			got = res.PrivateIpAddresses
		}
		return err
	})
	return got, err
}

// BatchAddPrivateIPsCrossSubnet implements Provider. The request has the
// upstream's shape: a count names the subnet at the top, explicit addresses
// each name theirs (and the top-level subnetId is sent empty).
func (c *Client) BatchAddPrivateIPsCrossSubnet(ctx context.Context, eniID string, req CrossSubnetAddRequest) ([]string, error) {
	const op = "BatchAddPrivateIPCrossSubnet"
	if err := checkCrossSubnetAdd(op, eniID, req); err != nil {
		return nil, err
	}
	args := &eni.EniBatchAddPrivateIpCrossSubnetArgs{
		EniId:       eniID,
		ClientToken: newClientToken(),
		IsIpv6:      req.IPv6,
	}
	if req.Count > 0 {
		args.SubnetId, args.PrivateIpAddressCount = req.SubnetID, req.Count
	}
	for _, ip := range req.IPs {
		args.PrivateIps = append(args.PrivateIps, eni.PrivateIpArgs{PrivateIpAddress: ip, SubnetId: req.SubnetID})
	}
	var got []string
	err := c.do(ctx, op, eniID, func(s *sdkSet) error {
		res, err := s.eni.BatchAddPrivateIpCrossSubnet(args)
		if err == nil {
			got = res.PrivateIpAddresses
		}
		return err
	})
	return got, err
}

// checkCrossSubnetAdd refuses what BCE would refuse for its form, before a
// token is spent on it.
func checkCrossSubnetAdd(op, eniID string, req CrossSubnetAddRequest) *Error {
	switch {
	case !validID(eniID):
		return invalid(op, eniID, "malformed ENI ID")
	case !validID(req.SubnetID):
		return invalid(op, eniID, "malformed subnet ID %q", req.SubnetID)
	case (req.Count > 0) == (len(req.IPs) > 0) || req.Count < 0:
		return invalid(op, eniID, "give either a positive count or explicit addresses")
	case req.Count > MaxBatchIPs || len(req.IPs) > MaxBatchIPs:
		return invalid(op, eniID, "at most %d addresses per call", MaxBatchIPs)
	}
	for _, ip := range req.IPs {
		a, err := netip.ParseAddr(ip)
		if err != nil || a.Zone() != "" || a.Is4In6() || a.Is6() != req.IPv6 {
			return invalid(op, eniID, "malformed address %q for IPv6=%v", ip, req.IPv6)
		}
	}
	return nil
}

// DeletePrivateIP implements Provider.
func (c *Client) DeletePrivateIP(ctx context.Context, eniID, ip string) error {
	const op = "DeletePrivateIP"
	if !validID(eniID) || !validIP(ip) {
		return invalid(op, eniID, "malformed ENI ID or address %q", ip)
	}
	args := &eni.EniPrivateIpArgs{EniId: eniID, PrivateIpAddress: ip, ClientToken: newClientToken()}
	return c.do(ctx, op, eniID, func(s *sdkSet) error { return s.eni.DeletePrivateIp(args) })
}

// BatchDeletePrivateIPs implements Provider.
func (c *Client) BatchDeletePrivateIPs(ctx context.Context, eniID string, ips []string) error {
	const op = "BatchDeletePrivateIP"
	if !validID(eniID) || len(ips) == 0 {
		return invalid(op, eniID, "malformed ENI ID or no addresses")
	}
	for _, ip := range ips {
		if !validIP(ip) {
			return invalid(op, eniID, "malformed address %q", ip)
		}
	}
	args := &eni.EniBatchPrivateIpArgs{EniId: eniID, PrivateIpAddresses: ips, ClientToken: newClientToken()}
	return c.do(ctx, op, eniID, func(s *sdkSet) error { return s.eni.BatchDeletePrivateIp(args) })
}

// DescribeSubnet implements Provider.
func (c *Client) DescribeSubnet(ctx context.Context, subnetID string) (*Subnet, error) {
	const op = "DescribeSubnet"
	if !validID(subnetID) {
		return nil, invalid(op, subnetID, "malformed subnet ID")
	}
	var res *vpc.GetSubnetDetailResult
	err := c.do(ctx, op, subnetID, func(s *sdkSet) error {
		var err error
		res, err = s.vpc.GetSubnetDetail(subnetID)
		return err
	})
	if err != nil {
		return nil, err
	}
	sn := fromSDKSubnet(&res.Subnet)
	return &sn, nil
}

// ListSubnets implements Provider.
func (c *Client) ListSubnets(ctx context.Context, opts ListSubnetsOptions) ([]Subnet, error) {
	const op = "ListSubnets"
	if opts.VPCID != "" && !validID(opts.VPCID) {
		return nil, invalid(op, opts.VPCID, "malformed VPC ID")
	}
	var out []Subnet
	marker := ""
	seen := map[string]bool{}
	for page := 0; page < maxPages; page++ {
		var res *vpc.ListSubnetResult
		err := c.do(ctx, op, opts.VPCID, func(s *sdkSet) error {
			var err error
			res, err = s.vpc.ListSubnets(&vpc.ListSubnetArgs{
				Marker:   marker,
				MaxKeys:  c.cfg.PageSize,
				VpcId:    opts.VPCID,
				ZoneName: opts.ZoneName,
			})
			return err
		})
		if err != nil {
			return nil, err
		}
		for i := range res.Subnets {
			out = append(out, fromSDKSubnet(&res.Subnets[i]))
		}
		if !res.IsTruncated {
			return out, nil
		}
		if res.NextMarker == "" || seen[res.NextMarker] {
			return nil, errBadMarker(op, res.NextMarker)
		}
		seen[res.NextMarker] = true
		marker = res.NextMarker
	}
	return nil, &Error{Op: op, Class: ClassServer, Message: "pagination did not end"}
}

// GetInstance implements Provider.
func (c *Client) GetInstance(ctx context.Context, instanceID string) (*Instance, error) {
	const op = "GetInstance"
	if !validID(instanceID) {
		return nil, invalid(op, instanceID, "malformed instance ID")
	}
	var in *Instance
	err := c.do(ctx, op, instanceID, func(s *sdkSet) error {
		res, err := s.bcc.GetInstanceDetail(instanceID)
		if err != nil {
			return err
		}
		m := &res.Instance
		in = &Instance{ID: m.InstanceId, Name: m.InstanceName, Status: string(m.Status), ZoneName: m.ZoneName,
			VPCID: m.VpcId, SubnetID: m.SubnetId, InternalIP: m.InternalIP, CPUCount: m.CpuCount,
			MemoryCapacityInGB: m.MemoryCapacityInGB, ENIQuota: m.EniQuota}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return in, nil
}
