//go:build integration

package spread_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"

	"github.com/cce-ipam/sharded/e2e/cluster"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/spread"
)

var cp *cluster.Cluster

// The garbage collector of kube-controller-manager deletes a table's PSTS
// objects with it.
func TestMain(m *testing.M) {
	os.Exit(cluster.RunTests(m, cluster.Options{ControllerManager: true}, &cp))
}

var (
	crdOnce sync.Once
	crdErr  error
)

// env is one test's namespace, clients and running spread controller.
type env struct {
	t    *testing.T
	ctx  context.Context
	ns   string
	kube kubernetes.Interface
	cce  versioned.Interface
	reg  *prometheus.Registry
}

// waitTimeout only stops a test whose controller never converges; the
// tests assert what happens, not how fast.
const waitTimeout = 90 * time.Second

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	crdOnce.Do(func() { crdErr = cp.InstallCRDs(ctx, filepath.Join("..", "..", "charts", "cce-ipam", "crds")) })
	if crdErr != nil {
		t.Fatal(crdErr)
	}
	return &env{
		t: t, ctx: ctx, ns: cp.Namespace(t),
		kube: kubernetes.NewForConfigOrDie(cp.Config),
		cce:  versioned.NewForConfigOrDie(cp.Config),
		reg:  prometheus.NewRegistry(),
	}
}

// start runs the spread controllers until the test ends and checks that
// Run returns nil once stopped.
func (e *env) start(cfg spread.Config) {
	e.t.Helper()
	stop := e.run(e.controller(cfg))
	e.t.Cleanup(func() {
		if err := stop(); err != nil {
			e.t.Errorf("Run returned %v", err)
		}
	})
}

func (e *env) controller(cfg spread.Config) *spread.Controller {
	e.t.Helper()
	c, err := spread.New(cfg, spread.Deps{Kube: e.kube, CCE: e.cce, Metadata: metadata.NewForConfigOrDie(cp.Config)},
		testLogger(e.t), e.reg)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// run runs c until the returned stop is called; stop returns what Run did.
func (e *env) run(c *spread.Controller) (stop func() error) {
	runCtx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	return func() error {
		cancel()
		return <-done
	}
}

// eventually polls cond until it holds; the last description is the
// failure message.
func (e *env) eventually(what string, cond func() (bool, string)) {
	e.t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, waitTimeout, true, func(context.Context) (bool, error) {
		ok, desc := cond()
		last = desc
		return ok, nil
	})
	if err != nil {
		e.t.Fatalf("%s: never happened; last: %s", what, last)
	}
}

// subnet creates a Subnet resource in the shared namespace; its ID carries
// the test's namespace, so tests do not share subnets.
func (e *env) subnet(suffix, cidr string, mod func(*cce.Subnet)) string {
	e.t.Helper()
	id := "sbn-" + e.ns + "-" + suffix
	s := &cce.Subnet{
		ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: cce.SubnetNamespace},
		Spec:       cce.SubnetSpec{ID: id, Name: suffix, AvailabilityZone: "zone-a", CIDR: cidr},
		Status:     cce.SubnetStatus{Enable: true, AvailableIPNum: 200},
	}
	if mod != nil {
		mod(s)
	}
	if _, err := e.cce.CceV1alpha1().Subnets(cce.SubnetNamespace).Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = e.cce.CceV1alpha1().Subnets(cce.SubnetNamespace).Delete(context.Background(), id, metav1.DeleteOptions{})
	})
	return id
}

func (e *env) updateSubnet(id string, mod func(*cce.Subnet)) {
	e.t.Helper()
	client := e.cce.CceV1alpha1().Subnets(cce.SubnetNamespace)
	s, err := client.Get(e.ctx, id, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	mod(s)
	if _, err := client.Update(e.ctx, s, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) createSpread(p *cce.PodSubnetTopologySpread) {
	e.t.Helper()
	p.Namespace = e.ns
	if _, err := e.cce.CceV1alpha1().PodSubnetTopologySpreads(e.ns).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) getSpread(name string) (*cce.PodSubnetTopologySpread, error) {
	return e.cce.CceV1alpha1().PodSubnetTopologySpreads(e.ns).Get(e.ctx, name, metav1.GetOptions{})
}

// status polls the PSTS's status until check passes; check describes what
// it sees when it does not.
func (e *env) status(name, what string, check func(cce.PodSubnetTopologySpreadStatus) string) cce.PodSubnetTopologySpreadStatus {
	e.t.Helper()
	var st cce.PodSubnetTopologySpreadStatus
	e.eventually(what, func() (bool, string) {
		p, err := e.getSpread(name)
		if err != nil {
			return false, err.Error()
		}
		st = p.Status
		if msg := check(st); msg != "" {
			return false, fmt.Sprintf("%s in %+v", msg, st)
		}
		return true, ""
	})
	return st
}

func (e *env) wep(name, psts, subnetID, ip string) *cce.WorkloadEndpoint {
	e.t.Helper()
	w := &cce.WorkloadEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: cce.WorkloadEndpointSpec{
			IP: ip, SubnetID: subnetID, SubnetTopologyReference: psts, Phase: cce.WorkloadEndpointPhasePodRunning,
			Type: cce.WorkloadEndpointTypePod, Node: "node-1",
		},
	}
	w, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Create(e.ctx, w, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return w
}

func (e *env) updateWEP(name string, mod func(*cce.WorkloadEndpoint)) {
	e.t.Helper()
	client := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns)
	w, err := client.Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	mod(w)
	if _, err := client.Update(e.ctx, w, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) deleteWEP(name string) {
	e.t.Helper()
	if err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// pod creates a pod (never scheduled: there are no nodes), annotated with
// psts unless it is "".
func (e *env) pod(name, psts string) {
	e.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns, Labels: map[string]string{"app": "x"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
	}
	if psts != "" {
		p.Annotations = map[string]string{cce.AnnotationPodSubnetTopologySpread: psts}
	}
	if _, err := e.kube.CoreV1().Pods(e.ns).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// events are the messages of the events of reason about the object named
// name in namespace ns.
func (e *env) events(ns, name, reason string) []string {
	list, err := e.kube.CoreV1().Events(ns).List(e.ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.name": name, "reason": reason}.String(),
	})
	if err != nil {
		return []string{"list events: " + err.Error()}
	}
	var out []string
	for _, ev := range list.Items {
		out = append(out, ev.Message)
	}
	return out
}

// eventContaining waits for an event of reason about name whose message
// contains part.
func (e *env) eventContaining(ns, name, reason, part string) {
	e.t.Helper()
	e.eventually(fmt.Sprintf("event %s on %s", reason, name), func() (bool, string) {
		msgs := e.events(ns, name, reason)
		for _, m := range msgs {
			if strings.Contains(m, part) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("events %q", msgs)
	})
}

func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

// testLogger writes the controllers' logs to the test's log, shown when it
// fails.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
