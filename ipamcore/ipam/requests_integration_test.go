//go:build integration

package ipam_test

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/podip"
)

// The request lists of the fast tests (requests_test.go), counted on the wire
// to a real API server: a counting RoundTripper under the IPAM's clientsets
// records every request for a pod or wep of the test's namespace.
func TestIPAM_RequestsPerCNICall(t *testing.T) {
	e, wire := newCountedEnv(t, "rq")
	p := e.createPods("web", 1)[0]
	ref := e.cachedPodRef(p)
	requestsPerCNICall(t, routedCNIServer(t, e.ipam), e.ipam, ref, wire.expect(t))
}

func TestIPAM_RequestsFixedIPCNICalls(t *testing.T) {
	e, wire := newCountedEnv(t, "rf")
	sts := e.createStatefulSet("db", 1)
	p := e.createStsPod(sts, 0, e.nodes[0], "", "sandbox-1")
	ref := e.cachedPodRef(p)
	requestsFixedIPCNICalls(t, routedCNIServer(t, e.ipam), e.ipam, ref, wire.expect(t))
}

// newCountedEnv is one node whose IPAM talks to the API server through a
// request log, with a warm pool and the periodic loops (GC, ENI sync) too
// far apart to run during the test.
func newCountedEnv(t *testing.T, prefix string) (*env, *requestLog) {
	e := newEnv(t, prefix, 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 2
		c.IdleMax = 4
		c.PoolCheckPeriod = time.Hour
		c.ENISyncPeriod = time.Hour
		c.GCPeriod = time.Hour
	}))
	wire := &requestLog{ns: e.ns}
	cfg := rest.CopyConfig(cp.Config)
	cfg.Wrap(wire.wrap)
	e.kube = kubernetes.NewForConfigOrDie(cfg)
	e.cce = versioned.NewForConfigOrDie(cfg)
	e.restart()
	eventually(t, 10*time.Second, "a warm pool", func() bool {
		st := e.stats(e.nodes[0])
		return st.Idle-st.Cooling >= 2
	})
	return e, wire
}

// cachedPodRef waits until the node's pod watch has the pod, as it has by
// the time kubelet sends the ADD of a pod bound a moment before.
func (e *env) cachedPodRef(p podRef) podip.PodRef {
	e.t.Helper()
	eventually(e.t, 10*time.Second, "the pod watch to see "+p.name, func() bool {
		_, ok := e.ipam.PodFromCache(p.node, e.ns, p.name)
		return ok
	})
	return podip.PodRef{
		Namespace:   e.ns,
		Name:        p.name,
		ContainerID: p.containerID,
		Node:        p.node,
	}
}

// requestLog records the requests for pods and weps of one namespace as
// "verb resource", the verbs named as client-go's fake clientsets name them.
type requestLog struct {
	ns        string
	mu        sync.Mutex
	seen      []string
	throttle  map[string]bool // request kinds answered 429 once more
	throttled int
	// intercept, when set, sees every logged request before it is sent:
	// it may block it, or answer it (a non-nil response is not sent on).
	intercept func(kind string, req *http.Request) *http.Response
}

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		throttle, kind := l.record(req)
		if throttle {
			return tooManyRequests(req), nil
		}
		l.mu.Lock()
		intercept := l.intercept
		l.mu.Unlock()
		if intercept != nil && kind != "" {
			if resp := intercept(kind, req); resp != nil {
				return resp, nil
			}
		}
		return rt.RoundTrip(req)
	})
}

// throttleOnce answers the next request of each kind ("verb resource") 429.
func (l *requestLog) throttleOnce(kinds ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.throttle = map[string]bool{}
	for _, k := range kinds {
		l.throttle[k] = true
	}
}

func (l *requestLog) throttledCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.throttled
}

// tooManyRequests is the API server's answer when Priority and Fairness
// rejects a request: 429, a Status body and Retry-After (seconds).
func tooManyRequests(req *http.Request) *http.Response {
	body := `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Too many requests, please try again later.","reason":"TooManyRequests","code":429}`
	return &http.Response{
		StatusCode: http.StatusTooManyRequests, Status: "429 Too Many Requests", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Retry-After": {"1"}, "Content-Type": {"application/json"}},
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
	}
}

// setIntercept sets (nil: clears) the hook every logged request passes.
func (l *requestLog) setIntercept(f func(kind string, req *http.Request) *http.Response) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.intercept = f
}

// record logs the request and reports whether to answer it 429, and its
// kind ("" for a request it does not log).
func (l *requestLog) record(req *http.Request) (bool, string) {
	_, rest, ok := strings.Cut(req.URL.Path, "/namespaces/"+l.ns+"/")
	if !ok {
		return false, ""
	}
	resource, name, _ := strings.Cut(rest, "/")
	if resource != "pods" && resource != "workloadendpoints" {
		return false, ""
	}
	verb := map[string]string{
		http.MethodGet:    "get",
		http.MethodPost:   "create",
		http.MethodPut:    "update",
		http.MethodPatch:  "patch",
		http.MethodDelete: "delete",
	}[req.Method]
	if req.Method == http.MethodGet && (name == "" || req.URL.Query().Get("watch") == "true") {
		verb = "list"
		if req.URL.Query().Get("watch") == "true" {
			verb = "watch"
		}
	}
	kind := verb + " " + resource
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = append(l.seen, kind)
	if l.throttle[kind] {
		delete(l.throttle, kind)
		l.throttled++
		return true, kind
	}
	return false, kind
}

func (l *requestLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.seen)
}

