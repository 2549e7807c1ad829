package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// pod is one benchmark pod, bound to its node at creation; psts, when set,
// annotates it for that PodSubnetTopologySpread (as the mutating webhook
// does).
type pod struct {
	name, node string
	psts       string
}

// driver plays the CNI plugin directly: it creates pods bound to nodes and
// calls AllocateIP / ReleaseIP on the replica it is told to, timing each
// call. It also watches what it was given: an IP handed to a second pod
// while the first still holds it is an invariant violation.
type driver struct {
	kube kubernetes.Interface
	cce  cceclient.Interface
	ns   string

	seq atomic.Int64

	connMu sync.Mutex
	conns  map[string]*grpc.ClientConn

	heldMu     sync.Mutex
	held       map[string]holder // IP → who holds it
	violations []string
}

type holder struct {
	pod       string
	abandoned bool // release failed for good; GC may hand the IP out again
}

func newDriver(kube kubernetes.Interface, cc cceclient.Interface, ns string) *driver {
	return &driver{
		kube:  kube,
		cce:   cc,
		ns:    ns,
		conns: map[string]*grpc.ClientConn{},
		held:  map[string]holder{},
	}
}

func (d *driver) close() {
	d.connMu.Lock()
	defer d.connMu.Unlock()
	for _, c := range d.conns {
		_ = c.Close()
	}
}

func (d *driver) client(addr string) (rpc.CNIBackendClient, error) {
	d.connMu.Lock()
	defer d.connMu.Unlock()
	c, ok := d.conns[addr]
	if !ok {
		var err error
		if c, err = grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			return nil, err
		}
		d.conns[addr] = c
	}
	return rpc.NewCNIBackendClient(c), nil
}

// containerID returns a fresh infra container ID.
func (d *driver) containerID() string { return fmt.Sprintf("%064x", d.seq.Add(1)) }

// createPods creates perNode pods on each node (round-robin order, so that
// the first k of them spread evenly), conc at a time.
func (d *driver) createPods(ctx context.Context, prefix string, nodes []string, perNode, conc int) ([]pod, error) {
	return d.createPSTSPods(ctx, prefix, "", nodes, perNode, conc)
}

// createPSTSPods is createPods for pods of a PodSubnetTopologySpread
// (psts "" for ordinary pods). Their names, <prefix>-<seq>-<k>, end in an
// ordinal, as a Fixed PSTS asks.
func (d *driver) createPSTSPods(ctx context.Context, prefix, psts string, nodes []string, perNode, conc int) ([]pod, error) {
	pods := make([]pod, 0, len(nodes)*perNode)
	for k := range perNode {
		for _, n := range nodes {
			pods = append(pods, pod{
				name: fmt.Sprintf("%s-%d-%d", prefix, d.seq.Add(1), k),
				node: n,
				psts: psts,
			})
		}
	}
	err := parallel(ctx, len(pods), conc, func(ctx context.Context, i int) error {
		return retry(ctx, 30*time.Second, func() error { return d.createPod(ctx, pods[i]) })
	})
	return pods, err
}

func (d *driver) createPod(ctx context.Context, p pod) error {
	var ann map[string]string
	if p.psts != "" {
		ann = map[string]string{cce.AnnotationPodSubnetTopologySpread: p.psts}
	}
	_, err := d.kube.CoreV1().Pods(d.ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        p.name,
			Labels:      map[string]string{"app": "bench"},
			Annotations: ann,
		},
		Spec: corev1.PodSpec{NodeName: p.node, TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name:  "c",
				Image: "registry.k8s.io/pause:3.10",
			}}},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// setRunning writes the pod's Running status with its IP, as kubelet does
