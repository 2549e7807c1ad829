//go:build integration

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/e2e/cluster"
	"github.com/cce-ipam/sharded/e2e/invariants"
	"github.com/cce-ipam/sharded/e2e/kubeletsim"
	"github.com/cce-ipam/sharded/e2e/kubeletsim/stack"
)

var cp *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.RunTests(m, cluster.Options{}, &cp))
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The binary's wiring: it registers nodes through the BCE API and bce-sim's
// admin API over HTTP, and runs a pod with an IP from a real IPAM.
func TestRun_RegistersNodesAndRunsPods(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := cp.InstallCRDs(ctx, filepath.Join("..", "..", "charts", "cce-ipam", "crds")); err != nil {
		t.Fatal(err)
	}
	// The stack provides bce-sim, the IPAM and its gRPC endpoint (and one
	// node of its own, in another namespace).
	st := stack.Start(t, cp.Config, stack.Options{Name: "cmdhost", Namespace: cp.Namespace(t)})
	ns := cp.Namespace(t)
	sg := st.Opts.Name
	args := []string{
		"--kubeconfig", cp.Kubeconfig, "--cni-endpoint", st.CNIAddr, "--namespace", ns,
		"--bce-endpoint", st.BCE.URL(), "--bce-access-key-id", stack.AccessKey, "--bce-secret-access-key", stack.SecretKey,
		"--cluster-id", st.ClusterID, "--vpc-id", st.VPCID, "--subnet-id", st.SubnetID, "--zone", st.Zone,
		"--security-group", "g-" + sg, "--nodes", "2", "--node-prefix", "cmdsim", "--name", "cmdsim",
		"--instance-memory-gb", "16", "--stats-period", "200ms", "--log-format", "text",
	}
	runCtx, stop := context.WithCancel(ctx)
	var logs syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(runCtx, args, &logs) }()
	stopped := false
	halt := func() error {
		if stopped {
			return nil
		}
		stopped = true
		stop()
		return <-done
	}
	t.Cleanup(func() { _ = halt() })
	t.Cleanup(func() {
		for _, n := range kubeletsim.NodeNames("cmdsim", 0, 2) {
			_ = st.Kube.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	})

	nodes := kubeletsim.NodeNames("cmdsim", 0, 2)
	stack.Eventually(t, 60*time.Second, "nodes registered", func() (bool, string) {
		for _, n := range nodes {
			node, err := st.Kube.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if node.Spec.ProviderID != "cce://i-"+n || node.Annotations["cce.io/max-ip-per-eni"] != "16" ||
				node.Annotations["cce.io/max-eni-num"] != "8" || node.Labels[kubeletsim.LabelInstanceType] != "BCC" {
				return false, "node not shaped like a CCE BCC node: " + node.String()
			}
		}
		return true, ""
	})
	for _, n := range nodes {
		if err := st.IPAM.ServeNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"a", "b"} {
		_, err := st.Kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	stack.Eventually(t, 60*time.Second, "pods Running on the binary's nodes", func() (bool, string) {
		pods, err := st.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		on := map[string]bool{}
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
				return false, p.Name + " is " + string(p.Status.Phase)
			}
			on[p.Spec.NodeName] = true
		}
		return len(pods.Items) == 2 && on[nodes[0]] && on[nodes[1]], "pods not spread over both nodes"
	})
	chk, err := invariants.New(invariants.Config{Namespaces: []string{ns}}, st.Kube, st.CCE,
		invariants.ProviderView(st.Cloud, st.VPCID, st.ClusterID+"/"))
	if err != nil {
		t.Fatal(err)
	}
	if vs, err := chk.Check(ctx); err != nil || len(vs) > 0 {
		t.Fatalf("invariants: err=%v\n%s", err, vs)
	}
	if err := halt(); err != nil {
		t.Fatalf("run: %v\n%s", err, logs.String())
	}
	for _, want := range []string{"nodes registered", "new=2", "pods_started=2", "kubelet simulator running"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %q:\n%s", want, logs.String())
		}
	}
}
