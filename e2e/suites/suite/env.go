package suite

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cce-ipam/sharded/e2e/cluster"
	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/kubeletsim"
)

// Env is where a suite runs.
type Env struct {
	// Cluster is the local control plane (nil on the kind path).
	Cluster *cluster.Cluster
	// Config and Kubeconfig reach the control plane either way.
	Config     *rest.Config
	Kubeconfig string
	// External is set on the kind path.
	External *fleet.External
	// KubeletSchedules makes the kubelet simulator bind pods on the kind
	// path too (E2E_SCHEDULER=kubelet-sim, for clusters without a
	// scheduler); by default the cluster's scheduler does.
	KubeletSchedules bool
}

// Local reports whether the suite runs on the local control plane with
// processes it controls.
func (e *Env) Local() bool { return e.External == nil }

// Main is a suite's TestMain body: it sets *out up from the environment,
// runs the tests and returns the exit code. own starts no shared control
// plane locally (for suites whose fleets start their own, e.g. to restart
// kube-apiserver).
func Main(m *testing.M, out **Env, own bool) int {
	env, err := fromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e environment:", err)
		return 1
	}
	*out = env
	if !env.Local() || own {
		return m.Run()
	}
	// The controller manager makes StatefulSets and ReplicaSets real.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cp, err := cluster.Start(ctx, cluster.Options{ControllerManager: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start control plane:", err)
		return 1
	}
	env.Cluster, env.Config, env.Kubeconfig = cp, cp.Config, cp.Kubeconfig
	code := 1
	if err := cp.InstallCRDs(ctx, crdDir()); err != nil {
		fmt.Fprintln(os.Stderr, "install CRDs:", err)
	} else {
		code = m.Run()
	}
	if code != 0 {
		fmt.Fprintf(os.Stderr, "control-plane logs (tails):\n%s", cp.Logs(20))
	}
	if err := cp.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "stop control plane:", err)
		code = max(code, 1)
	}
	return code
}

// fromEnv reads E2E_* for the kind path.
func fromEnv() (*Env, error) {
	kc := os.Getenv("E2E_KUBECONFIG")
	if kc == "" {
		return &Env{}, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		return nil, fmt.Errorf("E2E_KUBECONFIG: %w", err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	ext := &fleet.External{
		SimURL: os.Getenv("E2E_BCE_ENDPOINT"), ClusterID: os.Getenv("E2E_CLUSTER_ID"), VPCID: os.Getenv("E2E_VPC_ID"),
		SubnetID: os.Getenv("E2E_SUBNET_ID"), SecurityGroup: os.Getenv("E2E_SECURITY_GROUP"),
	}
	for _, a := range strings.Split(os.Getenv("E2E_CNI_ENDPOINTS"), ",") {
		if a = strings.TrimSpace(a); a != "" {
			ext.CNIAddrs = append(ext.CNIAddrs, a)
		}
	}
	if len(ext.CNIAddrs) == 0 || ext.SimURL == "" || ext.ClusterID == "" || ext.VPCID == "" ||
		ext.SubnetID == "" || ext.SecurityGroup == "" {
		return nil, errors.New("E2E_KUBECONFIG is set, so E2E_CNI_ENDPOINTS, E2E_BCE_ENDPOINT, E2E_CLUSTER_ID, " +
			"E2E_VPC_ID, E2E_SUBNET_ID and E2E_SECURITY_GROUP are required")
	}
	env := &Env{
		Config:     cfg,
		Kubeconfig: kc,
		External:   ext,
	}
	switch v := os.Getenv("E2E_SCHEDULER"); v {
	case "", "cluster":
	case "kubelet-sim":
		env.KubeletSchedules = true
	default:
		return nil, fmt.Errorf("E2E_SCHEDULER=%q: want cluster or kubelet-sim", v)
	}
	return env, nil
}

// Fleet starts a fleet for one test in this environment (stopped by
// t.Cleanup). Locally it uses the shared control plane unless Main was
// told the suite owns it; on the kind path it only runs the kubelet
// simulator, and Options.Name must differ from every earlier test's.
func (e *Env) Fleet(t testing.TB, o fleet.Options) *fleet.Fleet {
	t.Helper()
	if e.External != nil {
		o.External = e.External
		adjust := o.Kubelet
		o.Kubelet = func(c *kubeletsim.Config) {
			if adjust != nil {
				adjust(c)
			}
			c.NoScheduling = !e.KubeletSchedules
		}
	}
	if e.Config != nil {
		o.Config, o.Kubeconfig = e.Config, e.Kubeconfig
	}
	return fleet.Start(t, o)
}

// Namespace creates a namespace for one test, deleted when it ends.
func Namespace(t testing.TB, kube kubernetes.Interface) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(prefix) > 40 {
		prefix = prefix[:40]
	}
	ns, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: strings.Trim(prefix, "-") + "-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := kube.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete namespace %s: %v", ns.Name, err)
		}
	})
	return ns.Name
}

func crdDir() string {
	dir, _ := os.Getwd()
	for {
		c := filepath.Join(dir, "charts", "cce-ipam", "crds")
		if _, err := os.Stat(c); err == nil {
			return c
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return filepath.Join("charts", "cce-ipam", "crds")
		}
		dir = parent
	}
}
