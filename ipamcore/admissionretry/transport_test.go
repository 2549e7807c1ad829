package admissionretry

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Narrow unit tests of the transport against an httptest server answering
// as the API server words these refusals; the integration test
// TestFencingPolicy_UnloadableParamRetried (e2e/cluster) has a real API
// server refuse for a param it cannot load.

const (
	// As kube-apiserver v1.37 answers a write whose binding's param it could
	// not load (validating/dispatcher.go: no reason, hence Invalid).
	unconfiguredBody = `{"kind":"Status","apiVersion":"v1","status":"Failure",` +
		`"message":"configmaps \"w\" is forbidden: ValidatingAdmissionPolicy 'fence' with binding 'fence-7' denied request: failed to configure binding: ` +
		`Get \"https://127.0.0.1/apis/coordination.k8s.io/v1/namespaces/ns/leases/p-7\": context deadline exceeded",` +
		`"reason":"Invalid","details":{"name":"w","kind":"configmaps","causes":[{"message":"ValidatingAdmissionPolicy 'fence' ` +
		`with binding 'fence-7' denied request: failed to configure binding: context deadline exceeded"}]},"code":422}`
	// The fencing policy's own refusal.
	fencedBody = `{"kind":"Status","apiVersion":"v1","status":"Failure",` +
		`"message":"configmaps \"w\" is forbidden: ValidatingAdmissionPolicy 'fence' with binding 'fence-7' denied request: ` +
		`fenced: partition 7 is claimed by \"r1\" epoch 2","reason":"Forbidden","details":{"name":"w","kind":"configmaps"},"code":403}`
	// Two policies: one could not be configured, the other refused.
	mixedBody = `{"kind":"Status","apiVersion":"v1","status":"Failure",` +
		`"message":"ValidatingAdmissionPolicy 'fence' with binding 'fence-7' denied request: failed to configure binding: x",` +
		`"reason":"Invalid","details":{"causes":[{"message":"ValidatingAdmissionPolicy 'fence' with binding 'fence-7' denied request: ` +
		`failed to configure binding: x"},{"message":"ValidatingAdmissionPolicy 'other' with binding 'other' denied request: no"}]},"code":422}`
	createdBody = `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"w","namespace":"ns"}}`
)

// server answers the first refusals of writes with body and code, then
// createdBody; it records the bodies it received.
type server struct {
	mu       sync.Mutex
	refusals int
	code     int
	body     string
	got      []string
	methods  []string
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.got = append(s.got, string(b))
	s.methods = append(s.methods, r.Method)
	refuse := s.refusals > 0
	if refuse {
		s.refusals--
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if refuse {
		w.WriteHeader(s.code)
		_, _ = io.WriteString(w, s.body)
		return
	}
	_, _ = io.WriteString(w, createdBody)
}

func (s *server) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

// client is a clientset whose transport is ours, with sleeps recorded
// instead of slept.
func client(t *testing.T, s *server) (*kubernetes.Clientset, *[]Retried, *[]time.Duration) {
	t.Helper()
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	var retried []Retried
	var slept []time.Duration
	var mu sync.Mutex
	cfg := &rest.Config{Host: srv.URL, QPS: -1}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &Transport{
			Next: rt,
			OnRetry: func(r Retried) {
				mu.Lock()
				defer mu.Unlock()
				retried = append(retried, r)
			},
			sleep: func(req *http.Request, d time.Duration) bool {
				mu.Lock()
				defer mu.Unlock()
				slept = append(slept, d)
				return req.Context().Err() == nil
			},
		}
	})
	return kubernetes.NewForConfigOrDie(cfg), &retried, &slept
}

func configMap() *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "w", Namespace: "ns"}}
}

