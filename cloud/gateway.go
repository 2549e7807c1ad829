package cloud

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/baidubce/bce-sdk-go/auth"
	bcehttp "github.com/baidubce/bce-sdk-go/http"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Inside a CCE cluster the reference authenticates to BCE through the CCE
// gateway with a cluster token instead of AK/SK (spec, appendix "the CCE
// gateway credentials"). The token comes from a Secret or a mounted
// directory and carries its own expiry; every request is sent to the gateway
// with the token in headers and the real destination in cce-remote-host.

// Gateway token sources (the reference's) and wire names.
const (
	DefaultGatewayTokenSecret = "kube-system/cce-plugin-token"
	DefaultGatewayTokenDir    = "/var/run/secrets/cce/cce-plugin-token"
	// GatewayTokenKey and GatewayExpiredAtKey are the Secret's data keys and
	// the mounted directory's file names.
	GatewayTokenKey     = "token"
	GatewayExpiredAtKey = "expiredAt"

	HeaderCCEToken      = "cce-token"
	HeaderCCECluster    = "cce-cluster"
	HeaderCCERemoteHost = "cce-remote-host"
	headerRequestID     = "x-bce-request-id"

	// gatewayPort is the gateway's port when CCE_GATEWAY_ENDPOINT names none.
	gatewayPort = "80"
)

// gatewayRefreshBefore is how long before expiredAt the token is read
// again, so a rotated token is picked up while the old one still works;
// gatewayRetryEvery spaces the reads after a failed one.
const (
	gatewayRefreshBefore = time.Minute
	gatewayRetryEvery    = 10 * time.Second
)

// maxTokenBytes bounds what is read from the Secret or the files.
const maxTokenBytes = 16 << 10

// GatewayToken is a CCE gateway token and the time it expires.
type GatewayToken struct {
	Token     string
	ExpiredAt time.Time
}

// ParseGatewayToken parses the token and expiredAt values of the Secret or
// the files. The token is trimmed and must be non-empty printable ASCII
// without spaces (it travels as a header value); expiredAt is decimal Unix
// seconds, positive. Errors never contain the token.
func ParseGatewayToken(token, expiredAt []byte) (GatewayToken, error) {
	if len(token) > maxTokenBytes || len(expiredAt) > 64 {
		return GatewayToken{}, errors.New("token or expiredAt too long")
	}
	tok := strings.TrimSpace(string(token))
	if tok == "" {
		return GatewayToken{}, errors.New("token is empty")
	}
	for i := 0; i < len(tok); i++ {
		if c := tok[i]; c <= ' ' || c >= 0x7f {
			return GatewayToken{}, fmt.Errorf("token has a byte not allowed in a header at offset %d", i)
		}
	}
	exp := strings.TrimSpace(string(expiredAt))
	secs, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || secs <= 0 || exp[0] == '+' {
		return GatewayToken{}, fmt.Errorf("expiredAt %q is not a positive decimal Unix time in seconds", clip(exp, 32))
	}
	// Beyond year 9999 time.Unix still works, but such a value is garbage.
	if secs > 253402300799 {
		return GatewayToken{}, fmt.Errorf("expiredAt %d is past year 9999", secs)
	}
	return GatewayToken{Token: tok, ExpiredAt: time.Unix(secs, 0)}, nil
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// SecretGetter reads a Secret's data; the command wires it to the API
// server (cloud imports no Kubernetes client). It returns an error wrapping
// ErrSecretNotFound when the Secret does not exist.
type SecretGetter func(ctx context.Context, namespace, name string) (map[string][]byte, error)

// ErrSecretNotFound is what a SecretGetter wraps when the Secret is absent.
var ErrSecretNotFound = errors.New("secret not found")

// WithSecretGetter lets the gateway signer read its token Secret.
func WithSecretGetter(get SecretGetter) Option {
	return func(c *Client) {
		if c.tokens != nil {
			c.tokens.secret = get
		}
	}
}

// tokenSource yields the current gateway token: from the Secret if it can
// be read, else from the directory; read again gatewayRefreshBefore before
// it expires. A failed read keeps the previous token until it expires.
// Safe for concurrent use; no lock is held while reading.
type tokenSource struct {
	secretNS, secretName string
	dir                  string
	secret               SecretGetter
	now                  func() time.Time
	log                  *slog.Logger
	m                    *gatewayMetrics

	mu         sync.Mutex
	cur        *GatewayToken
	from       string        // where cur came from
	nextTry    time.Time     // no read before this after a failure
	lastErr    error         // the last read's failure
	refreshing chan struct{} // closed when the read in flight ends
}

func newTokenSource(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*tokenSource, error) {
	ts := &tokenSource{dir: cfg.GatewayTokenDir, now: time.Now, log: log, m: newGatewayMetrics(reg)}
	if cfg.GatewayTokenSecret != "" {
		ns, name, ok := strings.Cut(cfg.GatewayTokenSecret, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("gateway token secret %q: want namespace/name", cfg.GatewayTokenSecret)
		}
		ts.secretNS, ts.secretName = ns, name
	}
	return ts, nil
}

// token returns a token to send now, reading it when due (at most one
// read per call, one at a time).
func (ts *tokenSource) token(ctx context.Context) (GatewayToken, error) {
	didRead := false
	for {
		ts.mu.Lock()
		now := ts.now()
		if ts.cur != nil && now.Before(ts.cur.ExpiredAt.Add(-gatewayRefreshBefore)) {
			t := *ts.cur
			ts.mu.Unlock()
			return t, nil
		}
		due := (ts.cur == nil && ts.lastErr == nil) || !now.Before(ts.nextTry)
		if ts.refreshing == nil && due && !didRead {
			done := make(chan struct{})
			ts.refreshing = done
			ts.mu.Unlock()
			t, from, err := ts.read(ctx)
			ts.mu.Lock()
			ts.applyLocked(t, from, err, ts.now())
			ts.refreshing = nil
			close(done)
			ts.mu.Unlock()
			didRead = true
			continue
		}
		// The old token while it lasts, else wait for the read in flight,
		// else the last read's failure.
		if ts.cur != nil && now.Before(ts.cur.ExpiredAt) {
			t := *ts.cur
			ts.mu.Unlock()
			return t, nil
		}
		wait, lastErr, cur := ts.refreshing, ts.lastErr, ts.cur
		ts.mu.Unlock()
		switch {
		case wait != nil:
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return GatewayToken{}, ctx.Err()
			}
		case lastErr != nil && cur != nil:
			return GatewayToken{}, fmt.Errorf("%w; the last token expired at %s", lastErr, cur.ExpiredAt.UTC().Format(time.RFC3339))
		case lastErr != nil:
			return GatewayToken{}, lastErr
		case cur != nil:
			// Read fine but already expired (the rotator is late): the
			// gateway decides; it is read again every gatewayRetryEvery.
			return *cur, nil
		}
		return GatewayToken{}, errors.New("no CCE gateway token")
	}
}

