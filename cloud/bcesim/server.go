package bcesim

import (
	"context"
	"crypto/md5"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config configures a Server. Zero values get the documented defaults.
type Config struct {
	// Credentials maps access key IDs to secret keys: a request signed
	// bce-auth-v1 must be signed by one of them. Required unless the gateway
	// mode is on.
	Credentials map[string]string
	// Gateway turns on the CCE gateway mode alongside (gateway.go): requests
	// carrying a cce-token are checked against Gateway.Tokens instead.
	Gateway GatewayConfig
	// PageSize caps list pages below the client's maxKeys so pagination is
	// exercised. Defaults to 1000; must be in [1,1000].
	PageSize int
	// World configures the world model (delays, quotas, seed).
	World WorldConfig
	// RateLimits are per-operation token buckets. Nil means unlimited;
	// DefaultRateLimits gives the upstream's table.
	RateLimits map[Op]RateLimit
	// Now is the clock. Defaults to time.Now; tests pass a fake to step the
	// attach delay without sleeping.
	Now func() time.Time
	// Logger receives one debug line per request. Defaults to discarding.
	Logger *slog.Logger
	// MaxBodyBytes bounds request bodies. Defaults to 1 MiB.
	MaxBodyBytes int64
	// IdempotencyEntries bounds the clientToken cache. Defaults to 65536.
	IdempotencyEntries int
}

// Server is the simulator: the world model behind the BCE OpenAPI over HTTP,
// plus the admin API under /admin/. It is safe for concurrent use.
type Server struct {
	cfg    Config
	log    *slog.Logger
	mu     sync.Mutex // guards world and idem
	world  *World
	idem   *idemCache
	limits *limiter
	faults *faultState
	counts *counters
	// gateway checks and records CCE gateway requests.
	gateway *gatewayState
	reqSeq  atomic.Uint64

	httpSrv *http.Server
	ln      net.Listener
	done    chan struct{}
	// Handlers hold inflight for reading while they run; Close takes it for
	// writing, so it returns only after every handler has, and handlers that
	// start later see closed and do nothing. (A WaitGroup cannot do this: a
	// connection accepted before Close may start its handler after Wait began.)
	inflight sync.RWMutex
	closed   bool
}

// New validates cfg and returns a Server that has not started listening.
func New(cfg Config) (*Server, error) {
	if len(cfg.Credentials) == 0 && len(cfg.Gateway.Tokens) == 0 {
		return nil, errors.New("bcesim: at least one access key or gateway token is required")
	}
	for _, t := range cfg.Gateway.Tokens {
		if t == "" || strings.ContainsAny(t, " \t\r\n") {
			return nil, errors.New("bcesim: gateway tokens must be non-empty, without whitespace")
		}
	}
	for ak, sk := range cfg.Credentials {
		if ak == "" || sk == "" || strings.Contains(ak, "/") {
			return nil, errors.New("bcesim: access keys must be non-empty, without '/', with a non-empty secret")
		}
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = 1000
	}
	if cfg.PageSize < 1 || cfg.PageSize > 1000 {
		return nil, fmt.Errorf("bcesim: page size %d outside [1,1000]", cfg.PageSize)
	}
	if cfg.World.AttachDelay < 0 || cfg.World.AttachDelay >= 50*time.Second || cfg.World.DetachDelay < 0 {
		return nil, errors.New("bcesim: attach delay must be in [0,50s) and detach delay non-negative")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.IdempotencyEntries == 0 {
		cfg.IdempotencyEntries = 65536
	}
	return &Server{
		cfg: cfg, log: cfg.Logger, world: NewWorld(cfg.World), idem: newIdemCache(cfg.IdempotencyEntries),
		limits: newLimiter(cfg.RateLimits), faults: newFaultState(cfg.World.Seed), counts: newCounters(),
		gateway: newGatewayState(cfg.Gateway),
	}, nil
}

// Start listens on addr (e.g. "127.0.0.1:0") and serves in the background
// until Close. It returns the bound address.
func (s *Server) Start(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("bcesim: listen %s: %w", addr, err)
	}
	s.ln = ln
	s.httpSrv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		if err := s.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("serve failed", "err", err)
		}
	}()
	return ln.Addr().String(), nil
}

// URL is the endpoint to give the SDK, valid after Start.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops the listener, cuts open connections (which cancels the
// requests' contexts, ending injected latency early) and waits for the
// serving goroutine and every handler to return.
func (s *Server) Close() error {
	if s.httpSrv == nil {
		return nil
	}
	err := s.httpSrv.Close()
	<-s.done
	s.waitHandlers()
	return err
}

func (s *Server) waitHandlers() {
	s.inflight.Lock()
	s.closed = true
	s.inflight.Unlock()
}

// Shutdown stops accepting requests and waits for in-flight ones until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.httpSrv == nil {
		return nil
	}
	err := s.httpSrv.Shutdown(ctx)
	if err != nil {
		s.httpSrv.Close() // ctx ended first: cut what is left
	}
	<-s.done
	s.waitHandlers()
	return err
}

func (s *Server) newRequestID() string {
	n := s.reqSeq.Add(1)
	return fmt.Sprintf("bcesim-%08x-%04x", s.cfg.World.Seed&0xffffffff, n)
}

type errorBody struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	RequestID string `json:"requestId"`
}