func TestTransport_RetriesAnUnconfiguredPolicyWithTheSameBody(t *testing.T) {
	s := &server{refusals: 3, code: http.StatusUnprocessableEntity, body: unconfiguredBody}
	c, retried, slept := client(t, s)
	got, err := c.CoreV1().ConfigMaps("ns").Create(context.Background(), configMap(), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create after three unconfigured refusals: %v, want it created", err)
	}
	if got.Name != "w" {
		t.Fatalf("created %q, want w", got.Name)
	}
	reqs := s.requests()
	if len(reqs) != 4 {
		t.Fatalf("%d requests reached the server, want 4 (three retries)", len(reqs))
	}
	for k, b := range reqs {
		if b != reqs[0] || !strings.Contains(b, "ConfigMap") {
			t.Fatalf("request %d sent body %q, want the first's %q", k+1, b, reqs[0])
		}
	}
	if len(*retried) != 3 || (*retried)[0].Attempt != 1 || (*retried)[2].Attempt != 3 ||
		(*retried)[0].Method != http.MethodPost || !strings.Contains((*retried)[0].Message, "failed to configure binding") {
		t.Fatalf("retries reported %+v, want attempts 1..3 of the POST with the server's message", *retried)
	}
	want := []time.Duration{FirstBackoff, 2 * FirstBackoff, 4 * FirstBackoff}
	if len(*slept) != 3 || (*slept)[0] != want[0] || (*slept)[1] != want[1] || (*slept)[2] != want[2] {
		t.Fatalf("waited %v, want %v", *slept, want)
	}
}

// Every write verb is retried (admission runs before storage, so nothing
// was done); a DELETE's options travel again too.
func TestTransport_RetriesEveryWriteVerb(t *testing.T) {
	ctx := context.Background()
	for name, call := range map[string]func(*kubernetes.Clientset) error{
		"PUT": func(c *kubernetes.Clientset) error {
			_, err := c.CoreV1().ConfigMaps("ns").Update(ctx, configMap(), metav1.UpdateOptions{})
			return err
		},
		"PATCH": func(c *kubernetes.Clientset) error {
			_, err := c.CoreV1().ConfigMaps("ns").Patch(ctx, "w", "application/merge-patch+json", []byte(`{"data":{"a":"b"}}`), metav1.PatchOptions{})
			return err
		},
		"DELETE": func(c *kubernetes.Clientset) error {
			uid := types.UID("u-1")
			return c.CoreV1().ConfigMaps("ns").Delete(ctx, "w", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := &server{refusals: 1, code: http.StatusUnprocessableEntity, body: unconfiguredBody}
			c, retried, _ := client(t, s)
			if err := call(c); err != nil {
				t.Fatalf("%s after an unconfigured refusal: %v", name, err)
			}
			reqs := s.requests()
			if len(reqs) != 2 || reqs[1] != reqs[0] || len(*retried) != 1 || s.methods[1] != name {
				t.Fatalf("%s: requests %q (methods %v), retries %d; want the same %s twice, one retry", name, reqs, s.methods, len(*retried), name)
			}
			if name == "DELETE" && !strings.Contains(reqs[1], "u-1") {
				t.Fatalf("the retried DELETE sent %q, want its preconditions", reqs[1])
			}
		})
	}
}

