//go:build integration

package chaos_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/kubeletsim"
	"github.com/cce-ipam/sharded/e2e/suites/suite"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// fixedSet is a fixed-IP StatefulSet (cce.io/sts-enable-fix-ip: "True")
// whose pods the test schedules itself (schedulerName
// kubeletsim.ManualScheduler): the real StatefulSet controller recreates a
// deleted pod under its old name, and the binder puts the new incarnation
// on a node that a replica other than the old node's owner holds, so that
// the fixed IP has to move between shards. The kubelet simulator drives the
// CNI DEL of the old sandbox and the ADD of the new one.
type fixedSet struct {
	f        *fleet.Fleet
	ns, name string
	replicas int
	// template gives the pods their kind of fixed address (annotations,
	// requests); the set adds its label, scheduler and grace period.
	template func(*corev1.PodTemplateSpec)
	// bare: the set is the bare pods <name>-<i>, which it creates again
	// when they are gone (a PSTS custom-reuse workload), not a
	// StatefulSet.
	bare bool
	// mustKeep: a pod that comes back with another address than its last
	// fails the test (PSTS Fixed and reuse: the address's IPClaim keeps it
	// the pod's); otherwise it is logged and counted.
	mustKeep bool

	mu   sync.Mutex
	rng  *rand.Rand
	last map[string]placed // pod name → where and with which IP it last ran
	// scaledAway are pods a scale-down removed: GC may release their
	// reservations, so their next incarnation may get another IP.
	scaledAway map[string]bool
	// Counters for the result line.
	binds, crossReplica, sameReplica int
	keptIP, changedIP, renewedIP     int
	deleted, recreated               int
	bindErrs                         int
}

type placed struct {
	uid  types.UID
	node string
	ip   string
}

// newFixedSet is the ordinary fixed-IP StatefulSet (cce.io/sts-enable-fix-ip).
func newFixedSet(f *fleet.Fleet, ns string, replicas int, seed uint64) *fixedSet {
	s := newSet(f, ns, "fixed", replicas, seed)
	s.template = func(tpl *corev1.PodTemplateSpec) {
		tpl.Annotations = map[string]string{cce.AnnotationStsEnableFixIP: cce.EnableFixIPTrue}
	}
	return s
}

func newSet(f *fleet.Fleet, ns, name string, replicas int, seed uint64) *fixedSet {
	return &fixedSet{f: f, ns: ns, name: name, replicas: replicas, rng: rand.New(rand.NewPCG(seed, seed^0xf1ed)),
		last: map[string]placed{}, scaledAway: map[string]bool{}}
}

func (s *fixedSet) selector() string { return "app=" + s.name }

// podTemplate is the set's pod: its template, its label, scheduled by the
// set, and a grace period in which the kubelet simulator sees it
// terminating and DELs first.
func (s *fixedSet) podTemplate() corev1.PodTemplateSpec {
	tpl := corev1.PodTemplateSpec{Spec: suite.PodSpec(s.f)}
	if s.template != nil {
		s.template(&tpl)
	}
	if tpl.Labels == nil {
		tpl.Labels = map[string]string{}
	}
	tpl.Labels["app"] = s.name
	tpl.Spec.SchedulerName = kubeletsim.ManualScheduler
	tpl.Spec.TerminationGracePeriodSeconds = ptr.To[int64](2)
	return tpl
}

// create makes the StatefulSet (parallel pod management, so a deleted pod
// comes back at once), or the bare pods.
func (s *fixedSet) create(ctx context.Context, t *testing.T) {
	t.Helper()
	tpl := s.podTemplate()
	if s.bare {
		for i := range s.replicas {
			if err := s.createPod(ctx, fmt.Sprintf("%s-%d", s.name, i)); err != nil {
				t.Fatalf("create pod of %s: %v", s.name, err)
			}
		}
		return
	}
	_, err := s.f.Kube.AppsV1().StatefulSets(s.ns).Create(ctx, &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: s.name},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To(int32(s.replicas)), Selector: &metav1.LabelSelector{MatchLabels: tpl.Labels},
			PodManagementPolicy: appsv1.ParallelPodManagement, Template: tpl},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create StatefulSet %s: %v", s.name, err)
	}
}

// createPod creates one bare pod of the set.
func (s *fixedSet) createPod(ctx context.Context, name string) error {
	tpl := s.podTemplate()
	_, err := s.f.Kube.CoreV1().Pods(s.ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: tpl.Labels, Annotations: tpl.Annotations},
		Spec:       tpl.Spec,
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// run binds the StatefulSet's unscheduled pods and records where each
// Running pod is, until ctx ends.
func (s *fixedSet) run(ctx context.Context, t *testing.T) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		list, err := s.f.Kube.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{LabelSelector: s.selector()})
		if err != nil {
			continue // kube-apiserver restarting
		}
		sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
		if s.bare {
			s.recreate(ctx, list.Items)
		}
		for i := range list.Items {
			p := &list.Items[i]
			switch {
			case p.DeletionTimestamp != nil:
			case p.Spec.NodeName == "":
				s.bind(ctx, t, p)
			case suite.Running(p):
				s.observe(t, p)
			}
		}
	}
}