// applyLocked records a read's result.
func (ts *tokenSource) applyLocked(t GatewayToken, from string, err error, now time.Time) {
	if err != nil {
		ts.lastErr = err
		ts.nextTry = now.Add(gatewayRetryEvery)
		ts.m.refreshes.WithLabelValues("error").Inc()
		if ts.cur != nil && now.Before(ts.cur.ExpiredAt) {
			ts.log.Warn("CCE gateway token refresh failed; keeping the current token until it expires",
				"err", err, "expiredAt", ts.cur.ExpiredAt, "retryIn", gatewayRetryEvery)
		} else {
			ts.log.Error("CCE gateway token unavailable: BCE calls fail until it can be read", "err", err,
				"retryIn", gatewayRetryEvery)
		}
		return
	}
	ts.m.refreshes.WithLabelValues("ok").Inc()
	ts.m.expiry.Set(float64(t.ExpiredAt.Unix()))
	changed := ts.cur == nil || ts.cur.Token != t.Token || !ts.cur.ExpiredAt.Equal(t.ExpiredAt)
	ts.cur, ts.from, ts.lastErr = &t, from, nil
	if !now.Before(t.ExpiredAt.Add(-gatewayRefreshBefore)) {
		// Already due (the rotator is late): use it, read again later.
		ts.nextTry = now.Add(gatewayRetryEvery)
		ts.log.Warn("CCE gateway token read is expired or about to expire", "from", from, "expiredAt", t.ExpiredAt)
		return
	}
	if changed {
		ts.log.Info("CCE gateway token loaded", "from", from, "expiredAt", t.ExpiredAt)
	}
}

