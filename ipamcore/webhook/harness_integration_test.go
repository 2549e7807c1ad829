//go:build integration

package webhook_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/e2e/cluster"
	"github.com/cce-ipam/sharded/e2e/freeport"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/webhook"
)

var cp *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.RunTests(m, cluster.Options{}, &cp))
}

var crdsOnce = sync.OnceValue(func() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return cp.InstallCRDs(ctx, filepath.Join("..", "..", "charts", "cce-ipam", "crds"))
})

// env is one test's world: bce-sim with two zones' subnets, a namespace for
// the replicas' Secret, a namespace for the pods and PSTS (the only one the
// test's webhook configurations select), and the configurations' names.
type env struct {
	t          *testing.T
	ctx        context.Context
	kube       kubernetes.Interface
	cce        versioned.Interface
	sim        *bcesim.Server
	provider   *cloud.Client
	replicaNS  string
	appNS      string
	configName string
	// Subnets in bce-sim: a (zone cn-bj-a, 10.60.x), b (cn-bj-b, 10.61.x).
	subnetA, subnetB string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	if err := crdsOnce(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	e := &env{t: t, ctx: ctx, kube: kubernetes.NewForConfigOrDie(cp.Config), cce: versioned.NewForConfigOrDie(cp.Config)}
	e.replicaNS, e.appNS = cp.Namespace(t), cp.Namespace(t)
	e.configName = e.appNS // unique, and names what it selects
	ns, err := e.kube.CoreV1().Namespaces().Get(ctx, e.appNS, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels["webhook-test"] = e.appNS
	if _, err := e.kube.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	e.sim, err = bcesim.New(bcesim.Config{Credentials: map[string]string{"ak": "sk"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.sim.Close() })
	// Subnet IDs are unique per test: Subnet resources are shared by the
	// package's control plane.
	id := strings.TrimPrefix(e.appNS, "test")
	e.subnetA = e.addSubnet("sbn-a"+id, "cn-bj-a", "10.60.0.0/24")
	e.subnetB = e.addSubnet("sbn-b"+id, "cn-bj-b", "10.61.0.0/24")
	cfg := cloud.DefaultConfig()
	cfg.OpLimits = nil
	cfg.Endpoint, cfg.AccessKeyID, cfg.SecretAccessKey = e.sim.URL(), "ak", "sk"
	cfg.Rate, cfg.Burst = 1000, 1000
	cfg.SDKRetries = 0 // an injected outage answers at once
	if e.provider, err = cloud.New(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.provider.Close)
	return e
}

func (e *env) addSubnet(id, zone, cidr string) string {
	e.t.Helper()
	got, err := e.sim.AddSubnet(bcesim.SubnetSpec{ID: id, ZoneName: zone, CIDR: cidr, VPCID: "vpc-w"})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = e.cce.CceV1alpha1().Subnets(cce.SubnetNamespace).Delete(context.Background(), got, metav1.DeleteOptions{})
	})
	return got
}

// replica is one webhook server, as one cce-ipam replica runs it.
type replica struct {
	addr string
	reg  *prometheus.Registry
	stop func() error
}

// startReplica runs a webhook server on a free port (the configuration
// edited by edit), stopped when the test ends.
func (e *env) startReplica(name string, edit func(*webhook.Config)) *replica {
	e.t.Helper()
	cfg := webhook.DefaultConfig()
	cfg.Enabled, cfg.Namespace = true, e.replicaNS
	cfg.Listen = freeport.Addr(e.t)
	cfg.ExtraIPs = []net.IP{net.ParseIP("127.0.0.1")}
	cfg.MutatingConfigName, cfg.ValidatingConfigName = e.configName, e.configName
	if edit != nil {
		edit(&cfg)
	}
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(e.t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})).With("replica", name)
	srv, err := webhook.New(cfg, webhook.Deps{Kube: e.kube, CCE: e.cce, Cloud: e.provider}, log, reg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	var once sync.Once
	var runErr error
	r := &replica{addr: cfg.Listen, reg: reg, stop: func() error {
		once.Do(func() {
			cancel()
			runErr = <-done
		})
		return runErr
	}}
	e.t.Cleanup(func() {
		if err := r.stop(); err != nil {
			e.t.Errorf("replica %s: Run: %v", name, err)
		}
	})
	return r
}

