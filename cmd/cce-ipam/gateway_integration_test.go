//go:build integration

package main_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/e2e/freeport"
	"github.com/cce-ipam/sharded/e2e/supervisor"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// A drop-in for the reference's Deployment: cce-ipam started with the
// reference chart's exact container args (ports free ones, for the test
// machine) and the CCE gateway credentials, the token from the Secret
// kube-system/cce-plugin-token or, without it, from the mounted files.
// bce-sim plays the gateway: it sees the gateway headers and refuses a
// wrong token, which the replica reports without crashing.
func TestBinaries_ReferenceArgsThroughCCEGateway(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := cp.InstallCRDs(ctx, filepath.Join("..", "..", "charts", "cce-ipam", "crds")); err != nil {
		t.Fatal(err)
	}
	simBin := buildBinary(t, "github.com/cce-ipam/sharded/cmd/bce-sim")
	ipamBin := buildBinary(t, "github.com/cce-ipam/sharded/cmd/cce-ipam")

	// The AK/SK is the test's own, to play the node agent; cce-ipam has
	// only the gateway token.
	const ak, sk, vpc, token = "AKGW", "SKgwSecret", "vpc-gw", "cce-token-good"
	sim := startProcess(t, simBin, "--listen", "127.0.0.1:0", "--credential", ak+":"+sk,
		"--gateway-token", token, "--gateway-remote-host", "bcc.bj.baidubce.com",
		"--vpc", vpc, "--subnet", "sbn-gw,cn-bj-a,10.3.0.0/22",
		"--instance", "i-gw-0,sbn-gw,8,64", "--attach-delay", "0s", "--log-level", "warn")
	simAddr := firstLine(t, sim)

	bceCfg := cloud.DefaultConfig()
	bceCfg.OpLimits = nil
	bceCfg.Endpoint, bceCfg.AccessKeyID, bceCfg.SecretAccessKey = simAddr, ak, sk
	bceCfg.Rate, bceCfg.Burst = 1000, 1000
	client, err := cloud.New(bceCfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	kube, _ := nodeWithENI(t, ctx, client, "gw")

	expiredAt := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	setSecret := func(tok string) {
		t.Helper()
		_ = kube.CoreV1().Secrets("kube-system").Delete(ctx, "cce-plugin-token", metav1.DeleteOptions{})
		if tok == "" {
			return
		}
		if _, err := kube.CoreV1().Secrets("kube-system").Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "cce-plugin-token"},
			Data:       map[string][]byte{"token": []byte(tok), "expiredAt": []byte(expiredAt)},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { setSecret("") })

	// start runs a replica with the reference chart's args; tokenDir is the
	// mounted token directory (--cce-gateway-token-dir, the reference's
	// path by default).
	start := func(t *testing.T, ns, tokenDir string) (grpcAddr, metricsAddr string, p *supervisor.Process) {
		grpcPort, metricsPort := port(t), port(t)
		args := []string{
			// The reference chart's args.
			"--eni-sync-period=20s", "--gc-period=120s", "--port=" + grpcPort, "--debug-port=" + metricsPort,
			"--region=bj", "--vpc-id=" + vpc, "--cluster-id=cce-gw", "--cni-mode=vpc-secondary-ip-veth",
			// The test harness's.
			"--kubeconfig", cp.Kubeconfig, "--namespace", ns, "--pool-check-period", "1s",
			"--memberlist-bind-addr", "127.0.0.1", "--memberlist-bind-port", "0", "--cce-gateway-token-dir", tokenDir,
		}
		p = supervisor.StartT(t, supervisor.Spec{Name: "cce-ipam", Bin: ipamBin, Args: args,
			Env: append(os.Environ(), "CCE_GATEWAY_ENDPOINT="+simAddr, "POD_IP=127.0.0.1")})
		return "127.0.0.1:" + grpcPort, "127.0.0.1:" + metricsPort, p
	}
	allocate := func(t *testing.T, ns, grpcAddr, pod string) {
		if _, err := kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: pod},
			Spec:       corev1.PodSpec{NodeName: "node-gw", Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		reply, err := rpc.NewCNIBackendClient(conn).AllocateIP(ctx, &rpc.AllocateIPRequest{K8SPodName: pod,
			K8SPodNamespace: ns, K8SPodInfraContainerID: "c0ffee"})
		if err != nil || !reply.IsSuccess || !strings.HasPrefix(reply.GetENIMultiIP().GetIP(), "10.3.") {
			t.Fatalf("AllocateIP: %v, %v", reply, err)
		}
	}
	gatewayStats := func(t *testing.T) bcesim.GatewayStats {
		var st bcesim.GatewayStats
		if err := json.Unmarshal([]byte(httpGet(t, "http://"+simAddr+"/admin/gateway")), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	stop := func(t *testing.T, p *supervisor.Process) {
		_ = p.Signal(syscall.SIGTERM)
		select {
		case <-p.Exited():
		case <-time.After(20 * time.Second):
			t.Fatal("cce-ipam did not stop within 20s")
		}
	}
	noFiles := filepath.Join(t.TempDir(), "absent")

	t.Run("token from the Secret", func(t *testing.T) {
		setSecret(token)
		ns := cp.Namespace(t)
		grpcAddr, metricsAddr, p := start(t, ns, noFiles)
		waitHTTP(t, "http://"+metricsAddr+"/readyz")
		allocate(t, ns, grpcAddr, "web-secret")
		st := gatewayStats(t)
		h := st.LastHeaders
		for k, want := range map[string]string{"cce-token": token, "cce-cluster": "cce-gw",
			"cce-remote-host": "bcc.bj.baidubce.com", "host": simAddr} {
			if h[k] != want {
				t.Errorf("bce-sim saw %s = %q, want %q (all: %v)", k, h[k], want, h)
			}
		}
		if h["authorization"] != "" || h["x-bce-request-id"] == "" || st.Accepted == 0 || st.Refused != 0 {
			t.Errorf("bce-sim saw %+v", st)
		}
		stop(t, p)
	})

	t.Run("token from the files", func(t *testing.T) {
		setSecret("")
		dir := t.TempDir()
		for name, v := range map[string]string{"token": token + "\n", "expiredAt": expiredAt + "\n"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		before := gatewayStats(t).Accepted
		ns := cp.Namespace(t)
		grpcAddr, metricsAddr, p := start(t, ns, dir)
		waitHTTP(t, "http://"+metricsAddr+"/readyz")
		allocate(t, ns, grpcAddr, "web-files")
		if st := gatewayStats(t); st.Accepted <= before || st.LastHeaders["cce-token"] != token || st.Refused != 0 {
			t.Errorf("bce-sim saw %+v", st)
		}
		stop(t, p)
	})

	t.Run("wrong token", func(t *testing.T) {
		setSecret("not-the-token")
		ns := cp.Namespace(t)
		_, metricsAddr, p := start(t, ns, noFiles)
		deadline := time.Now().Add(time.Minute)
		for gatewayStats(t).Refused == 0 {
			if time.Now().After(deadline) {
				t.Fatal("bce-sim refused nothing")
			}
			time.Sleep(200 * time.Millisecond)
		}
		if st := gatewayStats(t); st.Reasons[bcesim.CodeAccessDenied] == 0 {
			t.Fatalf("refusals %v, want AccessDenied", st.Reasons)
		}
		// The replica is alive, not ready, and its log says why.
		deadline = time.Now().Add(30 * time.Second)
		for {
			select {
			case <-p.Exited():
				t.Fatalf("cce-ipam exited on a refused token: %v", p.ExitError())
			default:
			}
			logs, _ := os.ReadFile(p.LogPath())
			if strings.Contains(string(logs), "AccessDenied") {
				if strings.Contains(string(logs), "not-the-token") {
					t.Error("the log shows the token")
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no AccessDenied in the log:\n%s", logs)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if code := httpStatus(t, "http://"+metricsAddr+"/readyz"); code == 200 {
			t.Error("ready with a refused token")
		}
		stop(t, p)
	})
}

// port is a free TCP port on 127.0.0.1, as a string.
func port(t *testing.T) string {
	_, p, err := net.SplitHostPort(freeport.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	return p
}