// read loads the token: the Secret first, else the directory. The error
// names both sources' failures.
func (ts *tokenSource) read(ctx context.Context) (GatewayToken, string, error) {
	var errs []error
	if ts.secretName != "" && ts.secret != nil {
		src := "secret " + ts.secretNS + "/" + ts.secretName
		data, err := ts.secret(ctx, ts.secretNS, ts.secretName)
		if err == nil {
			t, perr := ParseGatewayToken(data[GatewayTokenKey], data[GatewayExpiredAtKey])
			if perr == nil {
				return t, src, nil
			}
			err = perr
		}
		errs = append(errs, fmt.Errorf("%s: %w", src, err))
	}
	if ts.dir != "" {
		src := "directory " + ts.dir
		t, err := readTokenDir(ts.dir)
		if err == nil {
			return t, src, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", src, err))
	}
	if len(errs) == 0 {
		errs = append(errs, errors.New("no token source configured"))
	}
	return GatewayToken{}, "", fmt.Errorf("read CCE gateway token: %w", errors.Join(errs...))
}

func readTokenDir(dir string) (GatewayToken, error) {
	read := func(name string) ([]byte, error) {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, maxTokenBytes+1))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		return b, nil
	}
	tok, err := read(GatewayTokenKey)
	if err != nil {
		return GatewayToken{}, err
	}
	exp, err := read(GatewayExpiredAtKey)
	if err != nil {
		return GatewayToken{}, err
	}
	return ParseGatewayToken(tok, exp)
}

// gatewayMetrics count token reads and show the token's expiry.
type gatewayMetrics struct {
	refreshes *prometheus.CounterVec
	expiry    prometheus.Gauge
}

func newGatewayMetrics(reg prometheus.Registerer) *gatewayMetrics {
	f := promauto.With(reg)
	return &gatewayMetrics{
		refreshes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_cloud_gateway_token_reads_total",
			Help: "Reads of the CCE gateway token (Secret or mounted files) by result (ok, error).",
		}, []string{"result"}),
		expiry: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_cloud_gateway_token_expiry_timestamp_seconds",
			Help: "expiredAt of the CCE gateway token in use, Unix seconds.",
		}),
	}
}

// gatewayHostPort is the gateway's host:port: CCE_GATEWAY_ENDPOINT (host or
// host:port) or cce-gateway.<region>.baidubce.com:80.
func gatewayHostPort(endpoint, region string) (string, error) {
	if endpoint == "" {
		return net.JoinHostPort("cce-gateway."+region+".baidubce.com", gatewayPort), nil
	}
	if strings.Contains(endpoint, "://") || strings.ContainsAny(endpoint, "/ \t\r\n") {
		return "", fmt.Errorf("gateway endpoint %q: want host or host:port", endpoint)
	}
	if host, port, err := net.SplitHostPort(endpoint); err == nil {
		if p, perr := strconv.Atoi(port); host == "" || perr != nil || p < 1 || p > 65535 {
			return "", fmt.Errorf("gateway endpoint %q: bad host or port", endpoint)
		}
		return endpoint, nil
	}
	if strings.Contains(endpoint, ":") && !strings.HasPrefix(endpoint, "[") {
		// A bare IPv6 address: bracket it.
		if ip := net.ParseIP(endpoint); ip != nil {
			return net.JoinHostPort(endpoint, gatewayPort), nil
		}
		return "", fmt.Errorf("gateway endpoint %q: bad host or port", endpoint)
	}
	return net.JoinHostPort(strings.Trim(endpoint, "[]"), gatewayPort), nil
}

// gatewaySigner is auth.Signer for one attempt with one token: it sends the
// request to the gateway with the token headers instead of a bce-auth-v1
// signature. Signing again (the SDK does on a retry) gives the same request:
// the original host is kept in cce-remote-host.
type gatewaySigner struct {
	gateway   string // host:port
	clusterID string
	token     string
}

var _ auth.Signer = gatewaySigner{}

func (s gatewaySigner) Sign(req *bcehttp.Request, _ *auth.BceCredentials, _ *auth.SignOptions) {
	remote := req.Host()
	if remote == s.gateway {
		remote = req.Header(HeaderCCERemoteHost) // signed before: keep the first destination
	}
	if remote != "" && remote != s.gateway {
		req.SetHeader(HeaderCCERemoteHost, remote)
	}
	// The gateway listens on plain HTTP on its port; SetHost also sets the
	// port the SDK reports, and the URL is built from the host.
	req.SetProtocol("http")
	req.SetHost(s.gateway)
	req.SetHeader(bcehttp.HOST, s.gateway)
	req.SetHeader(HeaderCCEToken, s.token)
	req.SetHeader(HeaderCCECluster, s.clusterID)
	if req.Header(bcehttp.CONTENT_TYPE) == "" {
		req.SetHeader(bcehttp.CONTENT_TYPE, "application/json")
	}
	if req.Header(headerRequestID) == "" {
		req.SetHeader(headerRequestID, newRequestID())
	}
	delete(req.Headers(), bcehttp.AUTHORIZATION)
}

// newRequestID is a random UUID (version 4) for x-bce-request-id.
func newRequestID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
