// Command demo is `make demo`: the whole system on one machine, with real
// parts. It starts a control plane (etcd, kube-apiserver,
// kube-controller-manager), bce-sim, a cce-ipam replica and kubelet-sim as
// separate processes; creates a Deployment and a fixed-IP StatefulSet; and
// shows pods getting unique IPs, a StatefulSet pod keeping its IP across a
// restart, a scale-down releasing IPs, and the invariant checker's verdict.
//
// Until sharding lands (issue #5) it runs one cce-ipam replica.
//
//	go run ./e2e/demo --bin-dir bin --nodes 10 --pods 100 [--keep]
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/e2e/cluster"
	"github.com/cce-ipam/sharded/e2e/invariants"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
)

const (
	ak, sk    = "AKDEMO", "SKdemoSecret"
	vpc       = "vpc-demo"
	subnet    = "sbn-demo"
	zone      = "cn-bj-a"
	group     = "g-demo"
	clusterID = "cce-demo"
	ns        = "demo"
)

type options struct {
	binDir  string
	nodes   int
	pods    int
	keep    bool
	timeout time.Duration
	// removeDir deletes the working directory (data and logs) at the end;
	// the command keeps it so that the logs can be read.
	removeDir bool
}

func main() {
	var o options
	flag.StringVar(&o.binDir, "bin-dir", "bin", "directory with etcd, kube-apiserver, kube-controller-manager, bce-sim, cce-ipam and kubelet-sim")
	flag.IntVar(&o.nodes, "nodes", 10, "simulated BCC nodes")
	flag.IntVar(&o.pods, "pods", 100, "replicas of the demo Deployment")
	flag.BoolVar(&o.keep, "keep", false, "keep everything running after the demo until Ctrl-C (kubeconfig is printed)")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up if the demo takes longer")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	binDir, err := filepath.Abs(o.binDir)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	start := time.Now()
	step := func(format string, args ...any) {
		fmt.Printf("[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}

	step("starting etcd, kube-apiserver and kube-controller-manager (built from source by make tools)")
	// A directory of our own: Close keeps it, so the logs outlive the demo.
	dir, err := os.MkdirTemp("", "cce-ipam-demo-")
	if err != nil {
		return err
	}
	if o.removeDir {
		defer os.RemoveAll(dir)
	}
	cp, err := cluster.Start(ctx, cluster.Options{BinDir: binDir, ControllerManager: true, Dir: dir})
	if err != nil {
		return err
	}
	defer cp.Close()
	if err := cp.InstallCRDs(ctx, filepath.Join("charts", "cce-ipam", "crds")); err != nil {
		return err
	}
	logDir := filepath.Join(cp.Dir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return err
	}
	procs := &processes{logDir: logDir}
	defer procs.stopAll()

	step("starting bce-sim (the BCE OpenAPI, served to the unmodified bce-sdk-go)")
	simOut, err := procs.start(filepath.Join(binDir, "bce-sim"), "--listen", "127.0.0.1:0", "--credential", ak+":"+sk,
		"--vpc", vpc, "--subnet", subnet+","+zone+",10.10.0.0/16", "--security-group", group, "--attach-delay", "500ms", "--log-level", "warn")
	if err != nil {
		return err
	}
	var simURL string
	select {
	case line := <-simOut:
		simURL = strings.TrimSpace(line)
	case <-time.After(30 * time.Second):
		return fmt.Errorf("bce-sim printed no address; see %s", logDir)
	}
	if _, _, err := net.SplitHostPort(strings.TrimPrefix(simURL, "http://")); err != nil {
		return fmt.Errorf("bce-sim printed %q, not its address; see %s", simURL, logDir)
	}

	grpcAddr, metricsAddr := freeAddr(), freeAddr()
	step("starting cce-ipam (gRPC %s, metrics http://%s/metrics)", grpcAddr, metricsAddr)
	if _, err := procs.start(filepath.Join(binDir, "cce-ipam"), "--kubeconfig", cp.Kubeconfig, "--cluster-id", clusterID,
		"--vpc-id", vpc, "--bce-endpoint", simURL, "--bce-region", "bj", "--bce-access-key-id", ak, "--bce-secret-access-key", sk,
		"--bce-rate", "100", "--bce-burst", "50", "--grpc-listen", grpcAddr, "--metrics-listen", metricsAddr,
		"--pool-check-period", "2s", "--eni-sync-period", "5s", "--gc-period", "5s"); err != nil {
		return err
	}
	if err := waitHTTP(ctx, "http://"+metricsAddr+"/readyz"); err != nil {
		return fmt.Errorf("cce-ipam not ready: %w", err)
	}

	kube := kubernetes.NewForConfigOrDie(cp.Config)
	cs := cceclient.NewForConfigOrDie(cp.Config)
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	step("starting kubelet-sim: %d BCC nodes (instances, one ENI each, IPPools), kubelets and CNI plugins", o.nodes)
	if _, err := procs.start(filepath.Join(binDir, "kubelet-sim"), "--kubeconfig", cp.Kubeconfig, "--cni-endpoint", grpcAddr,
		"--bce-endpoint", simURL, "--bce-region", "bj", "--bce-access-key-id", ak, "--bce-secret-access-key", sk,
		"--cluster-id", clusterID, "--vpc-id", vpc, "--subnet-id", subnet, "--zone", zone, "--security-group", group,
		"--nodes", fmt.Sprint(o.nodes), "--namespace", ns, "--node-lease-period", "10s", "--instance-memory-gb", "64",
		"--log-level", "warn", "--stats-period", "0"); err != nil {
		return err
	}

	step("creating Deployment web (%d replicas) and fixed-IP StatefulSet db (3 replicas)", o.pods)
	if err := createWorkloads(ctx, kube, o.pods); err != nil {
		return err
	}
	t0 := time.Now()
	pods, err := waitRunning(ctx, kube, o.pods+3)
	if err != nil {
		return err
	}
	step("all %d pods Running with an IP in %.1fs", len(pods), time.Since(t0).Seconds())
	ips := map[string]string{}
	perNode := map[string]int{}
	for _, p := range pods {
		if other, dup := ips[p.Status.PodIP]; dup {
			return fmt.Errorf("DUPLICATE IP %s: %s and %s", p.Status.PodIP, other, p.Name)
		}
		ips[p.Status.PodIP] = p.Name
		perNode[p.Spec.NodeName]++
	}
	step("%d unique IPs; pods per node: %s", len(ips), summarize(perNode))

	dbIP := podIP(pods, "db-1")
	step("deleting db-1 (fixed IP %s); the StatefulSet controller recreates it", dbIP)
	if err := kube.CoreV1().Pods(ns).Delete(ctx, "db-1", metav1.DeleteOptions{}); err != nil {
		return err
	}
	if err := waitRecreated(ctx, kube, "db-1", podUID(pods, "db-1"), dbIP); err != nil {
		return err
	}
	step("db-1 is Running again with the same IP %s", dbIP)

	scaled := max(o.pods/5, 1)
	step("scaling web to %d; released IPs return to the pools", scaled)
	dep, err := kube.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		return err
	}
	dep.Spec.Replicas = ptr.To(int32(scaled))
	if _, err := kube.AppsV1().Deployments(ns).Update(ctx, dep, metav1.UpdateOptions{}); err != nil {
		return err
	}
	if _, err := waitRunning(ctx, kube, scaled+3); err != nil {
		return err
	}
	t1 := time.Now()
	if err := waitWEPs(ctx, cceclient.NewForConfigOrDie(cp.Config), scaled+3); err != nil {
		return err
	}
	step("the %d removed pods' IPs were released (CNI DEL) in %.1fs", o.pods-scaled, time.Since(t1).Seconds())

	provider, err := cloud.New(cloud.Config{Endpoint: simURL, Region: "bj", AccessKeyID: ak, SecretAccessKey: sk, Rate: 100, Burst: 100},
		slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		return err
	}
	defer provider.Close()
	checker, err := invariants.New(invariants.Config{Namespaces: []string{ns}, OrphanGrace: 10 * time.Second},
		kube, cs, invariants.ProviderView(provider, vpc, clusterID+"/"))
	if err != nil {
		return err
	}
	step("checking invariants: unique IPs, pod IP = wep IP = an IP on the node's ENI, no orphan weps")
	waitCtx, waitCancel := context.WithTimeout(ctx, time.Minute)
	defer waitCancel()
	if vs, err := checker.WaitClean(waitCtx, time.Second); err != nil || len(vs) > 0 {
		return fmt.Errorf("invariants: %v %v", vs, err)
	}
	weps, err := cs.CceV1alpha1().WorkloadEndpoints(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	fixed := 0
	for _, w := range weps.Items {
		if w.IsFixedStatefulSet() {
			fixed++
		}
	}
	step("invariants hold; %d WorkloadEndpoints (%d fixed-IP); cce-ipam metrics:", len(weps.Items), fixed)
	printMetrics("http://"+metricsAddr+"/metrics", "cce_ipam_allocations_total", "cce_ipam_pool_ips", "cce_ipam_enis ", "cce_ipam_gc_actions_total", "cce_ipam_cloud_api_calls_total{operation=\"BatchAddPrivateIP\"")
	fmt.Printf("\ndemo passed in %.1fs; logs in %s\n", time.Since(start).Seconds(), logDir)
	if o.keep {
		fmt.Printf("keeping it running: export KUBECONFIG=%s  (Ctrl-C to stop)\n", cp.Kubeconfig)
		<-ctx.Done()
	}
	return nil
}

func createWorkloads(ctx context.Context, kube kubernetes.Interface, replicas int) error {
	pause := corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}}, TerminationGracePeriodSeconds: ptr.To[int64](0)}
	web := map[string]string{"app": "web"}
	_, err := kube.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(replicas)), Selector: &metav1.LabelSelector{MatchLabels: web},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: web}, Spec: pause}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	db := map[string]string{"app": "db"}
	_, err = kube.AppsV1().StatefulSets(ns).Create(ctx, &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](3), Selector: &metav1.LabelSelector{MatchLabels: db},
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: db,
				Annotations: map[string]string{cce.AnnotationStsEnableFixIP: cce.EnableFixIPTrue}}, Spec: pause}},
	}, metav1.CreateOptions{})
	return err
}

