//go:build integration

package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/e2e/cluster"
	"github.com/cce-ipam/sharded/e2e/freeport"
	"github.com/cce-ipam/sharded/e2e/supervisor"
	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

var cp *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.RunTests(m, cluster.Options{}, &cp))
}

// startProcess runs a binary under e2e/supervisor, killed when the test
// ends, with its log's tail in the test log on failure.
func startProcess(t *testing.T, bin string, args ...string) *supervisor.Process {
	t.Helper()
	return supervisor.StartT(t, supervisor.Spec{
		Name: filepath.Base(bin),
		Bin:  bin,
		Args: args,
	})
}

// firstLine waits for the first line p prints (bce-sim's address).
func firstLine(t *testing.T, p *supervisor.Process) string {
	t.Helper()
	select {
	case line := <-p.FirstLine():
		return strings.TrimSpace(line)
	case <-p.Exited():
		select {
		case line := <-p.FirstLine():
			return strings.TrimSpace(line)
		default:
			t.Fatal(p.ExitError())
		}
	case <-time.After(time.Minute):
		t.Fatalf("%s printed nothing within a minute", p.Name())
	}
	return ""
}

func buildBinary(t *testing.T, pkg string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), filepath.Base(pkg))
	build := exec.Command("go", "build", "-o", out, pkg)
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("build %s: %v", pkg, err)
	}
	return out
}

