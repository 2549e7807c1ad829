package suite

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/kubeletsim"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
)

// PodSpec is a pause pod pinned (by node selector) to the fleet's simulated
// nodes, so that on kind the real scheduler places it there too.
func PodSpec(f *fleet.Fleet) corev1.PodSpec {
	return corev1.PodSpec{
		Containers: []corev1.Container{{
			Name:  "app",
			Image: "registry.k8s.io/pause:3.10",
		}},
		TerminationGracePeriodSeconds: ptr.To[int64](0),
		NodeSelector:                  map[string]string{kubeletsim.LabelSimulator: f.SimulatorName()},
	}
}

// CreateDeployment creates a Deployment of pause pods labelled app=name.
func CreateDeployment(ctx context.Context, t testing.TB, f *fleet.Fleet, ns, name string, replicas int) {
	t.Helper()
	l := map[string]string{"app": name}
	_, err := f.Kube.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(replicas)), Selector: &metav1.LabelSelector{MatchLabels: l},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: l},
				Spec:       PodSpec(f),
			}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create deployment %s: %v", name, err)
	}
}

// CreateStatefulSet creates a StatefulSet (parallel pod management) of
// pause pods labelled app=name; fixedIP asks for fixed IPs.
func CreateStatefulSet(ctx context.Context, t testing.TB, f *fleet.Fleet, ns, name string, replicas int, fixedIP bool) {
	t.Helper()
	l := map[string]string{"app": name}
	ann := map[string]string{}
	if fixedIP {
		ann[cce.AnnotationStsEnableFixIP] = cce.EnableFixIPTrue
	}
	_, err := f.Kube.AppsV1().StatefulSets(ns).Create(ctx, &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To(int32(replicas)), Selector: &metav1.LabelSelector{MatchLabels: l},
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      l,
					Annotations: ann,
				},
				Spec: PodSpec(f),
			}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create statefulset %s: %v", name, err)
	}
}

// ScaleDeployment sets a Deployment's replicas.
func ScaleDeployment(ctx context.Context, t testing.TB, kube kubernetes.Interface, ns, name string, replicas int) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	if _, err := kube.AppsV1().Deployments(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("scale deployment %s: %v", name, err)
	}
}

// ScaleStatefulSet sets a StatefulSet's replicas.
func ScaleStatefulSet(ctx context.Context, t testing.TB, kube kubernetes.Interface, ns, name string, replicas int) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	if _, err := kube.AppsV1().StatefulSets(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("scale statefulset %s: %v", name, err)
	}
}

// RolloutRestartStatefulSet changes the pod template (as `kubectl rollout
// restart` does), so the controller replaces every pod, one at a time.
func RolloutRestartStatefulSet(ctx context.Context, t testing.TB, kube kubernetes.Interface, ns, name string) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`,
		time.Now().Format(time.RFC3339Nano))
	if _, err := kube.AppsV1().StatefulSets(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("restart statefulset %s: %v", name, err)
	}
}

// Running reports whether a pod is Running with an IP and not terminating.
func Running(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && p.DeletionTimestamp == nil
}

// WaitPods waits until exactly n pods match selector in ns and all are
// Running with an IP, and returns them sorted by name. pred, when given,
// must also hold for the set.
func WaitPods(ctx context.Context, t testing.TB, kube kubernetes.Interface, ns, selector string, n int,
	pred ...func([]corev1.Pod) bool) []corev1.Pod {
	t.Helper()
	var last string
	for {
		list, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err == nil {
			running := 0
			for i := range list.Items {
				if Running(&list.Items[i]) {
					running++
				}
			}
			last = fmt.Sprintf("%d pods, %d Running", len(list.Items), running)
			ok := len(list.Items) == n && running == n
			for _, p := range pred {
				ok = ok && p(list.Items)
			}
			if ok {
				sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
				return list.Items
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %d Running pods %q in %s: %v (last: %s)", n, selector, ns, ctx.Err(), last)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// IPs maps pod name to IP and fails the test on a duplicate.
func IPs(t testing.TB, pods []corev1.Pod) map[string]string {
	t.Helper()
	out := map[string]string{}
	owner := map[string]string{}
	for _, p := range pods {
		if other, dup := owner[p.Status.PodIP]; dup {
			t.Fatalf("DUPLICATE IP %s: pods %s and %s", p.Status.PodIP, other, p.Name)
		}
		owner[p.Status.PodIP] = p.Name
		out[p.Name] = p.Status.PodIP
	}
	return out
}

// WaitWEPs waits until ns holds exactly n WorkloadEndpoints and returns
// them by name.
func WaitWEPs(ctx context.Context, t testing.TB, cs cceclient.Interface, ns string, n int) map[string]cce.WorkloadEndpoint {
	t.Helper()
	var got int
	for {
		list, err := cs.CceV1alpha1().WorkloadEndpoints(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			got = len(list.Items)
			if got == n {
				out := map[string]cce.WorkloadEndpoint{}
				for _, w := range list.Items {
					out[w.Name] = w
				}
				return out
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %d WorkloadEndpoints in %s: %v (have %d)", n, ns, ctx.Err(), got)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// WaitEvent waits for an Event about the named pod whose reason is one of
// reasons, and returns it.
func WaitEvent(ctx context.Context, t testing.TB, kube kubernetes.Interface, ns, pod string, reasons ...string) corev1.Event {
	t.Helper()
	for {
		list, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err == nil {
			for _, e := range list.Items {
				for _, r := range reasons {
					if e.Reason == r {
						return e
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for an event %s on pod %s/%s: %v", strings.Join(reasons, "|"), ns, pod, ctx.Err())
		case <-time.After(300 * time.Millisecond):
		}
	}
}
