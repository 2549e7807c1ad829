//go:build integration

package ipam_test

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

// createStatefulSet creates the StatefulSet object only (no controller runs
// here), so the test plays the controller: it creates and deletes the pods.
func (e *env) createStatefulSet(name string, replicas int32) *appsv1.StatefulSet {
	e.t.Helper()
	labels := map[string]string{"app": name}
	sts, err := e.kube.AppsV1().StatefulSets(e.ns).Create(e.ctx, &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return sts
}

// createStsPod creates a fixed-IP pod of sts on node.
func (e *env) createStsPod(sts *appsv1.StatefulSet, ordinal int, node, policy, containerID string) podRef {
	e.t.Helper()
	name := sts.Name + "-" + string(rune('0'+ordinal))
	ann := map[string]string{cce.AnnotationStsEnableFixIP: cce.EnableFixIPTrue}
	if policy != "" {
		ann[cce.AnnotationStsPodFixIPDeletePolicy] = policy
	}
	_, err := e.kube.CoreV1().Pods(e.ns).Create(e.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name, UID: sts.UID, Controller: ptr.To(true),
		}}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return podRef{name: name, node: node, containerID: containerID}
}

// deletePod deletes a pod and waits until the API server no longer has it.
func (e *env) deletePod(name string) {
	e.t.Helper()
	if err := e.kube.CoreV1().Pods(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		e.t.Fatal(err)
	}
	eventually(e.t, 10*time.Second, "pod "+name+" gone", func() bool {
		_, err := e.kube.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

func (e *env) wepExists(name string) bool {
	_, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	return err == nil
}

// A fixed-IP StatefulSet pod keeps its IP across a restart on another node;
// scaling down and deleting the StatefulSet release the IPs after GC; policy
// Never keeps them.
func TestIPAM_FixedIPStatefulSet(t *testing.T) {
	e := newEnv(t, "fx", 2, testConfig(func(c *ipam.Config) {
		c.IdleMin = 1
		c.IdleMax = 6
		c.PoolCheckPeriod = 200 * time.Millisecond
	}))
	sts := e.createStatefulSet("db", 3)
	pods := []podRef{
		e.createStsPod(sts, 0, e.nodes[0], "", "c0"),
		e.createStsPod(sts, 1, e.nodes[0], "", "c1"),
		e.createStsPod(sts, 2, e.nodes[0], cce.FixIPDeletePolicyNever, "c2"),
	}
	first := map[string]string{}
	for _, p := range pods {
		r, err := e.allocate(p)
		if err != nil {
			t.Fatal(err)
		}
		first[p.name] = r.IP
	}
	wep, _ := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, "db-1", metav1.GetOptions{})
	if !wep.IsFixedStatefulSet() || wep.Spec.Type != cce.WorkloadEndpointTypeStatefulSet || wep.Labels[cce.LabelOwner] != "db" {
		t.Fatalf("wep of a fixed-IP pod = %+v %v, want a fixed StatefulSet wep owned by db", wep.Spec, wep.Labels)
	}

	// db-1 restarts on the other node: DEL keeps the reservation, the new
	// sandbox on node 1 gets the same address, moved in the cloud.
	if r, err := e.release(pods[1]); err != nil || !r.IsSuccess {
		t.Fatalf("DEL of a fixed pod = %v, %v", r, err)
	}
	if !e.wepExists("db-1") {
		t.Fatal("DEL of a fixed-IP pod deleted its wep")
	}
	e.deletePod("db-1")
	moved := e.createStsPod(sts, 1, e.nodes[1], "", "c1-new")
	r, err := e.allocate(moved)
	if err != nil {
		t.Fatal(err)
	}
	if r.IP != first["db-1"] || r.Node != e.nodes[1] {
		t.Fatalf("db-1 on %s got %s, want its old IP %s", e.nodes[1], r.IP, first["db-1"])
	}
	if got := e.cloudIPs()[e.instance[e.nodes[1]]]; !got[r.IP] {
		t.Fatalf("bce-sim does not show %s on %s's instance", r.IP, e.nodes[1])
	}
	if got := e.cloudIPs()[e.instance[e.nodes[0]]]; got[r.IP] {
		t.Fatalf("bce-sim still shows %s on the old node", r.IP)
	}
	e.checkNoLeak()

	// Scale to 1: db-1 (policy default) and db-2 (Never) lose their pods.
	sts.Spec.Replicas = ptr.To[int32](1)
	if _, err := e.kube.AppsV1().StatefulSets(e.ns).Update(e.ctx, sts, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []podRef{moved, pods[2]} {
		if _, err := e.release(p); err != nil {
			t.Fatal(err)
		}
		e.deletePod(p.name)
	}
	// GC reads StatefulSets from its cache, so it converges within a pass
	// or two of the scale-down reaching the informer.
	eventually(t, 10*time.Second, "GC releases the scaled-down pod's fixed IP", func() bool {
		e.ipam.CollectGarbage(e.ctx)
		return !e.wepExists("db-1")
	})
	if !e.wepExists("db-2") {
		t.Fatal("GC released a fixed IP with policy Never")
	}
	if e.cloudIPs()[e.instance[e.nodes[1]]][first["db-1"]] {
		t.Fatal("the scaled-down pod's fixed IP is still in the cloud")
	}

	// Delete the StatefulSet: db-0 goes, db-2 (Never) stays.
	if err := e.kube.AppsV1().StatefulSets(e.ns).Delete(e.ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "StatefulSet gone", func() bool {
		_, err := e.kube.AppsV1().StatefulSets(e.ns).Get(e.ctx, "db", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	eventually(t, 10*time.Second, "GC releases db-0 after the StatefulSet is deleted", func() bool {
		e.ipam.CollectGarbage(e.ctx)
		return !e.wepExists("db-0")
	})
	if e.wepExists("db-0") || !e.wepExists("db-2") {
		t.Fatalf("after StatefulSet deletion: db-0 wep exists=%v (want false), db-2 exists=%v (want true)",
			e.wepExists("db-0"), e.wepExists("db-2"))
	}
	e.checkNoLeak()
}

// GC releases the IP of a pod deleted without a CNI DEL, and reclaims an
// assigned IP whose wep vanished, only after the grace period.
func TestIPAM_GC_LeakedPodAndLeakedIP(t *testing.T) {
	e := newEnvIn(t, "gc", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 1
		c.IdleMax = 10
		c.PoolCheckPeriod = 200 * time.Millisecond
		c.GCPeriod = time.Hour
		c.LeakGrace = 2 * time.Second
	}), ownAddresses("10.61.0.0/20"))
	pods := e.createPods("p", 3)
	replies := e.allocateAll(pods, 3)
	if len(replies) != 3 {
		t.Fatalf("%d of 3 allocated", len(replies))
	}
	assigned := func() int { return e.stats(e.nodes[0]).Assigned }

	// Pod deleted behind the IPAM's back: its wep and IP go at the next GC.
	e.deletePod(pods[0].name)
	eventually(t, 10*time.Second, "pod deletion in the cache", func() bool { e.ipam.CollectGarbage(e.ctx); return !e.wepExists(pods[0].name) })
	if assigned() != 2 {
		t.Fatalf("after leaked-pod GC %d assigned, want 2", assigned())
	}
	eventually(t, 10*time.Second, "ReleasedLeakedPodIP event on the node", func() bool {
		evs, err := e.kube.CoreV1().Events(metav1.NamespaceDefault).List(e.ctx, metav1.ListOptions{FieldSelector: "reason=ReleasedLeakedPodIP"})
		return err == nil && len(evs.Items) > 0 && evs.Items[0].InvolvedObject.Name == e.nodes[0]
	})

	// The wep vanishes but the datastore still assigns the IP: a leak,
	// reclaimed only after LeakGrace.
	w, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, pods[1].name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.Finalizers = nil
	if _, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Update(e.ctx, w, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Delete(e.ctx, pods[1].name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.ipam.CollectGarbage(e.ctx)
	if assigned() != 2 {
		t.Fatal("a leak suspect was reclaimed before its grace period")
	}
	start := time.Now()
	eventually(t, 20*time.Second, "leaked IP reclaimed", func() bool { e.ipam.CollectGarbage(context.Background()); return assigned() == 1 })
	if waited := time.Since(start); waited < time.Second {
		t.Fatalf("leaked IP reclaimed after %s, before the 2s grace", waited)
	}
	if got := e.gauge("cce_ipam_gc_actions_total", "kind", "leaked_ip"); got != 1 {
		t.Fatalf("cce_ipam_gc_actions_total{kind=leaked_ip} = %v, want 1", got)
	}
	// The surviving pod is untouched.
	if !e.wepExists(pods[2].name) {
		t.Fatal("GC removed a live pod's wep")
	}
	e.checkNoLeak()
}