// The two binaries, as an operator runs them: bce-sim as its own process,
// cce-ipam with flags and a kubeconfig. A pod on a BCC node gets an IP over
// gRPC, /readyz and /metrics answer, and SIGTERM stops the replica cleanly.
func TestBinaries_AllocateThroughProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := cp.InstallCRDs(ctx, filepath.Join("..", "..", "charts", "cce-ipam", "crds")); err != nil {
		t.Fatal(err)
	}
	simBin := buildBinary(t, "github.com/cce-ipam/sharded/cmd/bce-sim")
	ipamBin := buildBinary(t, "github.com/cce-ipam/sharded/cmd/cce-ipam")

	const ak, sk, vpc = "AKBIN", "SKbinSecret", "vpc-bin"
	sim := startProcess(t, simBin, "--listen", "127.0.0.1:0", "--credential", ak+":"+sk,
		"--vpc", vpc, "--subnet", "sbn-bin,cn-bj-a,10.2.0.0/22",
		"--instance", "i-bin-0,sbn-bin,8,64", "--attach-delay", "0s", "--log-level", "warn")
	simAddr := firstLine(t, sim)
	line := simAddr
	if _, _, err := net.SplitHostPort(strings.TrimPrefix(simAddr, "http://")); err != nil {
		t.Fatalf("bce-sim printed %q, want its address", line)
	}

	// The node agent's part: one ENI attached to the instance.
	bceCfg := cloud.DefaultConfig()
	bceCfg.OpLimits = nil // no per-operation limits: only the rate above
	bceCfg.Endpoint = simAddr
	bceCfg.AccessKeyID = ak
	bceCfg.SecretAccessKey = sk
	bceCfg.Rate = 1000
	bceCfg.Burst = 1000
	client, err := cloud.New(bceCfg,
		slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	kube, eni := nodeWithENI(t, ctx, client, "bin")
	ns := cp.Namespace(t)
	if _, err := kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.PodSpec{
			NodeName: "node-bin",
			Containers: []corev1.Container{{
				Name:  "c",
				Image: "pause",
			}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	grpcAddr, metricsAddr := freeport.Addr(t), freeport.Addr(t)
	ipamProc := startProcess(t, ipamBin, "--kubeconfig", cp.Kubeconfig, "--cluster-id", "cce-bin", "--vpc-id", vpc,
		"--bce-endpoint", simAddr, "--bce-region", "bj", "--bce-access-key-id", ak, "--bce-secret-access-key", sk,
		"--grpc-listen", grpcAddr, "--metrics-listen", metricsAddr, "--pool-check-period", "1s",
		"--memberlist-bind-addr", "127.0.0.1", "--memberlist-bind-port", "0", "--namespace", ns, "--enable-profiling")

	waitHTTP(t, "http://"+metricsAddr+"/readyz")
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cni := rpc.NewCNIBackendClient(conn)
	// Readiness by name, and the gRPC health service following it.
	if v := httpGet(t, "http://"+metricsAddr+"/readyz?verbose"); !strings.Contains(v, "[+]caches ok") ||
		!strings.Contains(v, "[+]gossip ok") || !strings.Contains(v, "[+]shard ok") || !strings.Contains(v, "readyz check passed") {
		t.Errorf("/readyz?verbose = %q, want every check listed as ok", v)
	}
	hc := healthpb.NewHealthClient(conn)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: rpc.CNIBackend_ServiceDesc.ServiceName})
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("grpc.health.v1 Check = %v, %v; want SERVING once /readyz is ok", resp, err)
		}
	}
	var reply *rpc.AllocateIPReply
	deadline := time.Now().Add(time.Minute)
	for {
		reply, err = cni.AllocateIP(ctx, &rpc.AllocateIPRequest{
			K8SPodName:             "web",
			K8SPodNamespace:        ns,
			K8SPodInfraContainerID: "c0ffee",
		})
		if err == nil && reply.IsSuccess {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("AllocateIP never succeeded: %v, %v", reply, err)
		}
		time.Sleep(200 * time.Millisecond) // the node is served once the replica has rebuilt it
	}
	ip := reply.GetENIMultiIP()
	if !strings.HasPrefix(ip.GetIP(), "10.2.") || ip.GetENIID() != eni || ip.GetNode() != "node-bin" {
		t.Fatalf("reply %v, want an IP of sbn-bin on %s", ip, eni)
	}
	wep, err := versioned.NewForConfigOrDie(cp.Config).CceV1alpha1().WorkloadEndpoints(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil || wep.Spec.IP != ip.GetIP() {
		t.Fatalf("wep = %v, %v; want IP %s", wep, err, ip.GetIP())
	}
	got, err := client.GetENI(ctx, eni)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range got.PrivateIPs {
		found = found || p.Address == ip.GetIP()
	}
	if !found {
		t.Fatalf("bce-sim has no %s on %s: %v", ip.GetIP(), eni, got.PrivateIPs)
	}

	metrics := httpGet(t, "http://"+metricsAddr+"/metrics")
	for _, want := range []string{`cce_ipam_cni_requests_total{hop="entry",method="AllocateIP",result="ok"}`, "cce_ipam_allocations_total",
		`cce_ipam_kube_api_requests_total{code="201",verb="POST"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	if heap := httpGet(t, "http://"+metricsAddr+"/debug/pprof/heap?debug=1"); !strings.Contains(heap, "heap profile:") {
		t.Errorf("/debug/pprof/heap with --enable-profiling = %.200q, want a heap profile", heap)
	}

	if err := ipamProc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ipamProc.Exited():
		if err := ipamProc.WaitErr(); err != nil {
			t.Fatalf("cce-ipam exited with %v after SIGTERM", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("cce-ipam did not stop within 20s of SIGTERM")
	}
	checkJSONLog(t, ipamProc.LogPath())
}

// checkJSONLog: the replica's whole output, start to stop, is one JSON
// object per line, client-go's (leader election, reflectors) included.
func checkJSONLog(t *testing.T, path string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var lines, fromClientGo int
	for _, l := range strings.Split(string(raw), "\n") {
		if l == "" || strings.HasPrefix(l, "=== ") { // the supervisor's own start/exit markers
			continue
		}
		lines++
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Errorf("log line %d is not JSON: %.300q", lines, l)
			continue
		}
		if rec["component"] == "client-go" {
			fromClientGo++
		}
	}
	if lines == 0 || fromClientGo == 0 {
		t.Errorf("%d log lines, %d of them client-go's: want client-go's among them (leader election logs)", lines, fromClientGo)
	}
}

func waitHTTP(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready: %v", url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// httpStatus is the status code of a GET of url.
func httpStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return fmt.Sprint(string(b))
}

// nodeWithENI makes node-<name> on instance i-<name>-0 with one ENI of
// subnet sbn-<name> attached (in bce-sim, through client), and returns the
// admin clientset and the ENI's ID. Other tests of this package share the API server: the
// node is deleted when the test ends.
func nodeWithENI(t *testing.T, ctx context.Context, client *cloud.Client, name string) (kubernetes.Interface, string) {
	t.Helper()
	node, instance := "node-"+name, "i-"+name+"-0"
	eni, err := client.CreateENI(ctx, cloud.CreateENIRequest{
		Name:             "cce-" + name + "/" + node,
		SubnetID:         "sbn-" + name,
		SecurityGroupIDs: []string{"g-sim"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.AttachENI(ctx, eni, instance); err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(cp.Config)
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: node},
		Spec:       corev1.NodeSpec{ProviderID: "cce://" + instance},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	return kube, eni
}
