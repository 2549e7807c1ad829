package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
	"github.com/cce-ipam/sharded/ipamcore/podip"
)

var _ podip.Backend = (*IPAM)(nil)

// ErrPoolExhausted is returned when a node's pool stayed empty for
// Config.AllocateWait; kubelet retries the ADD.
var ErrPoolExhausted = errors.New("no idle IP on the node")

// ErrWrongNode is returned for an ADD whose caller names a node the pod is
// not bound to.
var ErrWrongNode = errors.New("pod not bound to the calling node")

// Allocate implements podip.Backend: ordinary pods from the warm pool,
// fixed-IP StatefulSet pods their reserved address.
func (i *IPAM) Allocate(ctx context.Context, ref podip.PodRef) (podip.Endpoint, error) {
	unlock := i.podLock.lock(ref.Namespace + "/" + ref.Name)
	defer unlock()

	pod, err := i.getPod(ctx, ref)
	if err != nil {
		return podip.Endpoint{}, err
	}
	if ref.Node != "" && ref.Node != pod.Spec.NodeName {
		// An IP of another node's ENI would be useless to the caller's
		// sandbox: refuse rather than allocate where the pod is not.
		return podip.Endpoint{}, fmt.Errorf("%w: pod %s/%s is bound to node %s, the call came from node %s",
			ErrWrongNode, ref.Namespace, ref.Name, pod.Spec.NodeName, ref.Node)
	}
	n, done, ok := i.acquire(pod.Spec.NodeName)
	if !ok {
		return podip.Endpoint{}, fmt.Errorf("%w: %s", ErrNodeNotServed, pod.Spec.NodeName)
	}
	defer done()
	// A repeated ADD of the same sandbox gets the same answer. Only when
	// the datastore says this sandbox already holds an IP here is the wep
	// read, to see whether that was committed (else the ADD goes on and
	// commits it); a first ADD costs no read.
	if wep, ok := i.repeatedADD(ctx, n, ref); ok {
		i.metrics.allocations.WithLabelValues("ok", pathRepeat).Inc()
		return endpointOf(wep), nil
	}
	path := pathPool
	if isFixedIPPod(pod) {
		path = pathFixed
	}
	wep, err := i.allocate(ctx, pod, n, datastore.Owner{
		Namespace:   ref.Namespace,
		Name:        ref.Name,
		ContainerID: ref.ContainerID,
	})
	if err != nil {
		i.metrics.allocations.WithLabelValues("error", path).Inc()
		i.events.Eventf(pod, corev1.EventTypeWarning, "AllocateIPFailed", "allocate IP on node %s: %v", n.name, err)
		return podip.Endpoint{}, err
	}
	i.metrics.allocations.WithLabelValues("ok", path).Inc()
	if st, err := i.store.Stats(n.name, i.deps.Clock.Now()); err == nil && st.Idle < i.cfg.IdleMin {
		n.poke()
	}
	return endpointOf(wep), nil
}

// repeatedADD returns the committed wep of a sandbox that already holds an
// IP on the node.
func (i *IPAM) repeatedADD(ctx context.Context, n *node, ref podip.PodRef) (*cce.WorkloadEndpoint, bool) {
	held, err := i.store.LookupPod(n.name, datastore.PodKey{
		Namespace: ref.Namespace,
		Name:      ref.Name,
	})
	if err != nil || held.State != datastore.StateAssigned || held.Owner.ContainerID != ref.ContainerID {
		return nil, false
	}
	wep, err := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil || wep.Spec.ContainerID != ref.ContainerID || wep.Spec.Node != n.name || wep.Spec.IP != held.Addr.String() {
		return nil, false
	}
	return wep, true
}

// allocate takes an IP in the datastore and commits it with the wep; on a
// failed commit the IP goes back, unless the wep still reserves it (fixed).
func (i *IPAM) allocate(ctx context.Context, pod *corev1.Pod, n *node, owner datastore.Owner) (*cce.WorkloadEndpoint, error) {
	var (
		info   datastore.IPInfo
		fixed  bool
		subnet string
		err    error
	)
	if isFixedIPPod(pod) {
		if info, subnet, fixed, err = i.takeFixedIP(ctx, n, owner); err != nil {
			return nil, err
		}
	}
	if !fixed {
		if info, err = i.takeIP(ctx, n, owner, subnet); err != nil {
			return nil, err
		}
	}
	wep, err := i.commit(ctx, pod, n, info)
	if err != nil && !fixed {
		// Nothing names the IP: put it back in the pool.
		if _, rerr := i.store.Release(n.name, info.Addr, owner.ContainerID, i.deps.Clock.Now()); rerr != nil {
			i.log.Error("rollback of an uncommitted IP failed", "node", n.name, "ip", info.Addr, "err", rerr)
		}
	}
	// A fixed address stays assigned here, where the retried ADD finds it.
	return wep, err
}