// waitRunning waits until exactly n pods of the namespace are Running with
// an IP and none is terminating.
func waitRunning(ctx context.Context, kube kubernetes.Interface, n int) ([]corev1.Pod, error) {
	for {
		list, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			var running []corev1.Pod
			settled := len(list.Items) == n
			for _, p := range list.Items {
				if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && p.DeletionTimestamp == nil {
					running = append(running, p)
				}
			}
			if settled && len(running) == n {
				return running, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %d Running pods: %w", n, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// waitWEPs waits until the namespace holds exactly n WorkloadEndpoints.
func waitWEPs(ctx context.Context, cs cceclient.Interface, n int) error {
	for {
		list, err := cs.CceV1alpha1().WorkloadEndpoints(ns).List(ctx, metav1.ListOptions{})
		if err == nil && len(list.Items) == n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d WorkloadEndpoints: %w", n, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func waitRecreated(ctx context.Context, kube kubernetes.Interface, name string, oldUID types.UID, wantIP string) error {
	for {
		p, err := kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && p.UID != oldUID && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			if p.Status.PodIP != wantIP {
				return fmt.Errorf("%s came back with %s, want its fixed IP %s", name, p.Status.PodIP, wantIP)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s to come back: %w", name, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func podUID(pods []corev1.Pod, name string) types.UID {
	for _, p := range pods {
		if p.Name == name {
			return p.UID
		}
	}
	return ""
}

func podIP(pods []corev1.Pod, name string) string {
	for _, p := range pods {
		if p.Name == name {
			return p.Status.PodIP
		}
	}
	return ""
}

func summarize(perNode map[string]int) string {
	counts := make([]int, 0, len(perNode))
	for _, c := range perNode {
		counts = append(counts, c)
	}
	sort.Ints(counts)
	if len(counts) == 0 {
		return "none"
	}
	return fmt.Sprintf("%d nodes, min %d, max %d", len(counts), counts[0], counts[len(counts)-1])
}

func printMetrics(url string, prefixes ...string) {
	resp, err := http.Get(url)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(body), "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				fmt.Println("    " + l)
			}
		}
	}
}

func waitHTTP(ctx context.Context, url string) error {
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// processes are the demo's children: own process groups, a parent-death
// signal, logs in logDir, all stopped at the end.
type processes struct {
	logDir string
	cmds   []*exec.Cmd
}

// start runs bin; its stderr and stdout go to its log, and the first line
// of stdout is also sent on the returned channel (buffered: nobody must read).
func (ps *processes) start(bin string, args ...string) (<-chan string, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s missing (make demo builds it): %w", bin, err)
	}
	log, err := os.Create(filepath.Join(ps.logDir, filepath.Base(bin)+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ps.cmds = append(ps.cmds, cmd)
	// Hand the first line to the caller, then keep draining into the log so
	// a chatty child never blocks on a full pipe.
	first := make(chan string, 1)
	go func() {
		r := bufio.NewReader(out)
		line, _ := r.ReadString('\n')
		first <- line
		_, _ = log.WriteString(line)
		_, _ = io.Copy(log, r)
	}()
	return first, nil
}

func (ps *processes) stopAll() {
	for i := len(ps.cmds) - 1; i >= 0; i-- {
		c := ps.cmds[i]
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
}
