package kubeletsim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// podState is what the simulated kubelet and container runtime remember of a
// pod: its current sandbox and a failed one still to be torn down.
type podState struct {
	uid       types.UID
	firstSeen time.Time
	sandbox   string // infra container ID of the sandbox holding ip
	ip        string
	teardown  string // infra container ID of a failed sandbox awaiting DEL
	running   bool   // the Running status with ip was written
}

// containerIDPrefix marks the sandbox ID the simulator writes into container
// statuses, so that a restarted simulator can still DEL it.
const containerIDPrefix = "kubelet-sim://"

// newContainerID returns a fresh infra container ID (64 hex digits, like
// containerd's).
func newContainerID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// sandboxFromStatus recovers the sandbox ID and IP a previous simulator wrote.
func sandboxFromStatus(pod *corev1.Pod) (id, ip string, ok bool) {
	for _, cs := range pod.Status.ContainerStatuses {
		if id, ok := strings.CutPrefix(cs.ContainerID, containerIDPrefix); ok && id != "" {
			return id, pod.Status.PodIP, true
		}
	}
	return "", "", false
}

func (s *Simulator) state(key string) *podState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pods[key]
}

func (s *Simulator) setState(key string, st *podState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st == nil {
		delete(s.pods, key)
	} else {
		s.pods[key] = st
	}
}

// ManualScheduler is a schedulerName the simulator does not bind: a test
// that must choose a pod's node (e.g. to move a fixed-IP StatefulSet pod to
// a node another replica owns) binds such pods itself.
const ManualScheduler = "e2e-manual"

// sync moves one pod a step towards what its object asks for. An error means
// retry with backoff; after > 0 means look again then.
func (s *Simulator) sync(ctx context.Context, rt *runState, key string) (after time.Duration, err error) {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return 0, nil
	}
	pod, err := rt.pods.Pods(namespace).Get(name)
	if err != nil && !apierrors.IsNotFound(err) {
		return 0, err
	}
	st := s.state(key)
	if pod == nil || (st != nil && st.uid != pod.UID) {
		// The pod is gone, or is a new pod of the same name: finish the old
		// sandbox first, as the container runtime would.
		if st != nil {
			if err := s.teardown(ctx, rt, namespace, name, st); err != nil {
				return 0, err
			}
			s.setState(key, nil)
		}
		if pod == nil {
			s.mu.Lock()
			s.place.forget(key)
			s.mu.Unlock()
			return 0, nil
		}
		st = nil
	}
	if pod.Spec.NodeName == "" {
		if s.cfg.NoScheduling || pod.DeletionTimestamp != nil || pod.Spec.SchedulerName == ManualScheduler {
			return 0, nil
		}
		return s.bind(ctx, pod, key)
	}
	s.mu.Lock()
	ours := s.place.hasNode(pod.Spec.NodeName)
	if ours {
		s.place.assign(key, pod.Spec.NodeName)
	}
	s.mu.Unlock()
	if !ours || pod.Spec.HostNetwork {
		return 0, nil // another kubelet's pod, or one without a CNI sandbox
	}
	if st == nil {
		st = &podState{
			uid:       pod.UID,
			firstSeen: time.Now(),
		}
		if id, ip, ok := sandboxFromStatus(pod); ok {
			s.setSandbox(st, id, ip)
			st.running = pod.Status.Phase == corev1.PodRunning
		}
		s.setState(key, st)
	}
	if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return 0, s.kill(ctx, rt, pod, st)
	}
	return 0, s.start(ctx, rt, pod, st)
}

// bind schedules an unscheduled pod on the least loaded simulated node.
func (s *Simulator) bind(ctx context.Context, pod *corev1.Pod, key string) (time.Duration, error) {
	s.mu.Lock()
	node, ok := s.place.pick()
	if ok {
		s.place.assign(key, node) // count it now, so the next pick spreads
	}
	s.mu.Unlock()
	if !ok {
		return time.Second, nil // no node with room (yet)
	}
	err := s.deps.Kube.CoreV1().Pods(pod.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{
			Name:      pod.Name,
			Namespace: pod.Namespace,
			UID:       pod.UID,
		},
		Target: corev1.ObjectReference{
			Kind: "Node",
			Name: node,
		},
	}, metav1.CreateOptions{})
	switch {
	case err == nil:
		s.counts.binds.Add(1)
		s.metrics.binds.WithLabelValues("ok").Inc()
		return 0, nil
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		// Deleted, or bound by someone else meanwhile: the informer will tell.
		s.mu.Lock()
		s.place.forget(key)
		s.mu.Unlock()
		return 0, nil
	default:
		s.mu.Lock()
		s.place.forget(key)
		s.mu.Unlock()
		s.counts.bindErrors.Add(1)
		s.metrics.binds.WithLabelValues("error").Inc()
		return 0, fmt.Errorf("bind to %s: %w", node, err)
	}
}

