package bcesim

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/baidubce/bce-sdk-go/auth"
	sdkhttp "github.com/baidubce/bce-sdk-go/http"
)

// signed builds a request the way the SDK signs it and returns it as the
// server would receive it.
func signed(t *testing.T, method, path string, params map[string]string, headers map[string]string) *http.Request {
	t.Helper()
	var sr sdkhttp.Request
	sr.SetMethod(method)
	sr.SetUri(path)
	sr.SetHost("127.0.0.1:8080")
	sr.SetParams(params)
	sr.SetHeader("Host", "127.0.0.1:8080")
	sr.SetHeader("Content-Type", "application/json;charset=utf-8")
	sr.SetHeader("x-bce-date", "2026-12-02T08:58:06Z")
	sr.SetHeader("x-bce-request-id", "fixed")
	for k, v := range headers {
		sr.SetHeader(k, v)
	}
	cred, _ := auth.NewBceCredentials("ak", "sk")
	(&auth.BceV1Signer{}).Sign(&sr, cred, &auth.SignOptions{HeadersToSign: auth.DEFAULT_HEADERS_TO_SIGN, ExpireSeconds: 1800})
	r, err := http.NewRequest(method, "http://127.0.0.1:8080"+path+"?"+sr.QueryString(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range sr.Headers() {
		if k != "Host" {
			r.Header.Set(k, v)
		}
	}
	return r
}

func secrets(ak string) (string, bool) { return "sk", ak == "ak" }

func TestVerifySignature_AcceptsSDKAndRejectsTampering(t *testing.T) {
	cases := []struct {
		name   string
		method string
		path   string
		params map[string]string
	}{
		{"flag param without value", http.MethodPut, "/v1/eni/eni-1", map[string]string{"attach": "", "clientToken": "t"}},
		{"ipv6 in the path", http.MethodDelete, "/v1/eni/eni-1/privateIp/fd00::1", nil},
		{"list with empty vpcId", http.MethodGet, "/v1/eni", map[string]string{"vpcId": "", "name": "c-1/", "maxKeys": "1000", "marker": "eni-x"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := signed(t, tc.method, tc.path, tc.params, nil)
			if e := verifySignature(r, secrets); e != nil {
				t.Fatalf("SDK signature refused: %v", e)
			}
			tampered := []func(r *http.Request){
				func(r *http.Request) { r.Method = http.MethodPost },
				func(r *http.Request) { r.URL.Path += "x" },
				func(r *http.Request) { q := r.URL.Query(); q.Set("extra", "1"); r.URL.RawQuery = q.Encode() },
				func(r *http.Request) { r.Host = "127.0.0.1:9999" },
				func(r *http.Request) { r.Header.Set("Content-Type", "text/plain") },
				func(r *http.Request) { r.Header.Set("x-bce-date", "2030-01-01T00:00:00Z") },
			}
			for i, mutate := range tampered {
				r := signed(t, tc.method, tc.path, tc.params, nil)
				mutate(r)
				if e := verifySignature(r, secrets); e == nil || e.Code != CodeSignatureMismatch {
					t.Errorf("tampering %d accepted or misreported: %v", i, e)
				}
			}
		})
	}
}

func TestVerifySignature_RequestIDIsNotSigned(t *testing.T) {
	r := signed(t, http.MethodGet, "/v1/eni", map[string]string{"vpcId": ""}, nil)
	r.Header.Set("x-bce-request-id", "changed-on-retry")
	if e := verifySignature(r, secrets); e != nil {
		t.Fatalf("request id changed the signature: %v", e)
	}
	r.URL.RawQuery = url.Values{"vpcId": {""}}.Encode() // "vpcId=" instead of "vpcId"
	if e := verifySignature(r, secrets); e != nil {
		t.Fatalf("vpcId= and bare vpcId differ: %v", e)
	}
}

func TestVerifySignature_MalformedHeaders(t *testing.T) {
	for _, h := range []string{"", "Bearer x", "bce-auth-v1/ak/ts/1800/host", "bce-auth-v2/ak/ts/1800/host/sig", "bce-auth-v1//ts/1800/host/sig"} {
		r, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1/v1/eni", nil)
		r.Header.Set("Authorization", h)
		if e := verifySignature(r, secrets); e == nil || e.Code != CodeInvalidAuthHeader {
			t.Errorf("header %q: %v", h, e)
		}
	}
	r, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1/v1/eni", nil)
	r.Header.Set("Authorization", "bce-auth-v1/unknown/ts/1800/host/sig")
	if e := verifySignature(r, secrets); e == nil || e.Code != CodeInvalidAccessKeyID || e.Status != 403 {
		t.Errorf("unknown key: %v", e)
	}
}