// takeIP assigns an idle IP, waking the pool worker and waiting (bounded) for
// a refill when the pool is empty.
func (i *IPAM) takeIP(ctx context.Context, n *node, owner datastore.Owner, subnet string) (datastore.IPInfo, error) {
	// An IP the store already gave this pod (a new sandbox of the same pod,
	// or an ADD retried after a failed commit) is moved to the new sandbox.
	if held, err := i.store.LookupPod(n.name, datastore.PodKey{
		Namespace: owner.Namespace,
		Name:      owner.Name,
	}); err == nil &&
		held.State == datastore.StateAssigned {
		if held.Owner.ContainerID == owner.ContainerID {
			return held, nil
		}
		if _, err := i.store.Release(n.name, held.Addr, held.Owner.ContainerID, i.deps.Clock.Now()); err == nil {
			if info, err := i.store.AllocateSpecific(n.name, held.Addr, owner); err == nil {
				return info, nil
			}
		}
	}

	deadline := i.deps.Clock.NewTimer(i.cfg.AllocateWait)
	defer deadline.Stop()
	for {
		info, again, err := i.tryTake(ctx, n, datastore.Request{
			Owner:    owner,
			SubnetID: subnet,
		}, deadline.C())
		if !again {
			return info, err
		}
	}
}

// tryTake makes one attempt; again=true means a refill or a cooled address
// may now satisfy the next attempt.
func (i *IPAM) tryTake(ctx context.Context, n *node, req datastore.Request,
	deadline <-chan time.Time) (info datastore.IPInfo, again bool, err error) {
	// Register before trying so that a refill between the try and the
	// wait is not missed.
	refilled, done := n.waitRefill()
	defer done()
	info, err = i.store.Allocate(n.name, req, i.deps.Clock.Now())
	if err == nil || !errors.Is(err, datastore.ErrNoIdleIP) {
		return info, false, err
	}
	n.poke()
	var cooled <-chan time.Time
	var cooling *datastore.CoolingError
	if errors.As(err, &cooling) {
		t := i.deps.Clock.NewTimer(cooling.ReadyAt.Sub(i.deps.Clock.Now()))
		defer t.Stop()
		cooled = t.C()
	}
	select {
	case <-refilled:
		return datastore.IPInfo{}, true, nil
	case <-cooled:
		return datastore.IPInfo{}, true, nil
	case <-deadline:
		// The pool's last cloud error is the operator's context, not a
		// cause to branch on: callers see ErrPoolExhausted.
		return datastore.IPInfo{}, false, fmt.Errorf("%w %s after %s: %v",
			ErrPoolExhausted, n.name, i.cfg.AllocateWait, n.lastError()) //nolint:errorlint // see above
	case <-n.stopping:
		return datastore.IPInfo{}, false, fmt.Errorf("%w: %s (hand-over)", ErrNodeNotServed, n.name)
	case <-ctx.Done():
		return datastore.IPInfo{}, false, ctx.Err()
	}
}

// commit writes the WorkloadEndpoint: the allocation's commit point.
func (i *IPAM) commit(ctx context.Context, pod *corev1.Pod, n *node, info datastore.IPInfo) (*cce.WorkloadEndpoint, error) {
	tok, until, err := i.fenceFor(n.name)
	if err != nil {
		return nil, err
	}
	// The commit should not reach the API server after our right to write
	// for the node has ended (a pause in the middle of it). The deadline is
	// our clock's word only; the API server's fencing policy refuses a wep
	// whose token is no longer the partition's claim (fencing.go).
	ctx, cancel := fencedContext(ctx, until)
	defer cancel()
	want := i.newWEP(pod, n, info)
	if tok != nil {
		tok.Stamp(want)
	}
	if failpoint(fpBeforeWEPCreate, func() string { return n.name + " " + pod.Namespace + "/" + pod.Name }) {
		ctx = context.WithoutCancel(ctx) // a write already on the wire (see failpoint.go)
	}
	client := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(pod.Namespace)
	wep, err := client.Create(ctx, want, metav1.CreateOptions{})
	if err == nil {
		return wep, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create WorkloadEndpoint: %w", err)
	}
	// A wep of an earlier sandbox (or of this pod on another node): take it
	// over with the resourceVersion we read, so a concurrent writer loses.
	old, err := client.Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read existing WorkloadEndpoint: %w", err)
	}
	if old.Spec.Node != n.name || old.Spec.IP != info.Addr.String() {
		i.releaseStale(old)
	}
	want.ResourceVersion = old.ResourceVersion
	want.Finalizers = old.Finalizers
	wep, err = client.Update(ctx, want, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("update WorkloadEndpoint: %w", err)
	}
	return wep, nil
}

