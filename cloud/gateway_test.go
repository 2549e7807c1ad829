package cloud_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
)

// gatewayClient is a client in CCE gateway mode (no AK/SK) pointed at the
// simulator as the gateway, its token in a directory and, when secret is
// non-nil, in a Secret too.
func gatewayClient(t *testing.T, e *env, tok string, secret map[string][]byte) *cloud.Client {
	t.Helper()
	dir := t.TempDir()
	exp := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	for name, v := range map[string]string{"token": tok, "expiredAt": exp} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cc := testClientConfig(cloud.Config{})
	cc.AccessKeyID, cc.SecretAccessKey = "", ""
	cc.Endpoint = "" // the region's BCC host: reached through the gateway only
	cc.GatewayEndpoint = strings.TrimPrefix(e.srv.URL(), "http://")
	cc.GatewayTokenDir = dir
	cc.ClusterID = "cce-gw1"
	get := func(_ context.Context, ns, name string) (map[string][]byte, error) {
		if secret == nil || ns+"/"+name != cloud.DefaultGatewayTokenSecret {
			return nil, cloud.ErrSecretNotFound
		}
		return secret, nil
	}
	cl, err := cloud.New(cc, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), cloud.WithSecretGetter(get))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// The client in gateway mode reaches bce-sim's gateway mode with the
// appendix's headers and no signature; bce-sim forwards by cce-remote-host.
func TestGateway_CallsCarryGatewayHeaders(t *testing.T) {
	e := newEnv(t, envOpts{sim: bcesim.Config{Gateway: bcesim.GatewayConfig{Tokens: []string{"file-tok", "secret-tok"},
		RemoteHosts: []string{"bcc.bj.baidubce.com"}}}})
	ctx := context.Background()

	cl := gatewayClient(t, e, "file-tok", nil)
	if _, err := cl.DescribeSubnet(ctx, e.subnet); err != nil {
		t.Fatalf("through the gateway with the file token: %v", err)
	}
	st := e.srv.GatewayStats()
	h := st.LastHeaders
	gw := strings.TrimPrefix(e.srv.URL(), "http://")
	for k, want := range map[string]string{"cce-token": "file-tok", "cce-cluster": "cce-gw1",
		"cce-remote-host": "bcc.bj.baidubce.com", "host": gw} {
		if h[k] != want {
			t.Errorf("bce-sim saw %s = %q, want %q (all: %v)", k, h[k], want, h)
		}
	}
	if h["authorization"] != "" || h["x-bce-request-id"] == "" || !strings.HasPrefix(h["content-type"], "application/json") {
		t.Errorf("bce-sim saw %v", h)
	}
	if st.Accepted != 1 || st.Clusters["cce-gw1"] != 1 || st.RemoteHosts["bcc.bj.baidubce.com"] != 1 {
		t.Errorf("stats %+v", st)
	}

	// The Secret comes first when it can be read.
	cl2 := gatewayClient(t, e, "file-tok", map[string][]byte{"token": []byte("secret-tok"),
		"expiredAt": []byte(strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10))})
	if _, err := cl2.ListENIs(ctx, cloud.ListENIsOptions{VPCID: testVPC}); err != nil {
		t.Fatal(err)
	}
	if got := e.srv.GatewayStats().LastHeaders["cce-token"]; got != "secret-tok" {
		t.Fatalf("token %q, want the Secret's", got)
	}

	// The AK/SK client keeps working beside the gateway.
	if _, err := e.client.DescribeSubnet(ctx, e.subnet); err != nil {
		t.Fatalf("AK/SK beside the gateway: %v", err)
	}
	if got := e.srv.GatewayStats().Accepted; got != 2 {
		t.Fatalf("gateway accepted %d, want 2 (the signed call is not the gateway's)", got)
	}
}

func TestGateway_WrongTokenRefused(t *testing.T) {
	e := newEnv(t, envOpts{sim: bcesim.Config{Gateway: bcesim.GatewayConfig{Tokens: []string{"good"}}}})
	cl := gatewayClient(t, e, "wrong-token", nil)
	_, err := cl.DescribeSubnet(context.Background(), e.subnet)
	var ce *cloud.Error
	if !errors.As(err, &ce) || ce.Class != cloud.ClassAuth || ce.StatusCode != 403 || ce.Code != bcesim.CodeAccessDenied {
		t.Fatalf("wrong token: %v", err)
	}
	if strings.Contains(err.Error(), "wrong-token") {
		t.Fatalf("the error shows the token: %v", err)
	}
	if st := e.srv.GatewayStats(); st.Refused != 1 /* not retried */ || st.Accepted != 0 || st.Reasons[bcesim.CodeAccessDenied] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A simulator without the gateway mode refuses a gateway request.
func TestGateway_SimulatorWithoutGatewayRefuses(t *testing.T) {
	e := newEnv(t, envOpts{})
	cl := gatewayClient(t, e, "tok", nil)
	_, err := cl.DescribeSubnet(context.Background(), e.subnet)
	if cloud.ClassOf(err) != cloud.ClassAuth {
		t.Fatalf("gateway request to an AK/SK-only simulator: %v", err)
	}
}

// No token anywhere: every call fails with a clear auth error, no panic, no
// request sent.
func TestGateway_NoTokenIsClearError(t *testing.T) {
	e := newEnv(t, envOpts{sim: bcesim.Config{Gateway: bcesim.GatewayConfig{Tokens: []string{"good"}}}})
	cc := testClientConfig(cloud.Config{})
	cc.AccessKeyID, cc.SecretAccessKey = "", ""
	cc.GatewayEndpoint = strings.TrimPrefix(e.srv.URL(), "http://")
	cc.GatewayTokenDir = filepath.Join(t.TempDir(), "absent")
	cc.ClusterID = "cce-gw1"
	cl, err := cloud.New(cc, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cl.DescribeSubnet(context.Background(), e.subnet)
	if cloud.ClassOf(err) != cloud.ClassAuth || !strings.Contains(err.Error(), "CCE gateway") || !strings.Contains(err.Error(), "absent") {
		t.Fatalf("no token: %v", err)
	}
	if st := e.srv.GatewayStats(); st.Accepted+st.Refused != 0 {
		t.Fatalf("a request was sent: %+v", st)
	}
}

func TestConfig_GatewayChoice(t *testing.T) {
	c := cloud.DefaultConfig()
	if !c.UsesGateway() {
		t.Fatal("defaults (no AK/SK) must choose the gateway")
	}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "cluster ID") {
		t.Fatalf("gateway without a cluster ID: %v", err)
	}
	c.ClusterID = "cce-1"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.GatewayEndpoint = "http://gw"
	if err := c.Validate(); err == nil {
		t.Fatal("a URL as gateway endpoint accepted")
	}
	c.GatewayEndpoint, c.GatewayTokenSecret, c.GatewayTokenDir = "", "", ""
	if err := c.Validate(); err == nil {
		t.Fatal("no token source accepted")
	}
	c.GatewayTokenSecret = "no-namespace"
	if err := c.Validate(); err == nil {
		t.Fatal("secret without namespace accepted")
	}
	c.CredentialsDir = "/etc/bce"
	if c.UsesGateway() {
		t.Fatal("a credentials directory must choose AK/SK")
	}
}
