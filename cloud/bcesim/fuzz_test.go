package bcesim

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// fuzzServer returns a server whose world has one ENI attached to a 4 GB
// instance, and that ENI's ID; "{eni}" in fuzzed paths is replaced by it so
// the fuzzer reaches the world, not just the not-found path.
func fuzzServer(t *testing.T) (*Server, string) {
	s, err := New(Config{Credentials: map[string]string{"ak": "sk"}, PageSize: 2, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	w := s.world
	must := func(_ string, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	sn, err := w.AddSubnet(t0, SubnetSpec{ID: "sbn-a", ZoneName: "a", CIDR: "10.0.0.0/28", VPCID: "vpc"})
	must(sn, err)
	must(w.AddSubnet(t0, SubnetSpec{ID: "sbn-b", ZoneName: "a", CIDR: "10.0.1.0/29", VPCID: "vpc"}))
	must(w.AddSecurityGroup(t0, SecurityGroupSpec{ID: "g", VPCID: "vpc"}))
	must(w.AddInstance(t0, InstanceSpec{ID: "i-1", SubnetID: sn, CPUCount: 2, MemoryGB: 4, SecurityGroupIDs: []string{"g"}}))
	id, err := w.CreateENI(t0, CreateENIInput{Name: "c/i-1/n/000000", SubnetID: sn, SecurityGroupIDs: []string{"g"}, PrivateIPs: []IPRequest{{Primary: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AttachENI(t0, id, "i-1"); err != nil {
		t.Fatal(err)
	}
	return s, id
}

// FuzzRequestDecoding feeds arbitrary method, path, query and body through
// routing, decoding and the world. Nothing may panic; every refusal must be a
// 4xx APIError; every success must encode as JSON; the world's invariants
// must hold afterwards.
func FuzzRequestDecoding(f *testing.F) {
	f.Add("POST", "/v1/eni", "clientToken=x", []byte(`{"name":"c/i/n/1","subnetId":"sbn-a","securityGroupIds":["g"],"privateIpSet":[{"primary":true,"privateIpAddress":""}]}`))
	f.Add("POST", "/v1/eni/{eni}/privateIp/batchAdd", "", []byte(`{"privateIpAddresses":[],"privateIpAddressCount":3}`))
	f.Add("POST", "/v1/eni/{eni}/privateIp/batchAddCrossSubnet", "", []byte(`{"subnetId":"sbn-b","privateIps":null,"privateIpAddressCount":2}`))
	f.Add("POST", "/v1/eni/{eni}/privateIp/batchAddCrossSubnet", "", []byte(`{"subnetId":"","privateIps":[{"privateIpAddress":"10.0.1.3","subnetId":"sbn-b"}]}`))
	f.Add("POST", "/v1/eni/{eni}/privateIp", "", []byte(`{"privateIpAddress":"10.0.0.9"}`))
	f.Add("POST", "/v1/eni/{eni}/privateIp/batchDel", "", []byte(`{"privateIpAddresses":["10.0.0.9","10.0.0.10"]}`))
	f.Add("DELETE", "/v1/eni/{eni}/privateIp/10.0.0.9", "", []byte(nil))
	f.Add("PUT", "/v1/eni/{eni}", "detach", []byte(`{"instanceId":"i-1"}`))
	f.Add("PUT", "/v1/eni/{eni}", "attach&detach", []byte(`{"instanceId":null}`))
	f.Add("DELETE", "/v1/eni/{eni}", "", []byte(nil))
	f.Add("GET", "/v1/eni", "vpcId&name=c%2F&maxKeys=1&marker=eni-", []byte(nil))
	f.Add("GET", "/v1/eni", "privateIpAddress=10.0.0.2,10.0.0.3&maxKeys=0", []byte(nil))
	f.Add("GET", "/v1/eni/quota", "instanceId=i-1", []byte(nil))
	f.Add("GET", "/v1/subnet", "vpcId=vpc&subnetIds=sbn-a,sbn-b&maxKeys=1", []byte(nil))
	f.Add("GET", "/v2/instance/i-1", "isDeploySet=false", []byte(nil))
	f.Add("GET", "/v2/securityGroup", "instanceId=i-1&maxKeys=1000", []byte(nil))
	f.Add("PATCH", "/v1/eni/{eni}/status", "", []byte("{"))
	f.Fuzz(func(t *testing.T, method, path, rawQuery string, body []byte) {
		s, id := fuzzServer(t)
		path = strings.ReplaceAll(path, "{eni}", id)
		q, _ := url.ParseQuery(rawQuery) // keep what parsed, as net/http does
		refused := func(stage string, e *APIError) {
			if e.Status < 400 || e.Status > 499 || e.Code == "" {
				t.Fatalf("%s refused with %d %q: %s", stage, e.Status, e.Code, e.Message)
			}
		}
		c, aerr := route(method, path, q)
		if aerr != nil {
			refused("route", aerr)
			return
		}
		if aerr := decode(c, q, body); aerr != nil {
			refused("decode", aerr)
			return
		}
		resp, err := s.dispatch(c, t0.Add(time.Second), 0)
		if err != nil {
			var ae *APIError
			if !errors.As(err, &ae) {
				t.Fatalf("dispatch returned a non-API error: %v", err)
			}
			refused("dispatch", ae)
		} else if _, err := json.Marshal(resp); err != nil {
			t.Fatalf("response does not encode: %v", err)
		}
		if err := s.world.Check(); err != nil {
			t.Fatalf("invariant broken after %s %s?%s %q: %v", method, path, rawQuery, body, err)
		}
	})
}

// FuzzVerifySignature feeds arbitrary Authorization headers, paths and
// queries to the signature check: it must never panic, and must only accept
// what a correct signer produced (a random header essentially never is).
func FuzzVerifySignature(f *testing.F) {
	f.Add("bce-auth-v1/ak/2026-12-02T08:58:06Z/1800/content-type;host;x-bce-date/00", "/v1/eni/fd00::1", "attach")
	f.Add("bce-auth-v1/ak/ts/1800//", "/", "")
	f.Add("bce-auth-v1/nope/ts/1800/host/ab", "/v1/eni", "a=%ZZ")
	f.Add("////////", "", "")
	f.Fuzz(func(t *testing.T, authz, path, rawQuery string) {
		r, err := http.NewRequest(http.MethodGet, "http://127.0.0.1/", nil)
		if err != nil {
			t.Fatal(err)
		}
		r.URL.Path, r.URL.RawQuery = path, rawQuery
		r.Header.Set("Authorization", authz)
		r.Header.Set("Content-Type", "application/json;charset=utf-8")
		e := verifySignature(r, func(ak string) (string, bool) { return "sk", ak == "ak" })
		if e == nil {
			parts := strings.Split(authz, "/")
			if len(parts) != 6 || parts[1] != "ak" {
				t.Fatalf("accepted %q", authz)
			}
			return
		}
		if e.Status != 400 && e.Status != 403 {
			t.Fatalf("refused with status %d", e.Status)
		}
	})
}
