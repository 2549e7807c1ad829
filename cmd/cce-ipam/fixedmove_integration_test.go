//go:build integration

package main_test

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/e2e/fleet"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// A fixed-IP StatefulSet pod moves to a node of another replica and back,
// then off its first node once that node is deleted. The old node's owner
// (for a deleted node, the holder of its partition) frees the address,
// reached through the router's forwarded move; the pod keeps its address,
// on the ENI of the node it runs on, and no stranger on the node it left
// gets it.
func TestSharding_FixedIPMovesAcrossReplicas(t *testing.T) {
	e := startShards(t, fleet.Options{
		Name:     "fixedmove",
		Replicas: 2,
	}, 12)
	r0, r1 := e.Replica(0), e.Replica(1)
	holders, _ := e.settle(90 * time.Second)
	name0, name1 := e.memberName(r0), e.memberName(r1)
	var nodeA, nodeB string
	for _, n := range e.Nodes() {
		switch {
		case holders[n] == name0 && nodeA == "":
			nodeA = n
		case holders[n] == name1 && nodeB == "":
			nodeB = n
		}
	}
	if nodeA == "" || nodeB == "" {
		t.Fatalf("want a node of each replica, holders: %v", holders)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sts, err := e.Kube.AppsV1().StatefulSets(e.ns).Create(ctx, &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "mv"},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "mv"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "mv"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name:  "c",
					Image: "pause",
				}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const pod = "mv-0"
	place := func(node string) {
		t.Helper()
		_, err := e.Kube.CoreV1().Pods(e.ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: pod, Annotations: map[string]string{cce.AnnotationStsEnableFixIP: cce.EnableFixIPTrue},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name,
					UID: sts.UID, Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{
				NodeName: node,
				Containers: []corev1.Container{{
					Name:  "c",
					Image: "pause",
				}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	remove := func(via *fleet.Replica) {
		t.Helper()
		reply, err := e.release(ctx, via, pod)
		if err != nil || !reply.IsSuccess {
			t.Fatalf("DEL of %s = %v, %v", pod, reply, err)
		}
		if err := e.Kube.CoreV1().Pods(e.ns).Delete(ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := e.Kube.CoreV1().Pods(e.ns).Get(ctx, pod, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var results []result
	// Each ADD goes to the replica that does not own the node, so the
	// call itself is forwarded too.
	place(nodeA)
	fixed, err := e.allocate(ctx, r1, pod)
	if err != nil {
		t.Fatal(err)
	}
	remove(r1)
	place(nodeB)
	ip, err := e.allocate(ctx, r0, pod)
	if err != nil || ip != fixed {
		t.Fatalf("on %s (%s) got %q, %v; want the fixed %s", nodeB, name1, ip, err, fixed)
	}
	e.checkIPs(ctx, []result{{
		pod:  pod,
		node: nodeB,
		ip:   ip,
	}})
	remove(r0)
	place(nodeA)
	if ip, err = e.allocate(ctx, r1, pod); err != nil || ip != fixed {
		t.Fatalf("back on %s (%s) got %q, %v; want the fixed %s", nodeA, name0, ip, err, fixed)
	}
	results = append(results, result{
		pod:  pod,
		node: nodeA,
		ip:   ip,
	})
	// Strangers on the node the pod left never get its address.
	for range 8 {
		p, err := e.newPod(ctx, nodeB)
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.allocate(ctx, r1, p)
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, result{
			pod:  p,
			node: nodeB,
			ip:   got,
		})
	}
	e.checkIPs(ctx, results)

	// Node A is deleted (a scale-down) after the pod left it: nobody serves
	// A any more, but the address is still on A's ENI. The holder of A's
	// partition frees it there, reached through the forwarded move, and the
	// pod starts on B with its address.
	remove(r1)
	if err := e.Kube.CoreV1().Nodes().Delete(ctx, nodeA, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	place(nodeB)
	ip, err = e.allocate(ctx, r0, pod)
	if err != nil || ip != fixed {
		t.Fatalf("on %s after %s was deleted got %q, %v; want the fixed %s", nodeB, nodeA, ip, err, fixed)
	}
	e.checkIPs(ctx, []result{{
		pod:  pod,
		node: nodeB,
		ip:   ip,
	}})
	if moves := e.metric(r0, "cce_ipam_shard_forwarded_requests_total", okResult) +
		e.metric(r1, "cce_ipam_shard_forwarded_requests_total", okResult); moves < 5 {
		t.Errorf("%v forwarded calls, want the 3 ADDs, the DELs and the 2 moves", moves)
	}
}