// after a successful ADD.
func (d *driver) setRunning(ctx context.Context, p pod, ip string) error {
	now := metav1.Now()
	st := corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, StartTime: &now,
		Conditions: []corev1.PodCondition{{
			Type:               corev1.PodReady,
			Status:             corev1.ConditionTrue,
			LastTransitionTime: now,
		}}}
	obj := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      p.name,
			Namespace: d.ns,
		},
		Status: st,
	}
	return retry(ctx, 30*time.Second, func() error {
		cur, err := d.kube.CoreV1().Pods(d.ns).Get(ctx, p.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status = obj.Status
		_, err = d.kube.CoreV1().Pods(d.ns).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

func (d *driver) deletePods(ctx context.Context, pods []pod, conc int) error {
	return parallel(ctx, len(pods), conc, func(ctx context.Context, i int) error {
		err := d.kube.CoreV1().Pods(d.ns).Delete(ctx, pods[i].name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
}

// allocate makes one AllocateIP call at addr and returns the IP and the
// call's duration.
func (d *driver) allocate(ctx context.Context, addr string, p pod, cid string, timeout time.Duration) (string, time.Duration, error) {
	c, err := d.client(addr)
	if err != nil {
		return "", 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	reply, err := c.AllocateIP(ctx, &rpc.AllocateIPRequest{K8SPodName: p.name, K8SPodNamespace: d.ns,
		K8SPodInfraContainerID: cid, K8SNodeName: p.node, IPType: rpc.IPType_BCCMultiENIMultiIPType})
	took := time.Since(start)
	switch {
	case err != nil:
		return "", took, err
	case !reply.IsSuccess:
		return "", took, errors.New(reply.ErrMsg)
	case reply.GetENIMultiIP().GetIP() == "":
		return "", took, errors.New("AllocateIP succeeded without an IP")
	}
	ip := reply.GetENIMultiIP().GetIP()
	d.heldMu.Lock()
	if h, ok := d.held[ip]; ok && h.pod != p.name && !h.abandoned {
		d.violations = append(d.violations, fmt.Sprintf("DUPLICATE IP %s: given to %s while %s holds it", ip, p.name, h.pod))
	}
	d.held[ip] = holder{pod: p.name}
	d.heldMu.Unlock()
	return ip, took, nil
}

// allocateRetry retries AllocateIP, each attempt at a replica picked by
// target, until it succeeds or within fails.
func (d *driver) allocateRetry(ctx context.Context, target func() string, p pod, cid string, within time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		addr := target()
		if addr == "" {
			last = errors.New("no live replica")
		} else {
			ip, _, err := d.allocate(ctx, addr, p, cid, 30*time.Second)
			if err == nil {
				return ip, nil
			}
			last = err
		}
		sleep(ctx, 200*time.Millisecond)
	}
	return "", gaveUp("allocate "+p.name, ctx.Err(), last)
}

// release frees ip of p (container cid) at a replica picked by target,
// retrying for up to within; after that the IP is abandoned to the GC.
func (d *driver) release(ctx context.Context, target func() string, p pod, cid, ip string, within time.Duration) error {
	rctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var last error
	for rctx.Err() == nil {
		addr := target()
		if addr == "" {
			last = errors.New("no live replica")
			sleep(rctx, 200*time.Millisecond)
			continue
		}
		c, err := d.client(addr)
		if err != nil {
			return err
		}
		cctx, ccancel := context.WithTimeout(rctx, 30*time.Second)
		reply, err := c.ReleaseIP(cctx, &rpc.ReleaseIPRequest{K8SPodName: p.name, K8SPodNamespace: d.ns,
			K8SPodInfraContainerID: cid, IPType: rpc.IPType_BCCMultiENIMultiIPType})
		ccancel()
		if err == nil && reply.IsSuccess {
			d.heldMu.Lock()
			if h, ok := d.held[ip]; ok && h.pod == p.name {
				delete(d.held, ip)
			}
			d.heldMu.Unlock()
			return nil
		}
		if err == nil {
			err = errors.New(reply.ErrMsg)
		}
		last = err
		sleep(rctx, 200*time.Millisecond)
	}
	d.heldMu.Lock()
	if h, ok := d.held[ip]; ok && h.pod == p.name {
		d.held[ip] = holder{
			pod:       p.name,
			abandoned: true,
		}
	}
	d.heldMu.Unlock()
	return gaveUp("release "+p.name, rctx.Err(), last)
}

// Violations returns the invariant violations the driver saw.
func (d *driver) Violations() []string {
	d.heldMu.Lock()
	defer d.heldMu.Unlock()
	return append([]string(nil), d.violations...)
}

// floorNode is the node the floor's bare weps name (runKnee makes it exist).
const floorNode = "floor-node"

// floorCreate creates one bare WorkloadEndpoint (the floor) and returns the
// call's duration.
func (d *driver) floorCreate(ctx context.Context, ns, name string, i int) (time.Duration, error) {
	w := &cce.WorkloadEndpoint{
		ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: map[string]string{"app": "bench-floor"},
		},
		Spec: cce.WorkloadEndpointSpec{IP: fmt.Sprintf("192.168.%d.%d", (i/250)%250, i%250+1), Node: floorNode,
			ContainerID: d.containerID(), Type: cce.WorkloadEndpointTypePod, Mac: "fa:26:00:00:00:01",
			ENIID: "eni-floor", InstanceID: "i-floor", SubnetID: "sbn-floor", UpdateAt: metav1.Now()},
	}
	start := time.Now()
	_, err := d.cce.CceV1alpha1().WorkloadEndpoints(ns).Create(ctx, w, metav1.CreateOptions{})
	return time.Since(start), err
}

func (d *driver) floorDeleteAll(ctx context.Context, ns string) error {
	return d.cce.CceV1alpha1().WorkloadEndpoints(ns).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: "app=bench-floor"})
}

// parallel runs fn(0..n-1) with at most conc at once and returns the first
// error (the others still finish).
func parallel(ctx context.Context, n, conc int, fn func(ctx context.Context, i int) error) error {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	for range min(conc, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(ctx, i); err != nil {
					errMu.Lock()
					if first == nil {
						first = err
					}
					errMu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// retry calls fn until it succeeds or within has passed.
func retry(ctx context.Context, within time.Duration, fn func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := fn()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		sleep(ctx, time.Duration(100+rand.IntN(200))*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// gaveUp is the error of a retry loop that ran out of time: the deadline,
// and the last attempt's error when there was one.
func gaveUp(what string, deadline, last error) error {
	if last == nil {
		return fmt.Errorf("%s: %w", what, deadline)
	}
	return fmt.Errorf("%s: %w (last: %w)", what, deadline, last)
}
