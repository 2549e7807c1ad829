//go:build integration

package ipam_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

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
	requestsPerCNICall(t, routedCNIServer(t, e.ipam), ref, wire.expect(t))
}

func TestIPAM_RequestsFixedIPCNICalls(t *testing.T) {
	e, wire := newCountedEnv(t, "rf")
	sts := e.createStatefulSet("db", 1)
	p := e.createStsPod(sts, 0, e.nodes[0], "", "sandbox-1")
	ref := e.cachedPodRef(p)
	requestsFixedIPCNICalls(t, routedCNIServer(t, e.ipam), ref, wire.expect(t))
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
	ns   string
	mu   sync.Mutex
	seen []string
}

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		l.record(req)
		return rt.RoundTrip(req)
	})
}

func (l *requestLog) record(req *http.Request) {
	_, rest, ok := strings.Cut(req.URL.Path, "/namespaces/"+l.ns+"/")
	if !ok {
		return
	}
	resource, name, _ := strings.Cut(rest, "/")
	if resource != "pods" && resource != "workloadendpoints" {
		return
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
	l.mu.Lock()
	l.seen = append(l.seen, verb+" "+resource)
	l.mu.Unlock()
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