func writeJSON(w http.ResponseWriter, reqID string, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		body, _ = json.Marshal(errorBody{Code: CodeInternalError, Message: "encode response", RequestID: reqID})
	}
	w.Header().Set("Content-Type", "application/json;charset=utf-8")
	w.Header().Set("x-bce-request-id", reqID)
	w.WriteHeader(status)
	_, _ = w.Write(body) // the client hung up: nothing to tell it
}

func writeError(w http.ResponseWriter, reqID string, e *APIError) {
	writeJSON(w, reqID, e.Status, errorBody{Code: e.Code, Message: e.Message, RequestID: reqID})
}

// ServeHTTP runs one request through the pipeline: route, authenticate,
// count, rate-limit, inject faults, decode, apply (with clientToken
// idempotency), and maybe fail after the mutation.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.inflight.RLock()
	defer s.inflight.RUnlock()
	if s.closed {
		return
	}
	if strings.HasPrefix(r.URL.Path, "/admin/") {
		s.serveAdmin(w, r)
		return
	}
	start := time.Now()
	reqID := s.newRequestID()
	c, status, aerr := s.handle(r)
	if aerr != nil {
		writeError(w, reqID, aerr)
		status = aerr.Status
	} else {
		writeJSON(w, reqID, status, c.arg)
	}
	op := Op("")
	if c != nil {
		op = c.op
	}
	s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "op", op, "status", status,
		"requestId", reqID, "elapsed", time.Since(start))
}

// handle returns the routed call with its response in c.arg, or an error.
func (s *Server) handle(r *http.Request) (*call, int, *APIError) {
	q := r.URL.Query()
	c, aerr := route(r.Method, r.URL.Path, q)
	if aerr != nil {
		return nil, 0, aerr
	}
	principal, aerr := s.authenticate(r)
	if aerr != nil {
		return c, 0, aerr
	}
	now := s.cfg.Now()
	if !s.limits.allow(c.op) {
		s.counts.add(c.op, now, true)
		return c, 0, apiErr(http.StatusTooManyRequests, CodeRateLimit, "request rate of %s exceeds its limit", c.op)
	}
	s.counts.add(c.op, now, false)
	body, err := io.ReadAll(io.LimitReader(r.Body, s.cfg.MaxBodyBytes+1))
	if err != nil {
		return c, 0, apiErr(http.StatusBadRequest, CodeMalformedJSON, "read body: %v", err)
	}
	if int64(len(body)) > s.cfg.MaxBodyBytes {
		return c, 0, apiErr(http.StatusRequestEntityTooLarge, CodeRequestBodyTooLarge, "body exceeds %d bytes", s.cfg.MaxBodyBytes)
	}
	if md := r.Header.Get("Content-Md5"); md != "" {
		sum := md5.Sum(body)
		if base64.StdEncoding.EncodeToString(sum[:]) != md {
			return c, 0, apiErr(http.StatusBadRequest, CodeBadDigest, "Content-MD5 does not match the body")
		}
	}
	if d := s.faults.latency(c.op); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return c, 0, apiErr(http.StatusServiceUnavailable, "RequestCanceled", "client went away")
		}
	}
	if s.faults.injectError(c.op) {
		return c, 0, apiErr(http.StatusInternalServerError, CodeInternalError, "injected failure before %s", c.op)
	}
	if aerr := decode(c, q, body); aerr != nil {
		return c, 0, aerr
	}
	status, resp, aerr := s.apply(c, r.URL.Path, principal, q.Get("clientToken"))
	if aerr != nil {
		return c, 0, aerr
	}
	if c.op.Mutating() && s.faults.failAfter(c.op) {
		return c, 0, apiErr(http.StatusInternalServerError, CodeInternalError, "injected failure after %s was applied", c.op)
	}
	c.arg = resp
	return c, status, nil
}

// authenticate checks a request's credentials: the CCE gateway's token
// headers, or a bce-auth-v1 signature. It returns who made it (the access
// key, or the gateway's cluster), which scopes clientTokens.
func (s *Server) authenticate(r *http.Request) (string, *APIError) {
	if s.gateway.isGatewayRequest(r) {
		return s.gateway.verify(r)
	}
	var ak string
	aerr := verifySignature(r, func(id string) (string, bool) { sk, ok := s.cfg.Credentials[id]; ak = id; return sk, ok })
	return ak, aerr
}

// apply runs the call against the world under the lock. A mutation with a
// clientToken seen before returns the remembered response unchanged.
func (s *Server) apply(c *call, path, principal, token string) (int, any, *APIError) {
	lag := s.faults.lag()
	s.mu.Lock()
	defer s.mu.Unlock()
	var key string
	if token != "" && c.op.Mutating() {
		key = principal + "|" + string(c.op) + "|" + path + "|" + token
		if cached, ok := s.idem.get(key); ok {
			return cached.status, cached.body, nil
		}
	}
	s.world.SetRetention(lag)
	resp, err := s.dispatch(c, s.cfg.Now(), lag)
	if err != nil {
		var ae *APIError
		if errors.As(err, &ae) {
			return 0, nil, ae
		}
		return 0, nil, apiErr(http.StatusInternalServerError, CodeInternalError, "%v", err)
	}
	if key != "" {
		s.idem.put(key, cachedResponse{status: http.StatusOK, body: resp})
	}
	return http.StatusOK, resp, nil
}
