//go:build integration

package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/kubeletsim"
	"github.com/cce-ipam/sharded/shard"
)

// ipamctl without --server goes through the API server's service proxy to
// the peers Service, as `kubectl ipam` does. The replicas run in network
// namespaces (fleet Options.NetNS) because the API server proxies only to
// endpoint addresses an EndpointSlice may hold, and loopback ones are
// refused by its validation ("may not be in the loopback range").
func TestThroughAPIServer(t *testing.T) {
	f := fleet.Start(t, fleet.Options{Name: "ctl", Replicas: 3, Nodes: 4, NetNS: true})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	holders, err := f.Settle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The defaults: namespace kube-system, Service cce-ipam-peers (a release
	// named cce-ipam).
	servePeers(t, ctx, f, "kube-system", defaultService)
	bin := filepath.Join(f.Options().BinDir, "ipamctl")
	admin := f.Kubeconfig

	t.Run("members and node", func(t *testing.T) {
		out, err := ipamctl(ctx, bin, admin, "-o", "json", "members")
		if err != nil {
			t.Fatalf("ipamctl members: %v\n%s", err, out)
		}
		var st shard.Status
		if err := json.Unmarshal(out, &st); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if got := liveMembers(st); got != 3 {
			t.Errorf("members through the API server: %d live, want 3: %+v", got, st.Members)
		}
		for _, node := range f.Nodes() {
			out, err := ipamctl(ctx, bin, admin, "-o", "json", "node", node)
			if err != nil {
				t.Fatalf("ipamctl node %s: %v\n%s", node, err, out)
			}
			var ns shard.NodeStatus
			if err := json.Unmarshal(out, &ns); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if ns.Holder != holders[node] || ns.AnsweredBy != holders[node] || ns.Pool == nil {
				t.Errorf("node %s: holder %q answered by %q (pool %v), want its owner %q to answer with its pool",
					node, ns.Holder, ns.AnsweredBy, ns.Pool, holders[node])
			}
		}
	})

	t.Run("as kubectl plugin", func(t *testing.T) {
		plugin := filepath.Join(t.TempDir(), "kubectl-ipam")
		if err := os.Symlink(bin, plugin); err != nil {
			t.Fatal(err)
		}
		out, err := ipamctl(ctx, plugin, admin, "ring", "--namespace", "kube-system", "--service", defaultService)
		if err != nil || !strings.Contains(string(out), "RING PARTITIONS") || strings.Count(string(out), "ctl-r") != 3 {
			t.Errorf("kubectl-ipam ring: %v\n%s", err, out)
		}
		out, _ = exec.CommandContext(ctx, plugin, "--help").CombinedOutput()
		if !strings.HasPrefix(string(out), "usage: kubectl ipam [flags]") {
			t.Errorf("kubectl-ipam --help does not name itself kubectl ipam:\n%s", out)
		}
		out, err = ipamctl(ctx, plugin, admin, "members", "--service", "nope")
		if err == nil || !strings.HasPrefix(string(out), "kubectl ipam: ") || !strings.Contains(string(out), `no replica behind the Service (503): no endpoints available for service "nope"`) {
			t.Errorf("an unknown Service: %v\n%s", err, out)
		}
	})

	t.Run("no endpoints", func(t *testing.T) {
		kube := f.Kube
		_, err := kube.CoreV1().Services("kube-system").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "empty-peers"},
			Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone,
				Ports: []corev1.ServicePort{{Name: "metrics", Port: 9998, TargetPort: intstr.FromString("metrics")}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out, err := ipamctl(ctx, bin, admin, "status", "--service", "empty-peers")
		if err == nil || !strings.Contains(string(out), "no replica behind the Service (503)") {
			t.Errorf("a Service without endpoints: %v\n%s", err, out)
		}
	})

	t.Run("RBAC verbs on services/proxy", func(t *testing.T) {
		// The API server authorizes a proxied request with the HTTP verb's
		// RBAC verb (GET: get, POST: create) on services/proxy, and names
		// the resource "<scheme>:<service>:<port>" as the path does, so
		// resourceNames must list that form: the bare Service name does not
		// match (proxy-bare below).
		none := kubeconfigFor(t, ctx, f, "no-proxy", nil)
		out, err := ipamctl(ctx, bin, none, "members")
		if err == nil || !strings.Contains(string(out), "forbidden by the API server (403)") ||
			!strings.Contains(string(out), "services/proxy") {
			t.Errorf("a user without services/proxy: %v\n%s", err, out)
		}
		proxyName := "http:" + defaultService + ":metrics"
		get := kubeconfigFor(t, ctx, f, "proxy-get", &rbacv1.PolicyRule{APIGroups: []string{""},
			Resources: []string{"services/proxy"}, Verbs: []string{"get"}, ResourceNames: []string{proxyName}})
		if out, err := ipamctl(ctx, bin, get, "check", "--replicas", "3"); err != nil ||
			!strings.HasPrefix(string(out), "ok: 3 members, 271 partitions held") {
			t.Errorf("get on services/proxy %s: %v\n%s", proxyName, err, out)
		}
		if err := post(ctx, t, get); err == nil || !strings.Contains(err.Error(), "403") ||
			!strings.Contains(err.Error(), `cannot create resource "services/proxy"`) {
			t.Errorf("POST with get only: %v; want a 403 naming create", err)
		}
		create := kubeconfigFor(t, ctx, f, "proxy-create", &rbacv1.PolicyRule{APIGroups: []string{""},
			Resources: []string{"services/proxy"}, Verbs: []string{"create"}, ResourceNames: []string{proxyName}})
		if err := post(ctx, t, create); err != nil && strings.Contains(err.Error(), "forbidden by the API server") {
			t.Errorf("POST with create: %v", err)
		}
		if out, err := ipamctl(ctx, bin, create, "members"); err == nil || !strings.Contains(string(out), `cannot get resource "services/proxy"`) {
			t.Errorf("GET with create only: %v\n%s", err, out)
		}
		bare := kubeconfigFor(t, ctx, f, "proxy-bare", &rbacv1.PolicyRule{APIGroups: []string{""},
			Resources: []string{"services/proxy"}, Verbs: []string{"get"}, ResourceNames: []string{defaultService}})
		if out, err := ipamctl(ctx, bin, bare, "members"); err == nil ||
			!strings.Contains(string(out), `services "http:`+defaultService+`:metrics" is forbidden`) {
			t.Errorf("resourceNames [%s] (the bare Service name): %v\n%s; want a 403 naming http:%[1]s:metrics", defaultService, err, out)
		}
	})

	t.Run("signed POST through the proxy", func(t *testing.T) {
		// ipamctl release (a signed POST, cmd/ipamctl/admin.go) passes the
		// proxy with its path, body and signature header intact: the replica
		// verifies the signature and answers for the pod (a 401 would be a
		// signature lost or broken on the way).
		kc := kubeconfigFor(t, ctx, f, "proxy-admin", &rbacv1.PolicyRule{APIGroups: []string{""},
			Resources: []string{"services/proxy"}, Verbs: []string{"get", "create"},
			ResourceNames: []string{"http:" + defaultService + ":metrics"}})
		out, err := ipamctl(ctx, bin, kc, "release", "kube-system/no-such-pod", "--forward-key-file", f.ForwardKeyFile())
		if err == nil || !strings.Contains(string(out), "404 Not Found: pod kube-system/no-such-pod holds no IP") {
			t.Errorf("signed release through the API server: %v\n%s; want the replica's answer that the pod holds no IP", err, out)
		}
	})

	t.Run("check fails naming the members", func(t *testing.T) {
		if err := f.Replica(2).Kill(); err != nil {
			t.Fatal(err)
		}
		// Its address stays in the peers Service (publishNotReadyAddresses,
		// the pod is not deleted): ipamctl tries again when the API server
		// picked it, and a live replica reports one member short.
		var out []byte
		deadline := time.Now().Add(time.Minute)
		for {
			out, err = ipamctl(ctx, bin, admin, "check", "--replicas", "3")
			if strings.Contains(string(out), "live members: 2, want 3") || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Second)
		}
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), "FAIL: live members: 2, want 3") {
			t.Errorf("check with a replica killed: %v\n%s", err, out)
		}
		t.Logf("check with a replica killed:\n%s", out)
		// Every run names the count, also those where the API server first
		// picked the dead replica (one in three): ipamctl asked again.
		for i := range 6 {
			out, err := ipamctl(ctx, bin, admin, "check", "--replicas", "3")
			if !strings.Contains(string(out), "FAIL: live members: 2, want 3") {
				t.Errorf("check run %d with a replica killed: %v\n%s", i, err, out)
			}
		}
	})
}

