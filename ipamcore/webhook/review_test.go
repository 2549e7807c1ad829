package webhook

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

// post sends body to the pod webhook's handler and returns the response.
func post(t testing.TB, s *Server, contentType, body string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, PathMutatePods+"?timeout=2s", strings.NewReader(body))
	r.Header.Set("Content-Type", contentType)
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, r)
	return w
}

func reviewJSON(req string) string {
	return `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":` + req + `}`
}

func TestServer_Handler_MalformedReviewIs400(t *testing.T) {
	s := newTestServer(t, podWorld())
	pod := `{"metadata":{"name":"p","labels":{"app":"web"}},"spec":{"containers":[{"name":"c"}]}}`
	for _, tc := range []struct {
		name, contentType, body, want string
	}{
		{"not JSON", "application/json", "{", "decode"},
		{"wrong content type", "text/plain", reviewJSON(`{"uid":"u","object":` + pod + `}`), "content type"},
		{"wrong kind", "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"Pod","request":{"uid":"u"}}`, "kind"},
		{"v1beta1", "application/json", `{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u"}}`, "admission.k8s.io/v1"},
		{"no request", "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, "no request"},
		{"no uid", "application/json", reviewJSON(`{"operation":"CREATE","object":` + pod + `}`), "uid"},
		{"no object", "application/json", reviewJSON(`{"uid":"u","operation":"CREATE"}`), "without object"},
		{"object is not a pod", "application/json",
			reviewJSON(`{"uid":"u","operation":"CREATE","resource":{"version":"v1","resource":"pods"},"object":{"spec":{"containers":7}}}`),
			"decode object"},
		{"field of the wrong type", "application/json", reviewJSON(`{"uid":7}`), "decode"},
		{"too large", "application/json", reviewJSON(`{"uid":"u","object":{"x":"` + strings.Repeat("a", maxReviewBytes) + `"}}`), "larger"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := post(t, s, tc.contentType, tc.body)
			if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), tc.want) {
				t.Fatalf("HTTP %d %q, want 400 mentioning %q", w.Code, w.Body.String(), tc.want)
			}
		})
	}
	r := httptest.NewRequest(http.MethodGet, PathMutatePods, nil)
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, r)
	if w.Code != http.StatusMethodNotAllowed {
		t.Fatalf("GET: HTTP %d, want 405", w.Code)
	}
}

func TestServer_Handler_AnswersWithTheRequestUID(t *testing.T) {
	s := newTestServer(t, podWorld())
	w := post(t, s, "application/json; charset=utf-8", reviewJSON(`{"uid":"abc-1","operation":"CREATE","namespace":"apps",
		"resource":{"version":"v1","resource":"pods"},
		"object":{"metadata":{"name":"p","labels":{"app":"web"}},"spec":{"containers":[{"name":"c"}]}}}`))
	if w.Code != http.StatusOK {
		t.Fatalf("HTTP %d %s", w.Code, w.Body)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" || out.Response == nil ||
		out.Response.UID != "abc-1" || !out.Response.Allowed || !bytes.Contains(out.Response.Patch, []byte("zoneA")) {
		t.Fatalf("answer %s", w.Body)
	}
}
