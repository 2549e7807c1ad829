//go:build integration

package charttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/kubeletsim"
)

// helm test passes on the local control plane install, and fails with a
// replica down. The chart is installed with helm into the package's API
// server; its peers Service resolves to three fleet replicas, each in its
// own network namespace (the API server's service proxy needs endpoint
// addresses an EndpointSlice may hold: no loopback ones). The namespace
// enforces the restricted Pod Security Standard, so the API server itself
// refuses a hook pod that is not.
//
// No kubelet runs here, so the test plays one for the hook pod: it watches
// for the pod helm creates, runs its container's command as a local process
// (/ipamctl is bin/ipamctl) with a kubeconfig of the pod's ServiceAccount (a
// TokenRequest token, so that the hook's own Role is what authorizes its
// requests, as the in-cluster config would), and writes the pod's status
// (phase Succeeded or Failed, the container terminated with the exit code),
// which is what helm test waits for.
func TestChart_HelmTestHook(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	ns := cp.Namespace(t)
	kube := kubernetes.NewForConfigOrDie(cp.Config)
	nsObj, err := kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if nsObj.Labels == nil {
		nsObj.Labels = map[string]string{}
	}
	nsObj.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	if _, err := kube.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API server enforces it: a pod without the restricted settings is refused.
	if _, err := kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "unrestricted"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}},
		metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil || !strings.Contains(err.Error(), "violates PodSecurity") {
		t.Fatalf("an unrestricted pod in the restricted namespace: %v; want it refused by PodSecurity", err)
	}

	f := fleet.Start(t, fleet.Options{Name: "hook", SharedCluster: cp, LeaseNamespace: ns, Replicas: 3,
		NoKubelet: true, NetNS: true, BinDir: binDir(t)})
	if _, err := f.Settle(ctx); err != nil {
		t.Fatal(err)
	}

	const release = "ring"
	common := []string{"--kubeconfig", cp.Kubeconfig, "--namespace", ns}
	if _, err := helm(t, append([]string{"install", release, chartDir, "--set",
		"cluster.id=cce-x,cluster.vpcID=vpc-x,bce.region=bj,replicaCount=3"}, common...)...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := helm(t, append([]string{"uninstall", release}, common...)...); err != nil {
			t.Errorf("helm uninstall: %v", err)
		}
	})
	peers := release + "-cce-ipam-peers"
	if _, err := kube.CoreV1().Services(ns).Get(ctx, peers, metav1.GetOptions{}); err != nil {
		t.Fatalf("the release's peers Service: %v", err)
	}
	replicaEndpoints(t, ctx, f, ns, peers, map[string]string{
		"app.kubernetes.io/name": "cce-ipam", "app.kubernetes.io/instance": release})

	k := &hookKubelet{t: t, kube: kube, ns: ns, ipamctl: bin(t, "ipamctl")}
	kctx, stop := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() { defer close(stopped); k.run(kctx) }()
	t.Cleanup(func() { stop(); <-stopped })

	out, err := helm(t, append([]string{"test", release, "--timeout", "2m"}, common...)...)
	if err != nil || !strings.Contains(out, "Phase:          Succeeded") {
		t.Fatalf("helm test with 3 live replicas: %v\n%s\nhook output:\n%s", err, out, k.output())
	}
	if got := k.output(); !strings.Contains(got, "ok: 3 members, 271 partitions held") {
		t.Errorf("hook output %q, want ok with 3 members", got)
	}
	t.Logf("helm test:\n%s\nhook: %s", out, k.output())
	// The hook's Role granted exactly what it used (get on services/proxy),
	// and nothing it asked for was refused.
	checkRBACUsed(t, renderTestHook(t, release, ns), "system:serviceaccount:"+ns+":"+release+"-cce-ipam-ring-check", nil)

	// A replica down: its address stays in the peers Service (not-ready
	// addresses are published); the others see it gone within seconds.
	if err := f.Replica(2).Kill(); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, time.Second, "the others see replica 2 gone", func() error {
		st, err := f.Replica(0).ShardStatus(ctx)
		if err != nil {
			return err
		}
		live := 0
		for _, m := range st.Members {
			if m.Live {
				live++
			}
		}
		if live != 2 {
			return fmt.Errorf("%d live members", live)
		}
		return nil
	})
	out, err = helm(t, append([]string{"test", release, "--timeout", "2m"}, common...)...)
	if err == nil || !strings.Contains(k.output(), "FAIL: live members: 2, want 3") {
		t.Fatalf("helm test with a replica down passed or failed otherwise: %v\n%s\nhook output:\n%s", err, out, k.output())
	}
	t.Logf("helm test with a replica down: %v\nhook: %s", err, k.output())
}