// ipamctl runs the binary with a kubeconfig and no --server; the output is
// stdout and stderr.
func ipamctl(ctx context.Context, bin, kubeconfig string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Env = append(os.Environ(), "IPAMCTL_SERVER=")
	return cmd.CombinedOutput()
}

// post sends a POST through the service proxy as the kubeconfig's user.
func post(ctx context.Context, t *testing.T, kubeconfig string) error {
	t.Helper()
	cfg, err := loadKubeconfig(kubeconfig, "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := newProxyClient(cfg, "kube-system", defaultService)
	if err != nil {
		t.Fatal(err)
	}
	return c.do(ctx, http.MethodPost, "/shard/status", []byte("{}"), nil, nil)
}

// servePeers makes the replicas the endpoints of a peers Service as the
// chart's would be: a Pod per replica whose status carries its address, the
// headless Service selecting them, and the EndpointSlice the endpointslice
// controller would write (by hand: the Pods are never scheduled, no kubelet
// runs them).
func servePeers(t *testing.T, ctx context.Context, f *fleet.Fleet, ns, svc string) {
	t.Helper()
	kube := f.Kube
	labels := map[string]string{"app.kubernetes.io/name": "cce-ipam", "app.kubernetes.io/instance": "ctl-test"}
	_, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svc, Labels: labels},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, PublishNotReadyAddresses: true, Selector: labels,
			Ports: []corev1.ServicePort{{Name: "metrics", Port: 9998, TargetPort: intstr.FromString("metrics")}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.CoreV1().Services(ns).Delete(context.Background(), svc, metav1.DeleteOptions{}) })
	err = f.ServeMetricsBehind(ctx, ns, svc, func(r *fleet.Replica) *corev1.Pod {
		name := "cce-ipam-" + strconv.Itoa(r.Index())
		t.Cleanup(func() { _ = kube.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{}) })
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
			Spec: corev1.PodSpec{
				// Not bound by the fleet's kubelet simulator.
				SchedulerName: kubeletsim.ManualScheduler,
				Containers: []corev1.Container{{Name: "cce-ipam", Image: "cce-ipam",
					Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9998}}}},
			},
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.DiscoveryV1().EndpointSlices(ns).Delete(context.Background(), svc+"-replicas", metav1.DeleteOptions{})
	})
}

// kubeconfigFor writes a kubeconfig for a new ServiceAccount (a
// TokenRequest token) that rule, if any, grants in kube-system.
func kubeconfigFor(t *testing.T, ctx context.Context, f *fleet.Fleet, name string, rule *rbacv1.PolicyRule) string {
	t.Helper()
	kube := kubernetes.NewForConfigOrDie(f.Config)
	const ns = "kube-system"
	if _, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if rule != nil {
		if _, err := kube.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name},
			Rules: []rbacv1.PolicyRule{*rule}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := kube.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	tok, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.LoadFromFile(f.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		ai.Token, ai.TokenFile, ai.ClientCertificate, ai.ClientKey = tok.Status.Token, "", "", ""
		ai.ClientCertificateData, ai.ClientKeyData = nil, nil
	}
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}
