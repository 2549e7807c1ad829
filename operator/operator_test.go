package operator

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cce-ipam/sharded/shard"
)

// Refusals come before any read or call: the Handler here has no clients
// and no CNI service, so a request that got past them would panic.
func TestHandler_RefusesBeforeActing(t *testing.T) {
	body := `{"namespace":"default","name":"web-0","user":"alice"}`
	key := []byte("0123456789abcdef0123456789abcdef")
	sig, err := shard.NewAuthenticator(key).SignRequest(http.MethodPost, PathAllocate, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		key    []byte
		method string
		path   string
		sig    string
		body   string
		code   int
		text   string
	}{
		{"no forward key", nil, http.MethodPost, PathAllocate, sig, body, http.StatusForbidden, "no forward key: operator calls are off"},
		{"unsigned", key, http.MethodPost, PathAllocate, "", body, http.StatusUnauthorized, "no X-Cce-Ipam-Signature header"},
		{"bad signature", key, http.MethodPost, PathAllocate, sig[:len(sig)-2] + "AA", body, http.StatusUnauthorized, "bad signature"},
		{"signed for allocate, sent to release", key, http.MethodPost, PathRelease, sig, body, http.StatusUnauthorized, "bad signature"},
		{"body changed", key, http.MethodPost, PathAllocate, sig, strings.Replace(body, "web-0", "web-1", 1), http.StatusUnauthorized, "bad signature"},
		{"GET", key, http.MethodGet, PathAllocate, sig, "", http.StatusMethodNotAllowed, "use POST"},
		{"other path", key, http.MethodPost, "/admin/other", sig, body, http.StatusNotFound, "not found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := NewHandler(Deps{Auth: shard.NewAuthenticator(c.key), Self: "r0"}, nil)
			req := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
			if c.sig != "" {
				req.Header.Set(shard.HeaderOperatorSignature, c.sig)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != c.code || !strings.Contains(rec.Body.String(), c.text) {
				t.Errorf("HTTP %d %q, want %d with %q", rec.Code, rec.Body.String(), c.code, c.text)
			}
		})
	}
}

// A signed body that is not a complete request is refused as such.
func TestHandler_BadBody(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	for body, text := range map[string]string{
		`{"namespace":"default","name":"web-0"}`:                  "namespace, name and user are required",
		`{"namespace":"default","name":"web-0","user":"a","x":1}`: "unknown field",
		`not json`: "bad request body",
	} {
		sig, _ := shard.NewAuthenticator(key).SignRequest(http.MethodPost, PathRelease, []byte(body))
		req := httptest.NewRequest(http.MethodPost, PathRelease, strings.NewReader(body))
		req.Header.Set(shard.HeaderOperatorSignature, sig)
		rec := httptest.NewRecorder()
		NewHandler(Deps{Auth: shard.NewAuthenticator(key)}, nil).ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), text) {
			t.Errorf("body %s: HTTP %d %q, want 400 with %q", body, rec.Code, rec.Body.String(), text)
		}
	}
}