// recreate creates the bare pods that are gone (deleted by roll), under
// their names: the same pod, as a controller of bare pods would.
func (s *fixedSet) recreate(ctx context.Context, pods []corev1.Pod) {
	present := map[string]bool{}
	for _, p := range pods {
		present[p.Name] = true
	}
	for i := range s.replicas {
		name := fmt.Sprintf("%s-%d", s.name, i)
		if present[name] {
			continue
		}
		if err := s.createPod(ctx, name); err == nil {
			s.mu.Lock()
			s.recreated++
			s.mu.Unlock()
		}
	}
}

func (s *fixedSet) observe(t *testing.T, p *corev1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, ok := s.last[p.Name]
	if ok && prev.uid == p.UID {
		return
	}
	switch {
	case ok && s.scaledAway[p.Name]:
		s.renewedIP++ // its reservation may have been collected
		delete(s.scaledAway, p.Name)
	case ok:
		if prev.ip == p.Status.PodIP {
			s.keptIP++
		} else {
			s.changedIP++
			report := t.Logf
			if s.mustKeep {
				report = t.Errorf
			}
			report("chaos: fixed-IP pod %s came back on %s with %s, not its fixed IP %s (from %s)",
				p.Name, p.Spec.NodeName, p.Status.PodIP, prev.ip, prev.node)
		}
	}
	s.last[p.Name] = placed{uid: p.UID, node: p.Spec.NodeName, ip: p.Status.PodIP}
}

// bind puts the pod on a node another replica owns than the one of its last
// node (any node the first time).
func (s *fixedSet) bind(ctx context.Context, t *testing.T, p *corev1.Pod) {
	nodes := s.f.Nodes()
	sort.Strings(nodes)
	s.mu.Lock()
	prev, moved := s.last[p.Name]
	s.mu.Unlock()
	var target string
	cross := false
	if moved {
		owners := map[string]int{}
		for _, n := range nodes {
			if i, err := s.f.NodeOwner(ctx, n); err == nil {
				owners[n] = i
			}
		}
		from, known := owners[prev.node]
		var others []string
		for _, n := range nodes {
			if o, ok := owners[n]; ok && known && o != from {
				others = append(others, n)
			}
		}
		if len(others) > 0 {
			s.mu.Lock()
			target = others[s.rng.IntN(len(others))]
			s.mu.Unlock()
			cross = true
		} else {
			// Ownership unknown (replicas down) or one replica holds all:
			// at least another node.
			var rest []string
			for _, n := range nodes {
				if n != prev.node {
					rest = append(rest, n)
				}
			}
			nodes = rest
		}
	}
	if target == "" {
		s.mu.Lock()
		target = nodes[s.rng.IntN(len(nodes))]
		s.mu.Unlock()
	}
	err := s.f.Kube.CoreV1().Pods(p.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: target},
	}, metav1.CreateOptions{})
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			s.bindErrs++
		}
		return
	}
	s.binds++
	switch {
	case !moved:
	case cross:
		s.crossReplica++
		t.Logf("chaos: fixed-IP pod %s (IP %s) moves from %s to %s, a node of another replica", p.Name, prev.ip, prev.node, target)
	default:
		s.sameReplica++
		t.Logf("chaos: fixed-IP pod %s (IP %s) moves from %s to %s (owners unknown)", p.Name, prev.ip, prev.node, target)
	}
}

// roll deletes n Running pods of the set, picked by the test's seeded rng;
// the controller recreates them and the binder moves them. It returns the
// pods deleted.
func (s *fixedSet) roll(ctx context.Context, rng *rand.Rand, n int) ([]string, error) {
	list, err := s.f.Kube.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{LabelSelector: s.selector()})
	if err != nil {
		return nil, err
	}
	var running []string
	for i := range list.Items {
		if suite.Running(&list.Items[i]) {
			running = append(running, list.Items[i].Name)
		}
	}
	sort.Strings(running)
	var out []string
	for range n {
		if len(running) == 0 {
			break
		}
		k := rng.IntN(len(running))
		name := running[k]
		running = append(running[:k], running[k+1:]...)
		if err := s.f.Kube.CoreV1().Pods(s.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return out, err
		}
		out = append(out, name)
	}
	s.mu.Lock()
	s.deleted += len(out)
	s.mu.Unlock()
	return out, nil
}

// scale sets the StatefulSet's replicas: scaling down makes the
// reservations of the pods above the new size garbage for GC.
func (s *fixedSet) scale(ctx context.Context, n int) error {
	s.mu.Lock()
	for i := n; i < s.replicas; i++ {
		s.scaledAway[fmt.Sprintf("%s-%d", s.name, i)] = true
	}
	s.mu.Unlock()
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)
	_, err := s.f.Kube.AppsV1().StatefulSets(s.ns).Patch(ctx, s.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

func (s *fixedSet) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	what := "StatefulSet"
	if s.bare {
		what = fmt.Sprintf("bare (%d recreated)", s.recreated)
	}
	return fmt.Sprintf("%d %s pods of %s deleted and rebound (%d binds: %d to another replica's node, %d owner unknown; %d bind errors), %d came back with their fixed IP, %d with another, %d after a scale-down",
		s.deleted, what, s.name, s.binds, s.crossReplica, s.sameReplica, s.bindErrs, s.keptIP, s.changedIP, s.renewedIP)
}
