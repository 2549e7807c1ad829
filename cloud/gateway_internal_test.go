package cloud

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baidubce/bce-sdk-go/auth"
	bcehttp "github.com/baidubce/bce-sdk-go/http"
	"github.com/prometheus/client_golang/prometheus"
)

func TestParseGatewayToken(t *testing.T) {
	good, err := ParseGatewayToken([]byte(" tok-123\n"), []byte("1767225600\n"))
	if err != nil || good.Token != "tok-123" || good.ExpiredAt.Unix() != 1767225600 {
		t.Fatalf("good token: %+v, %v", good, err)
	}
	// Every token below contains SECRET: no error may show it.
	for name, c := range map[string][2]string{
		"empty token":         {"", "1767225600"},
		"blank token":         {" \n", "1767225600"},
		"space inside":        {"SECRET x", "1767225600"},
		"control byte":        {"SECRET\x01", "1767225600"},
		"non-ASCII":           {"SECRETö", "1767225600"},
		"empty expiredAt":     {"SECRET", ""},
		"expiredAt RFC3339":   {"SECRET", "2026-12-06T08:00:00Z"},
		"expiredAt fraction":  {"SECRET", "1767225600.5"},
		"expiredAt negative":  {"SECRET", "-5"},
		"expiredAt zero":      {"SECRET", "0"},
		"expiredAt plus":      {"SECRET", "+1767225600"},
		"expiredAt huge":      {"SECRET", "99999999999999999999"},
		"expiredAt year>9999": {"SECRET", "253402300800"},
		"token too long":      {strings.Repeat("SECRET", maxTokenBytes), "1767225600"},
	} {
		if _, err := ParseGatewayToken([]byte(c[0]), []byte(c[1])); err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), "SECRET") {
			t.Errorf("%s: error %q shows the token", name, err)
		}
	}
}

// FuzzParseGatewayToken: any bytes give a token that can travel as a header
// and a sane expiry, or an error; never a panic.
func FuzzParseGatewayToken(f *testing.F) {
	f.Add([]byte("tok"), []byte("1767225600"))
	f.Add([]byte(" t\n"), []byte(" 17 "))
	f.Add([]byte(""), []byte("-1"))
	f.Add([]byte("a\x00"), []byte("0x10"))
	f.Fuzz(func(t *testing.T, tok, exp []byte) {
		g, err := ParseGatewayToken(tok, exp)
		if err != nil {
			return
		}
		if g.Token == "" || strings.ContainsAny(g.Token, " \t\r\n") || g.ExpiredAt.Unix() <= 0 || g.ExpiredAt.Year() > 9999 {
			t.Fatalf("accepted %q/%q as %+v", tok, exp, g)
		}
		for i := 0; i < len(g.Token); i++ {
			if g.Token[i] <= ' ' || g.Token[i] >= 0x7f {
				t.Fatalf("token %q has byte %x", g.Token, g.Token[i])
			}
		}
	})
}

func TestGatewayHostPort(t *testing.T) {
	for in, want := range map[[2]string]string{
		{"", "bj"}:                "cce-gateway.bj.baidubce.com:80",
		{"gw.example", "bj"}:      "gw.example:80",
		{"gw.example:8080", "bj"}: "gw.example:8080",
		{"127.0.0.1:1234", "bj"}:  "127.0.0.1:1234",
		{"::1", "bj"}:             "[::1]:80",
		{"[::1]:81", "bj"}:        "[::1]:81",
	} {
		got, err := gatewayHostPort(in[0], in[1])
		if err != nil || got != want {
			t.Errorf("gatewayHostPort(%q) = %q, %v; want %q", in[0], got, err, want)
		}
	}
	for _, bad := range []string{"http://gw", "gw:0", "gw:x", ":80", "gw/path", "gw :80", "a:b:c"} {
		if got, err := gatewayHostPort(bad, "bj"); err == nil {
			t.Errorf("gatewayHostPort(%q) = %q, want an error", bad, got)
		}
	}
}