// register creates the two webhook configurations, calling url (the
// API server runs on 127.0.0.1 like the replicas, so a URL stands in for
// the chart's Service), with the chart's policies, selecting the test's
// namespace only, and without a caBundle: the replicas patch it.
func (e *env) register(url string) {
	e.t.Helper()
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"webhook-test": e.appNS}}
	none, noneOnDryRun := admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.SideEffectClassNoneOnDryRun
	ignore, fail := admissionregistrationv1.Ignore, admissionregistrationv1.Fail
	ifNeeded := admissionregistrationv1.IfNeededReinvocationPolicy
	mutate, validate := url+webhook.PathMutatePods, url+webhook.PathValidatePSTS
	_, err := e.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(e.ctx, &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: e.configName},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:         "pods.webhook.cce.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &mutate},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			FailurePolicy: &ignore, SideEffects: &none, TimeoutSeconds: new(int32(2)), ReinvocationPolicy: &ifNeeded,
			AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: sel,
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	_, err = e.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(e.ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: e.configName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "psts.webhook.cce.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &validate},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{"cce.io"}, APIVersions: []string{"v1alpha1"},
					Resources: []string{"podsubnettopologyspreads"}},
			}},
			FailurePolicy: &fail, SideEffects: &noneOnDryRun, TimeoutSeconds: new(int32(10)),
			AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: sel,
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx := context.Background()
		_ = e.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, e.configName, metav1.DeleteOptions{})
		_ = e.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, e.configName, metav1.DeleteOptions{})
	})
}

// waitServing waits until the API server calls the webhooks with the
// patched caBundle: a dry-run PSTS without subnets is refused by the
// webhook itself (not "failed calling webhook").
func (e *env) waitServing() {
	e.t.Helper()
	eventually(e.t, e.ctx, "the API server reaches the PSTS webhook", func() error {
		_, err := e.createPSTS(e.psts("probe", nil, nil), true)
		if err != nil && strings.Contains(err.Error(), "spec.subnets is empty") {
			return nil
		}
		return fmt.Errorf("dry-run of a PSTS without subnets: %w", err)
	})
}

func (e *env) psts(name string, match map[string]string, subnets map[string]cce.SubnetAllocation) *cce.PodSubnetTopologySpread {
	return &cce.PodSubnetTopologySpread{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.appNS},
		Spec:       cce.PodSubnetTopologySpreadSpec{Subnets: subnets, Selector: &metav1.LabelSelector{MatchLabels: match}},
	}
}

func (e *env) createPSTS(p *cce.PodSubnetTopologySpread, dryRun bool) (*cce.PodSubnetTopologySpread, error) {
	opts := metav1.CreateOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return e.cce.CceV1alpha1().PodSubnetTopologySpreads(e.appNS).Create(e.ctx, p, opts)
}

func (e *env) pod(name string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.appNS, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
	}
}

func (e *env) createPod(p *corev1.Pod, dryRun bool) (*corev1.Pod, error) {
	opts := metav1.CreateOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return e.kube.CoreV1().Pods(e.appNS).Create(e.ctx, p, opts)
}

func (e *env) secret() *corev1.Secret {
	e.t.Helper()
	s, err := e.kube.CoreV1().Secrets(e.replicaNS).Get(e.ctx, "cce-ipam-webhook-certs", metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// servedCert is the certificate a server presents (not verified: read to
// see which one it serves).
func servedCert(addr string) (*x509.Certificate, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr,
		&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only reads the presented certificate
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// eventually polls cond every 100ms until it returns nil, failing the test
// with the last error when ctx ends.
func eventually(t *testing.T, ctx context.Context, what string, cond func() error) {
	t.Helper()
	for {
		err := cond()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v (last: %v)", what, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// balancer spreads TCP connections over backends round robin, as the
// chart's Service spreads the API server's calls over the replicas.
type balancer struct {
	ln       net.Listener
	backends []string
	mu       sync.Mutex
	next     int
	closed   bool
	conns    map[net.Conn]bool
	wg       sync.WaitGroup
}

func startBalancer(t *testing.T, backends ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &balancer{ln: ln, backends: backends, conns: map[net.Conn]bool{}}
	b.wg.Go(b.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		b.mu.Lock()
		b.closed = true
		for c := range b.conns {
			_ = c.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	})
	return ln.Addr().String()
}

func (b *balancer) accept() {
	for {
		in, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.mu.Lock()
		backend := b.backends[b.next%len(b.backends)]
		b.next++
		b.mu.Unlock()
		out, err := net.DialTimeout("tcp", backend, 2*time.Second)
		if err != nil {
			_ = in.Close()
			continue
		}
		if !b.track(in, out) {
			return
		}
		b.wg.Go(func() { b.pipe(in, out) })
		b.wg.Go(func() { b.pipe(out, in) })
	}
}

// track records the pair; false (and the pair closed) when the balancer
// is closing.
func (b *balancer) track(conns ...net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range conns {
		if b.closed {
			_ = c.Close()
		} else {
			b.conns[c] = true
		}
	}
	return !b.closed
}

func (b *balancer) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	b.mu.Lock()
	delete(b.conns, dst)
	delete(b.conns, src)
	b.mu.Unlock()
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