// releaseStale frees the IP an overwritten wep named, when this replica
// serves its node; otherwise the IP is left to that node's leaked-IP GC.
func (i *IPAM) releaseStale(old *cce.WorkloadEndpoint) {
	addr, err := netip.ParseAddr(old.Spec.IP)
	if err != nil {
		return
	}
	if _, ok := i.node(old.Spec.Node); !ok {
		return
	}
	if _, err := i.store.Release(old.Spec.Node, addr, old.Spec.ContainerID, i.deps.Clock.Now()); err != nil &&
		!errors.Is(err, datastore.ErrUnknownIP) && !errors.Is(err, datastore.ErrNotAssigned) {
		i.log.Warn("could not free the IP of an overwritten WorkloadEndpoint", "wep", old.Namespace+"/"+old.Name,
			"ip", old.Spec.IP, "err", err)
	}
}

func (i *IPAM) newWEP(pod *corev1.Pod, n *node, info datastore.IPInfo) *cce.WorkloadEndpoint {
	typ := cce.WorkloadEndpointTypePod
	labels := map[string]string{
		cce.LabelSubnetID:     info.SubnetID,
		cce.LabelInstanceType: cce.InstanceTypeBCC,
	}
	for _, ref := range pod.OwnerReferences {
		if ref.Kind == "StatefulSet" && ref.Controller != nil && *ref.Controller {
			typ = cce.WorkloadEndpointTypeStatefulSet
			labels[cce.LabelOwner] = ref.Name
		}
	}
	return &cce.WorkloadEndpoint{
		ObjectMeta: metav1.ObjectMeta{
			Name:       pod.Name,
			Namespace:  pod.Namespace,
			Labels:     labels,
			Finalizers: []string{cce.WorkloadEndpointFinalizer},
		},
		Spec: cce.WorkloadEndpointSpec{
			ContainerID:       info.Owner.ContainerID,
			IP:                info.Addr.String(),
			Type:              typ,
			Mac:               info.MAC,
			ENIID:             info.ENIID,
			Node:              n.name,
			InstanceID:        n.instanceID,
			SubnetID:          info.SubnetID,
			EnableFixIP:       pod.Annotations[cce.AnnotationStsEnableFixIP],
			FixIPDeletePolicy: pod.Annotations[cce.AnnotationStsPodFixIPDeletePolicy],
			UpdateAt:          metav1.NewTime(i.deps.Clock.Now()),
		},
	}
}

// getPod reads the pod from the watch of the node the plugin names, and from
// the API server when that may be behind: the node is not served here or
// the watch has not seen the pod yet (just bound), or it still holds a
// deleted predecessor of the same name. A CNI ADD happens only after the
// binding, so the live read sees it.
func (i *IPAM) getPod(ctx context.Context, ref podip.PodRef) (*corev1.Pod, error) {
	namespace, name := ref.Namespace, ref.Name
	pod, ok := i.cachedPod(ref.Node, namespace, name)
	var err error
	if !ok || pod.Spec.NodeName == "" || pod.DeletionTimestamp != nil || ref.Node != pod.Spec.NodeName {
		pod, err = i.deps.Kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	if pod.Spec.NodeName == "" {
		return nil, fmt.Errorf("pod %s/%s is not bound to a node", namespace, name)
	}
	return pod, nil
}

func endpointOf(w *cce.WorkloadEndpoint) podip.Endpoint {
	return podip.Endpoint{
		IP:                w.Spec.IP,
		Type:              w.Spec.Type,
		MAC:               w.Spec.Mac,
		Gateway:           w.Spec.Gw,
		ENIID:             w.Spec.ENIID,
		Node:              w.Spec.Node,
		SubnetID:          w.Spec.SubnetID,
		EnableFixIP:       w.Spec.EnableFixIP,
		FixIPDeletePolicy: w.Spec.FixIPDeletePolicy,
	}
}

// PodNode returns the node to route an ADD to: the node the plugin runs on
// when it names a known node (the owner checks the pod is bound there, see
// Allocate), else the node the pod is bound to, read from the API server.
func (i *IPAM) PodNode(ctx context.Context, ref podip.PodRef) (string, error) {
	if ref.Node != "" {
		if _, err := i.nodes.Get(ref.Node); err == nil {
			return ref.Node, nil
		}
	}
	pod, err := i.getPod(ctx, ref)
	if err != nil {
		return "", err
	}
	return pod.Spec.NodeName, nil
}

// EndpointNode returns the node of the pod's WorkloadEndpoint, for routing a
// release; ok=false when the pod has none (nothing to release anywhere).
func (i *IPAM) EndpointNode(ctx context.Context, ref podip.PodRef) (string, bool, error) {
	wep, err := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("get WorkloadEndpoint %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	return wep.Spec.Node, true, nil
}
