//go:build integration

package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/e2e/supervisor"
)

// orphanProbeEnv turns the test binary into a child that starts a control
// plane, prints its PIDs and waits to be killed (see TestCluster_KilledOwner).
const orphanProbeEnv = "CCE_IPAM_CLUSTER_ORPHAN_PROBE"

var shared *Cluster

func TestMain(m *testing.M) {
	if os.Getenv(orphanProbeEnv) != "" {
		os.Exit(runOrphanProbe())
	}
	os.Exit(RunTests(m, Options{ControllerManager: true}, &shared))
}

func runOrphanProbe() int {
	c, err := Start(context.Background(), Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_ = json.NewEncoder(os.Stdout).Encode(probeReport{
		PIDs: c.PIDs(),
		Dir:  c.Dir,
	})
	select {} // wait for SIGKILL; Close is deliberately never called
}

// probeReport is what the orphan probe prints for its parent test.
type probeReport struct {
	PIDs map[string]int
	Dir  string
}

func TestCluster_CRDRoundTrip(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := shared.Namespace(t)

	cs := kubernetes.NewForConfigOrDie(shared.Config)
	got, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read namespace back: %v", err)
	}
	if got.Status.Phase != corev1.NamespaceActive {
		t.Fatalf("namespace %s phase = %q, want Active", ns, got.Status.Phase)
	}

	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.roundtrip.test.cce.io"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "roundtrip.test.cce.io",
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList",
			},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1alpha1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"ip": {Type: "string"},
						}},
					},
				}},
			}},
		},
	}
	ext := apiextensionsclient.NewForConfigOrDie(shared.Config)
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CRD: %v", err)
	}
	t.Cleanup(func() {
		_ = ext.ApiextensionsV1().CustomResourceDefinitions().Delete(context.Background(), crd.Name, metav1.DeleteOptions{})
	})
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("CRD never became Established: %v", err)
	}

	gvr := schema.GroupVersionResource{
		Group:    "roundtrip.test.cce.io",
		Version:  "v1alpha1",
		Resource: "widgets",
	}
	dyn := dynamic.NewForConfigOrDie(shared.Config)
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "roundtrip.test.cce.io/v1alpha1",
		"kind":       "Widget",
		"metadata":   map[string]any{"name": "w1"},
		"spec":       map[string]any{"ip": "10.1.2.3"},
	}}
	if _, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Widget: %v", err)
	}
	back, err := dyn.Resource(gvr).Namespace(ns).Get(ctx, "w1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read Widget back: %v", err)
	}
	if ip, _, _ := unstructured.NestedString(back.Object, "spec", "ip"); ip != "10.1.2.3" {
		t.Fatalf("Widget spec.ip = %q, want 10.1.2.3", ip)
	}
	list, err := dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("list Widgets = %v items, err %v; want 1", len(list.Items), err)
	}
}

// TestCluster_Kubeconfig proves the written kubeconfig reaches the same API
// server with verified TLS, as tools outside this process will use it.
func TestCluster_Kubeconfig(t *testing.T) {
	cfg, err := clientcmd.BuildConfigFromFlags("", shared.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Insecure {
		t.Fatal("kubeconfig skips TLS verification")
	}
	v, err := kubernetes.NewForConfigOrDie(cfg).Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version through kubeconfig: %v", err)
	}
	if v.GitVersion != "v1.37.2" {
		t.Fatalf("kube-apiserver version = %s, want the pinned v1.37.2", v.GitVersion)
	}
}

// TestCluster_ControllerManagerRunsStatefulSets proves kube-controller-manager
// is really running controllers: a StatefulSet gets its pod.
func TestCluster_ControllerManagerRunsStatefulSets(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := shared.Namespace(t)
	cs := kubernetes.NewForConfigOrDie(shared.Config)
	labels := map[string]string{"app": "web"}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name:  "c",
					Image: "pause",
				}}},
			},
		},
	}
	if _, err := cs.AppsV1().StatefulSets(ns).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create StatefulSet: %v", err)
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 45*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().Pods(ns).Get(ctx, "web-0", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("StatefulSet controller never created web-0: %v", err)
	}
}

// TestCluster_CloseStopsEverything starts a second control plane and proves
// Close leaves no process and no directory behind.
func TestCluster_CloseStopsEverything(t *testing.T) {
	c, err := Start(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	pids := c.PIDs()
	if len(pids) != 2 {
		t.Fatalf("PIDs = %v, want etcd and kube-apiserver", pids)
	}
	for name, pid := range pids {
		if !supervisor.Alive(pid) {
			t.Fatalf("%s (pid %d) not running before Close", name, pid)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for name, pid := range pids {
		if supervisor.Alive(pid) {
			t.Errorf("%s (pid %d) still running after Close", name, pid)
		}
	}
	if _, err := os.Stat(c.Dir); !os.IsNotExist(err) {
		t.Errorf("working dir %s still exists after Close (err %v)", c.Dir, err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestCluster_KilledOwnerTakesChildren runs this test binary as a child that
// starts a control plane, SIGKILLs that child (no cleanup code can run), and
// proves etcd and kube-apiserver die with it.
func TestCluster_KilledOwnerTakesChildren(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), orphanProbeEnv+"=1")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	reportCh := make(chan probeReport, 1)
	go func() {
		var r probeReport
		if sc := bufio.NewScanner(stdout); sc.Scan() {
			_ = json.Unmarshal(sc.Bytes(), &r)
		}
		reportCh <- r
	}()
	var report probeReport
	select {
	case report = <-reportCh:
	case <-time.After(2 * time.Minute):
		t.Fatal("probe child never reported its control plane")
	}
	pids := report.PIDs
	if len(pids) != 2 {
		t.Fatalf("probe reported %v, want etcd and kube-apiserver", pids)
	}
	// Should the test fail below, do not leak the probe's children either.
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
	})
	for name, pid := range pids {
		if !supervisor.Alive(pid) {
			t.Fatalf("%s (pid %d) not running in the probe", name, pid)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	err = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) {
			for _, pid := range pids {
				if supervisor.Alive(pid) {
					return false, nil
				}
			}
			return true, nil
		})
	if err != nil {
		t.Fatalf("control-plane processes %v outlived their SIGKILLed owner", pids)
	}

	// The dead owner's temp dir is left behind; the next Start sweeps it.
	if _, err := os.Stat(report.Dir); err != nil {
		t.Fatalf("probe's dir %q: %v", report.Dir, err)
	}
	removeAbandonedDirs()
	if _, err := os.Stat(report.Dir); !os.IsNotExist(err) {
		t.Fatalf("abandoned dir %s not removed (err %v)", report.Dir, err)
	}
}
