package bcesim

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Both modes on one simulator: signed requests as before, gateway requests
// checked by token, cluster and remote host, refusals BCE-shaped.
func TestServer_GatewayAndSignedModes(t *testing.T) {
	srv, err := New(Config{Credentials: map[string]string{"ak": "sk"},
		Gateway: GatewayConfig{Tokens: []string{"tok-1"}, RemoteHosts: []string{"bcc.bj.baidubce.com"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.AddSubnet(SubnetSpec{ID: "sbn-1", ZoneName: "cn-bj-a", CIDR: "10.0.0.0/24", VPCID: "vpc-1"}); err != nil {
		t.Fatal(err)
	}
	addr, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })

	send := func(h map[string]string) (int, errorBody) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/subnet/sbn-1", nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var eb errorBody
		_ = json.Unmarshal(body, &eb)
		return resp.StatusCode, eb
	}
	good := map[string]string{"cce-token": "tok-1", "cce-cluster": "cce-1", "cce-remote-host": "bcc.bj.baidubce.com"}
	with := func(k, v string) map[string]string {
		h := map[string]string{}
		for kk, vv := range good {
			h[kk] = vv
		}
		if v == "" {
			delete(h, k)
		} else {
			h[k] = v
		}
		return h
	}
	if st, eb := send(good); st != http.StatusOK {
		t.Fatalf("good gateway request: %d %+v", st, eb)
	}
	for name, c := range map[string]struct {
		h      map[string]string
		status int
		code   string
	}{
		"no token":            {with("cce-token", ""), 401, CodeAccessDenied},
		"wrong token":         {with("cce-token", "tok-2"), 403, CodeAccessDenied},
		"no cluster":          {with("cce-cluster", ""), 400, CodeInvalidParameter},
		"unknown remote host": {with("cce-remote-host", "bbc.bj.baidubce.com"), 404, CodeUnknownRemoteHost},
		"also signed":         {with("Authorization", "bce-auth-v1/ak/x/1800//sig"), 400, CodeInvalidAuthHeader},
	} {
		st, eb := send(c.h)
		if st != c.status || eb.Code != c.code || eb.Message == "" || eb.RequestID == "" {
			t.Errorf("%s: %d %+v, want %d %s", name, st, eb, c.status, c.code)
		}
	}
	gs := srv.GatewayStats()
	if gs.Accepted != 1 || gs.Refused != 5 || gs.LastHeaders["cce-token"] != "tok-1" || gs.RemoteHosts["bcc.bj.baidubce.com"] != 1 {
		t.Fatalf("gateway stats %+v", gs)
	}

	// A signed request still goes through the signature check.
	r := signed(t, http.MethodGet, "/v1/subnet/sbn-1", nil, nil)
	r.URL.Host = addr
	r.Host = "127.0.0.1:8080" // as signed
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("signed request: %d", resp.StatusCode)
	}
	r = signed(t, http.MethodGet, "/v1/subnet/sbn-1", nil, nil)
	r.URL.Host, r.Host = addr, "127.0.0.1:8080"
	r.Header.Set("Authorization", strings.Replace(r.Header.Get("Authorization"), "/ak/", "/nobody/", 1))
	resp, err = http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("unknown access key: %d", resp.StatusCode)
	}
	if srv.GatewayStats().Accepted != 1 {
		t.Fatal("a signed request counted as the gateway's")
	}
}

// Without gateway tokens, a request with a cce-token is refused, and a
// simulator needs keys or tokens.
func TestServer_GatewayModeOff(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("no keys and no tokens accepted")
	}
	if _, err := New(Config{Gateway: GatewayConfig{Tokens: []string{"a b"}}}); err == nil {
		t.Fatal("token with a space accepted")
	}
	srv, err := New(Config{Credentials: map[string]string{"ak": "sk"}})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, "/v1/subnet/sbn-1", nil)
	req.Header.Set("cce-token", "x")
	req.Header.Set("cce-cluster", "c")
	if _, aerr := srv.authenticate(req); aerr == nil || aerr.Status != http.StatusUnauthorized {
		t.Fatalf("gateway request with the mode off: %v", aerr)
	}
}