// start runs the pod: ADD with a fresh sandbox (after tearing down a failed
// one), then the Running status.
func (s *Simulator) start(ctx context.Context, rt *runState, pod *corev1.Pod, st *podState) error {
	if st.running && st.sandbox != "" {
		return nil // our Running status was written; the cache may lag
	}
	if st.teardown != "" {
		if err := s.release(ctx, rt, pod.Namespace, pod.Name, st.teardown); err != nil {
			rt.events.Eventf(pod, corev1.EventTypeWarning, "FailedKillPod",
				"error killing pod: failed to \"KillPodSandbox\" for %q: plugin type=\"eni-ipam\" failed (delete): %v", st.teardown, err)
			return err
		}
		st.teardown = ""
	}
	if st.sandbox == "" {
		id := newContainerID()
		ip, err := s.allocate(ctx, rt, pod.Namespace, pod.Name, id, pod.Spec.NodeName)
		if err != nil {
			rt.events.Eventf(pod, corev1.EventTypeWarning, "FailedCreatePodSandBox",
				"Failed to create pod sandbox: plugin type=\"eni-ipam\" failed (add): %v", err)
			// The runtime cleans up the failed sandbox's network at once and
			// keeps trying until the DEL succeeds.
			if s.release(ctx, rt, pod.Namespace, pod.Name, id) != nil {
				st.teardown = id
			}
			return err
		}
		s.setSandbox(st, id, ip)
		st.running = false
	}
	if err := s.setRunning(ctx, pod, st); err != nil {
		s.counts.statusErrors.Add(1)
		return err
	}
	if !st.running {
		st.running = true
		s.counts.started.Add(1)
		d := time.Since(st.firstSeen)
		s.counts.startupLatency.add(d)
		s.metrics.startup.Observe(d.Seconds())
	}
	return nil
}

// kill tears the pod's sandbox down (DEL) and, for a pod being deleted,
// removes the object as kubelet finishes a graceful deletion.
func (s *Simulator) kill(ctx context.Context, rt *runState, pod *corev1.Pod, st *podState) error {
	if err := s.teardown(ctx, rt, pod.Namespace, pod.Name, st); err != nil {
		rt.events.Eventf(pod, corev1.EventTypeWarning, "FailedKillPod",
			"error killing pod: failed to \"KillPodSandbox\": plugin type=\"eni-ipam\" failed (delete): %v", err)
		return err
	}
	if pod.DeletionTimestamp == nil {
		return nil // finished (Succeeded/Failed) pods stay until deleted
	}
	zero := int64(0)
	err := s.deps.Kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID},
	})
	switch {
	case err == nil:
		s.counts.deleted.Add(1)
	case !apierrors.IsNotFound(err) && !apierrors.IsConflict(err):
		return fmt.Errorf("delete pod: %w", err)
	}
	return nil
}

// teardown releases every sandbox st still holds.
func (s *Simulator) teardown(ctx context.Context, rt *runState, namespace, name string, st *podState) error {
	for _, id := range []*string{&st.teardown, &st.sandbox} {
		if *id == "" {
			continue
		}
		if err := s.release(ctx, rt, namespace, name, *id); err != nil {
			return err
		}
		if id == &st.sandbox {
			s.setSandbox(st, "", "")
		}
		*id = ""
	}
	st.running = false
	return nil
}

// setSandbox records the pod's current sandbox ("" for none) and keeps the
// count of sandboxes that Stats reports.
func (s *Simulator) setSandbox(st *podState, id, ip string) {
	switch {
	case st.sandbox == "" && id != "":
		s.counts.sandboxes.Add(1)
	case st.sandbox != "" && id == "":
		s.counts.sandboxes.Add(-1)
	}
	st.sandbox, st.ip = id, ip
}

// setRunning writes the status kubelet would after the sandbox and
// containers started.
func (s *Simulator) setRunning(ctx context.Context, pod *corev1.Pod, st *podState) error {
	client := s.deps.Kube.CoreV1().Pods(pod.Namespace)
	upd := pod.DeepCopy()
	upd.Status = runningStatus(pod, st.sandbox, st.ip, time.Now())
	_, err := client.UpdateStatus(ctx, upd, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		// The cache was behind: read the pod once more and write again.
		cur, gerr := client.Get(ctx, pod.Name, metav1.GetOptions{})
		if gerr != nil {
			return fmt.Errorf("set pod status: %w", gerr)
		}
		if cur.UID != pod.UID || cur.DeletionTimestamp != nil {
			return fmt.Errorf("set pod status: pod changed (deleted or replaced)")
		}
		cur.Status = runningStatus(cur, st.sandbox, st.ip, time.Now())
		_, err = client.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("set pod status: %w", err)
	}
	return nil
}

// runningStatus is the status of pod with every container running in the
// sandbox id at ip.
func runningStatus(pod *corev1.Pod, id, ip string, now time.Time) corev1.PodStatus {
	t := metav1.NewTime(now)
	start := t
	if pod.Status.StartTime != nil {
		start = *pod.Status.StartTime
	}
	cond := func(typ corev1.PodConditionType) corev1.PodCondition {
		return corev1.PodCondition{
			Type:               typ,
			Status:             corev1.ConditionTrue,
			LastTransitionTime: t,
		}
	}
	st := corev1.PodStatus{
		Phase:     corev1.PodRunning,
		PodIP:     ip,
		PodIPs:    []corev1.PodIP{{IP: ip}},
		StartTime: &start,
		QOSClass:  pod.Status.QOSClass,
		Conditions: []corev1.PodCondition{
			cond(corev1.PodScheduled), cond(corev1.PodInitialized), cond(corev1.ContainersReady), cond(corev1.PodReady),
		},
	}
	for _, c := range pod.Spec.Containers {
		st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: ptrTrue(),
			ContainerID: containerIDPrefix + id,
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: start}},
		})
	}
	return st
}

func ptrTrue() *bool { b := true; return &b }