// A refusal by a policy's validation is the server's answer: returned at
// once, body intact, as the error client-go decodes from it. So is one where
// another policy refused beside an unconfigured one.
func TestTransport_PassesOtherRefusalsThrough(t *testing.T) {
	for name, tc := range map[string]struct {
		code int
		body string
		want func(error) bool
		text string
	}{
		"fenced":   {http.StatusForbidden, fencedBody, apierrors.IsForbidden, "fenced: partition 7"},
		"mixed":    {http.StatusUnprocessableEntity, mixedBody, apierrors.IsInvalid, "failed to configure binding: x"},
		"not JSON": {http.StatusForbidden, "forbidden: no", apierrors.IsForbidden, ""},
		// Past what is read to classify: passed on whole, unclassified.
		"too large": {http.StatusUnprocessableEntity, strings.Replace(unconfiguredBody, "context deadline exceeded",
			strings.Repeat("x", maxStatusBody)+" the end", 1), apierrors.IsInvalid, "x the end"},
		"non-Status": {http.StatusUnprocessableEntity, `{"kind":"ConfigMap","message":"ValidatingAdmissionPolicy 'a' with binding 'b' denied request: failed to configure binding: x"}`,
			func(err error) bool { return err != nil }, ""},
	} {
		t.Run(name, func(t *testing.T) {
			s := &server{refusals: 1, code: tc.code, body: tc.body}
			c, retried, _ := client(t, s)
			_, err := c.CoreV1().ConfigMaps("ns").Create(context.Background(), configMap(), metav1.CreateOptions{})
			if !tc.want(err) || !strings.Contains(errString(err), tc.text) {
				t.Fatalf("create: %v, want the server's refusal (%q)", err, tc.text)
			}
			if n := len(s.requests()); n != 1 || len(*retried) != 0 {
				t.Fatalf("%d requests, %d retries; want 1 and none", n, len(*retried))
			}
		})
	}
}

// Reads are not admission's business: a GET answered with the same body is
// not retried.
func TestTransport_DoesNotRetryReads(t *testing.T) {
	s := &server{refusals: 1, code: http.StatusUnprocessableEntity, body: unconfiguredBody}
	c, retried, _ := client(t, s)
	if _, err := c.CoreV1().ConfigMaps("ns").Get(context.Background(), "w", metav1.GetOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("get: %v, want the refusal as sent", err)
	}
	if len(s.requests()) != 1 || len(*retried) != 0 {
		t.Fatalf("%d requests, %d retries; want 1, none", len(s.requests()), len(*retried))
	}
}

// The retries end with the request's deadline: the last refusal is
// returned, as the server sent it, once no retry fits before it.
func TestTransport_StopsAtTheDeadline(t *testing.T) {
	s := &server{refusals: 1 << 30, code: http.StatusUnprocessableEntity, body: unconfiguredBody}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	cfg := &rest.Config{Host: srv.URL, QPS: -1}
	Wrap(cfg, nil) // real sleeps
	c := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.CoreV1().ConfigMaps("ns").Create(ctx, configMap(), metav1.CreateOptions{})
	took := time.Since(start)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "failed to configure binding") {
		t.Fatalf("create past its deadline: %v, want the last refusal", err)
	}
	if n := len(s.requests()); n < 2 {
		t.Fatalf("%d requests before the deadline, want retries", n)
	}
	if took > 2*time.Second {
		t.Fatalf("returned after %v with a 300ms deadline", took)
	}
}

// Without a deadline, MaxElapsed bounds the retries (a GC write, say).
func TestTransport_BoundedWithoutADeadline(t *testing.T) {
	s := &server{refusals: 1 << 30, code: http.StatusUnprocessableEntity, body: unconfiguredBody}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	cfg := &rest.Config{Host: srv.URL, QPS: -1}
	retries := 0
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &Transport{Next: rt, OnRetry: func(Retried) { retries++ }, maxElapsed: 400 * time.Millisecond}
	})
	start := time.Now()
	_, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().ConfigMaps("ns").Create(context.Background(), configMap(), metav1.CreateOptions{})
	took := time.Since(start)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "failed to configure binding") {
		t.Fatalf("create: %v, want the last refusal once the bound is spent", err)
	}
	// Backoffs of 20+40+80 ms fit in 400 ms, and 160 more unless the
	// requests themselves took 100 ms; the next 320 never does.
	if retries < 3 || retries > 4 || len(s.requests()) != retries+1 {
		t.Fatalf("%d retries, %d requests; want 3 or 4 retries, one request more", retries, len(s.requests()))
	}
	if took > 2*time.Second {
		t.Fatalf("took %v with a 400ms bound", took)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