// expect checks each call's requests: those logged while it ran.
func (l *requestLog) expect(t *testing.T) expectFunc {
	return func(what string, want []string, call func()) {
		t.Helper()
		before := l.count()
		call()
		l.mu.Lock()
		got := append([]string(nil), l.seen[before:]...)
		l.mu.Unlock()
		checkRequests(t, what, got, want)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// The fallbacks of the known wep (known.go), on the wire: each write made
// from what the replica knows carries the resourceVersion it last wrote, so
// a wep changed or deleted behind its back is read instead, and the call
// still does the right thing.

// A wep changed by someone else since the ADD (an operator's label): the
// DEL's delete is refused with Conflict, the DEL reads the wep and deletes it
// as without a known wep, and the IP goes back to the pool.
func TestIPAM_Requests_DELAfterExternalChangeReadsTheWEP(t *testing.T) {
	e, wire := newCountedEnv(t, "rx")
	ref := e.cachedPodRef(e.createPods("web", 1)[0])
	srv := routedCNIServer(t, e.ipam)
	expect := wire.expect(t)
	expect("warm ADD", []string{"create workloadendpoints"}, func() { cniAdd(t, srv, ref) })
	external := versioned.NewForConfigOrDie(cp.Config) // not counted: someone else
	labelWEP(t, e, external, ref.Name)
	assigned := e.stats(ref.Node).Assigned
	expect("DEL of a wep changed since", []string{
		"delete workloadendpoints", // Conflict: the wep changed since our write
		"get workloadendpoints",    // Release: the read path
		"update workloadendpoints", // deleteWEP: drop the finalizer, stamp
		"delete workloadendpoints", // deleteWEP
	}, func() { cniDel(t, srv, e.ipam, ref) })
	if _, err := external.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, ref.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the wep is still there after the DEL: %v", err)
	}
	if got := e.stats(ref.Node).Assigned; got != assigned-1 {
		t.Errorf("%d IPs assigned after the DEL, want %d: the IP was not freed", got, assigned-1)
	}
}

// A wep deleted behind the replica's back (its finalizer removed by hand):
// the DEL's delete answers NotFound, the read confirms it, and the DEL answers
// that nothing was held (as a DEL of an unknown wep did before). A new
// sandbox of a pod whose known wep changed since replaces it after a read.
func TestIPAM_Requests_StaleKnownWEPFallsBackToReads(t *testing.T) {
	e, wire := newCountedEnv(t, "rs")
	pods := e.createPods("web", 2)
	gone, moved := e.cachedPodRef(pods[0]), e.cachedPodRef(pods[1])
	srv := routedCNIServer(t, e.ipam)
	expect := wire.expect(t)
	cniAdd(t, srv, gone)
	cniAdd(t, srv, moved)
	external := versioned.NewForConfigOrDie(cp.Config)

	w, err := external.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, gone.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.Finalizers = nil
	if _, err := external.CceV1alpha1().WorkloadEndpoints(e.ns).Update(e.ctx, w, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := external.CceV1alpha1().WorkloadEndpoints(e.ns).Delete(e.ctx, gone.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("DEL of a wep deleted since", []string{
		"delete workloadendpoints", // NotFound
		"get workloadendpoints",    // the read path: NotFound
	}, func() { cniDel(t, srv, e.ipam, gone) })

	labelWEP(t, e, external, moved.Name)
	next := moved
	next.ContainerID += "-next"
	expect("ADD of a new sandbox over a wep changed since", []string{
		"update workloadendpoints", // Conflict
		"create workloadendpoints", // AlreadyExists
		"get workloadendpoints",
		"update workloadendpoints",
	}, func() { cniAdd(t, srv, next) })
	w, err = external.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, moved.Name, metav1.GetOptions{})
	if err != nil || w.Spec.ContainerID != next.ContainerID || w.Labels["operator"] != "" {
		t.Fatalf("the wep after the new sandbox's ADD: %v, %+v; want it to name %s (labels replaced)", err, w, next.ContainerID)
	}
	expect("DEL of the new sandbox", []string{"delete workloadendpoints", "patch workloadendpoints"},
		func() { cniDel(t, srv, e.ipam, next) })
}

// labelWEP changes the wep as an operator would, moving its resourceVersion.
func labelWEP(t *testing.T, e *env, c versioned.Interface, name string) {
	t.Helper()
	w, err := c.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if w.Labels == nil {
		w.Labels = map[string]string{}
	}
	w.Labels["operator"] = "was-here"
	if _, err := c.CceV1alpha1().WorkloadEndpoints(e.ns).Update(e.ctx, w, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A 429 with Retry-After (what API Priority and Fairness answers when a
// level's queues are full) on the commit's create and on both of the DEL's
// writes (the delete in the call, the finalizer's patch after it): they wait
// the Retry-After and succeed (client-go's rest client retries a
// 429 with Retry-After, whatever the verb, within the call's context), so
// the CNI call does not fail. The 429s are injected on the wire in front of
// the real API server, once per request kind.
func TestIPAM_Requests_ThrottledWritesRetriedNotFailed(t *testing.T) {
	e, wire := newCountedEnv(t, "rt")
	wire.throttleOnce("create workloadendpoints", "delete workloadendpoints", "patch workloadendpoints")
	ref := e.cachedPodRef(e.createPods("web", 1)[0])
	srv := routedCNIServer(t, e.ipam)
	expect := wire.expect(t)
	expect("warm ADD, throttled once", []string{"create workloadendpoints", "create workloadendpoints"},
		func() { cniAdd(t, srv, ref) })
	expect("DEL, throttled once", []string{"delete workloadendpoints", "delete workloadendpoints",
		"patch workloadendpoints", "patch workloadendpoints"},
		func() { cniDel(t, srv, e.ipam, ref) })
	if got := wire.throttledCount(); got != 3 {
		t.Errorf("%d requests answered 429, want 3", got)
	}
	if _, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, ref.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("wep after the throttled DEL: err %v, want it gone", err)
	}
}