// hookKubelet runs the helm test hook pods of one namespace (see
// TestChart_HelmTestHook).
type hookKubelet struct {
	t       *testing.T
	kube    kubernetes.Interface
	ns      string
	ipamctl string

	mu   sync.Mutex
	last []byte // the last hook's stdout and stderr
	done map[types.UID]bool
}

func (k *hookKubelet) output() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return string(k.last)
}

func (k *hookKubelet) run(ctx context.Context) {
	k.done = map[types.UID]bool{}
	for ctx.Err() == nil {
		w, err := k.kube.CoreV1().Pods(k.ns).Watch(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=test"})
		if err != nil {
			time.Sleep(time.Second)
			continue
		}
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) || k.done[pod.UID] ||
				pod.DeletionTimestamp != nil || pod.Status.Phase != "" && pod.Status.Phase != corev1.PodPending {
				continue
			}
			k.done[pod.UID] = true
			if err := k.runPod(ctx, pod); err != nil && ctx.Err() == nil {
				k.t.Errorf("hook pod %s: %v", pod.Name, err)
			}
		}
		w.Stop()
	}
}

// runPod runs the pod's one container as a local process, as its
// ServiceAccount, and records how it ended in the pod's status.
func (k *hookKubelet) runPod(ctx context.Context, pod *corev1.Pod) error {
	if len(pod.Spec.Containers) != 1 {
		return fmt.Errorf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if len(c.Command) != 1 || c.Command[0] != "/ipamctl" {
		return fmt.Errorf("command %q, want /ipamctl (the image's)", c.Command)
	}
	kubeconfig, err := k.serviceAccountKubeconfig(ctx, pod.Spec.ServiceAccountName)
	if err != nil {
		return err
	}
	start := metav1.Now()
	cmd := exec.CommandContext(ctx, k.ipamctl, c.Args...)
	// Only what a pod would have: the ServiceAccount's credentials (as a
	// kubeconfig instead of the mounted token) and an empty home.
	cmd.Env = []string{"KUBECONFIG=" + kubeconfig, "HOME=" + k.t.TempDir()}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	runErr := cmd.Run()
	exitCode := 0
	var exit *exec.ExitError
	switch {
	case errors.As(runErr, &exit):
		exitCode = exit.ExitCode()
	case runErr != nil:
		return runErr
	}
	k.mu.Lock()
	k.last = out.Bytes()
	k.mu.Unlock()
	k.t.Logf("hook pod %s: ipamctl %s: exit %d: %s", pod.Name, strings.Join(c.Args, " "), exitCode, out.String())

	phase, reason := corev1.PodSucceeded, "Completed"
	if exitCode != 0 {
		phase, reason = corev1.PodFailed, "Error"
	}
	pod = pod.DeepCopy()
	pod.Status.Phase = phase
	pod.Status.StartTime = &start
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: c.Name, Image: c.Image, ImageID: c.Image,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: int32(exitCode), Reason: reason, StartedAt: start, FinishedAt: metav1.Now()}},
	}}
	_, err = k.kube.CoreV1().Pods(k.ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	return err
}

// serviceAccountKubeconfig writes a kubeconfig with a TokenRequest token of
// the ServiceAccount.
func (k *hookKubelet) serviceAccountKubeconfig(ctx context.Context, sa string) (string, error) {
	if sa == "" {
		return "", errors.New("the hook pod names no ServiceAccount")
	}
	tok, err := k.kube.CoreV1().ServiceAccounts(k.ns).CreateToken(ctx, sa,
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: new(int64(600))}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: cp.Config.Host, CertificateAuthority: cp.Config.CAFile}
	cfg.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	cfg.Contexts["pod"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: sa, Namespace: k.ns}
	cfg.CurrentContext = "pod"
	path := filepath.Join(k.t.TempDir(), sa+".kubeconfig")
	return path, clientcmd.WriteToFile(*cfg, path)
}

// replicaEndpoints makes the fleet's replicas the endpoints of the release's
// peers Service, as the replica pods would be: a Pod per replica (never
// scheduled: no kubelet runs it) whose status carries its address, and the
// EndpointSlice the endpointslice controller would write (by hand: no
// controller-manager runs here).
func replicaEndpoints(t *testing.T, ctx context.Context, f *fleet.Fleet, ns, svc string, labels map[string]string) {
	t.Helper()
	err := f.ServeMetricsBehind(ctx, ns, svc, func(r *fleet.Replica) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("replica-%d", r.Index()), Labels: labels},
			Spec: corev1.PodSpec{
				SchedulerName: kubeletsim.ManualScheduler,
				SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: new(true),
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
				Containers: []corev1.Container{{Name: "cce-ipam", Image: "cce-ipam",
					Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9998}},
					SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: new(false),
						Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}},
			},
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}