// The SDK signs once per request and again on each of its retries: signing
// twice must give the same request, with the original host kept.
func TestGatewaySigner_Idempotent(t *testing.T) {
	var req bcehttp.Request
	req.SetEndpoint("bcc.bj.baidubce.com")
	req.SetUri("/v1/eni")
	req.SetHeader(bcehttp.HOST, req.Host())
	req.SetHeader(bcehttp.AUTHORIZATION, "bce-auth-v1/stale")
	s := gatewaySigner{gateway: "gw.local:8080", clusterID: "cce-abc", token: "tok"}
	s.Sign(&req, nil, nil)
	first := map[string]string{}
	for k, v := range req.Headers() {
		first[k] = v
	}
	url1 := req.GenerateUrl(false)
	s.Sign(&req, nil, nil)
	if url2 := req.GenerateUrl(false); url1 != url2 || !strings.HasPrefix(url1, "http://gw.local:8080/v1/eni") {
		t.Fatalf("URL %q then %q", url1, url2)
	}
	if len(first) != len(req.Headers()) {
		t.Fatalf("headers %v then %v", first, req.Headers())
	}
	for k, v := range req.Headers() {
		if first[k] != v {
			t.Errorf("header %s: %q then %q", k, first[k], v)
		}
	}
	want := map[string]string{HeaderCCEToken: "tok", HeaderCCECluster: "cce-abc", HeaderCCERemoteHost: "bcc.bj.baidubce.com",
		"Host": "gw.local:8080", "Content-Type": "application/json"}
	for k, v := range want {
		if got := req.Header(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if req.Header("x-bce-request-id") == "" || req.Header(bcehttp.AUTHORIZATION) != "" {
		t.Errorf("request id %q, authorization %q", req.Header("x-bce-request-id"), req.Header(bcehttp.AUTHORIZATION))
	}

	// A request meant for the gateway itself carries no cce-remote-host.
	var direct bcehttp.Request
	direct.SetEndpoint("gw.local:8080")
	direct.SetHeader(bcehttp.CONTENT_TYPE, "application/json; charset=utf-8")
	s.Sign(&direct, nil, nil)
	if direct.Header(HeaderCCERemoteHost) != "" || direct.Header(bcehttp.CONTENT_TYPE) != "application/json; charset=utf-8" {
		t.Errorf("direct: remote %q content-type %q", direct.Header(HeaderCCERemoteHost), direct.Header(bcehttp.CONTENT_TYPE))
	}
	var _ auth.Signer = s
}

// tokenSourceFixture is a tokenSource over a directory and a Secret getter
// whose answers the test sets, on a clock the test moves.
type tokenSourceFixture struct {
	ts     *tokenSource
	dir    string
	now    time.Time
	secret atomic.Pointer[map[string][]byte] // nil: not found
	reads  atomic.Int32
	reg    *prometheus.Registry
}

func newTokenSourceFixture(t *testing.T) *tokenSourceFixture {
	f := &tokenSourceFixture{dir: t.TempDir(), now: time.Unix(1_800_000_000, 0), reg: prometheus.NewRegistry()}
	cfg := Config{GatewayTokenSecret: "kube-system/cce-plugin-token", GatewayTokenDir: f.dir}
	ts, err := newTokenSource(cfg, slog.New(slog.DiscardHandler), f.reg)
	if err != nil {
		t.Fatal(err)
	}
	ts.now = func() time.Time { return f.now }
	ts.secret = func(_ context.Context, ns, name string) (map[string][]byte, error) {
		f.reads.Add(1)
		if ns != "kube-system" || name != "cce-plugin-token" {
			t.Errorf("secret %s/%s read", ns, name)
		}
		if d := f.secret.Load(); d != nil {
			return *d, nil
		}
		return nil, ErrSecretNotFound
	}
	f.ts = ts
	return f
}

func (f *tokenSourceFixture) setSecret(tok string, exp time.Time) {
	d := map[string][]byte{"token": []byte(tok), "expiredAt": []byte(formatUnix(exp))}
	f.secret.Store(&d)
}

func (f *tokenSourceFixture) setFiles(t *testing.T, tok, exp string) {
	t.Helper()
	for name, v := range map[string]string{"token": tok, "expiredAt": exp} {
		if err := os.WriteFile(filepath.Join(f.dir, name), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func formatUnix(t time.Time) string { return itoa(t.Unix()) }

func (f *tokenSourceFixture) token(t *testing.T) string {
	t.Helper()
	g, err := f.ts.token(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return g.Token
}

func TestTokenSource_SecretFirstThenFiles(t *testing.T) {
	f := newTokenSourceFixture(t)
	// Nothing anywhere: a clear error naming both sources.
	_, err := f.ts.token(context.Background())
	if err == nil || !strings.Contains(err.Error(), "secret kube-system/cce-plugin-token") || !strings.Contains(err.Error(), f.dir) {
		t.Fatalf("no token: %v", err)
	}
	// Files only.
	f.now = f.now.Add(gatewayRetryEvery)
	f.setFiles(t, "file-tok", itoa(f.now.Add(time.Hour).Unix()))
	if got := f.token(t); got != "file-tok" {
		t.Fatalf("token %q, want file-tok", got)
	}
	// The Secret wins once it is there and the token is due.
	f.setSecret("secret-tok", f.now.Add(2*time.Hour))
	f.now = f.now.Add(time.Hour - gatewayRefreshBefore)
	if got := f.token(t); got != "secret-tok" {
		t.Fatalf("token %q, want secret-tok", got)
	}
}

func TestTokenSource_RefreshAtExpiry(t *testing.T) {
	f := newTokenSourceFixture(t)
	exp := f.now.Add(time.Hour)
	f.setSecret("a", exp)
	if got := f.token(t); got != "a" {
		t.Fatal(got)
	}
	reads := f.reads.Load()
	// Before the refresh point: no read.
	f.now = exp.Add(-gatewayRefreshBefore - time.Second)
	f.setSecret("b", exp.Add(time.Hour))
	if got := f.token(t); got != "a" || f.reads.Load() != reads {
		t.Fatalf("token %q after %d reads before it was due", got, f.reads.Load()-reads)
	}
	// At it: read again.
	f.now = exp.Add(-gatewayRefreshBefore)
	if got := f.token(t); got != "b" {
		t.Fatalf("token %q at the refresh point, want b", got)
	}
}

func TestTokenSource_FailedRefreshKeepsTokenUntilExpiry(t *testing.T) {
	f := newTokenSourceFixture(t)
	exp := f.now.Add(time.Hour)
	f.setSecret("a", exp)
	f.token(t)
	// The Secret goes bad and the files are absent: the old token stays.
	f.secret.Store(&map[string][]byte{"token": []byte("b"), "expiredAt": []byte("soon")})
	f.now = exp.Add(-30 * time.Second)
	if got := f.token(t); got != "a" {
		t.Fatalf("token %q after a failed refresh, want the old one", got)
	}
	if v := testutilCounter(t, f.reg, "cce_ipam_cloud_gateway_token_reads_total", "error"); v != 1 {
		t.Fatalf("error reads %v, want 1", v)
	}
	// Within gatewayRetryEvery no new read.
	reads := f.reads.Load()
	f.now = f.now.Add(gatewayRetryEvery / 2)
	f.token(t)
	if f.reads.Load() != reads {
		t.Fatal("read again before the retry interval")
	}
	// Past the expiry with the source still broken: a clear error.
	f.now = exp.Add(gatewayRetryEvery)
	_, err := f.ts.token(context.Background())
	if err == nil || !strings.Contains(err.Error(), "expiredAt") {
		t.Fatalf("expired token with a broken source: %v", err)
	}
	if errors.Is(err, ErrSecretNotFound) {
		t.Fatal("want the parse failure, not not-found")
	}
	// The source recovers: served again.
	f.setSecret("c", exp.Add(time.Hour))
	f.now = f.now.Add(gatewayRetryEvery)
	if got := f.token(t); got != "c" {
		t.Fatalf("token %q after recovery, want c", got)
	}
}

func testutilCounter(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
