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
	// A repeated ADD of the same sandbox gets the same answer, from the wep
	// this replica committed for it (else the ADD goes on and commits it).
	if ep, ok := i.repeatedADD(n, ref); ok {
		i.metrics.allocations.WithLabelValues("ok", pathRepeat).Inc()
		return ep, nil
	}
	spread, err := i.pstsOf(ctx, pod)
	if err != nil {
		i.metrics.allocations.WithLabelValues("error", pathPSTS).Inc()
		i.events.Eventf(pod, corev1.EventTypeWarning, "AllocateIPFailed", "allocate IP on node %s: %v", n.name, err)
		return podip.Endpoint{}, err
	}
	owner := datastore.Owner{
		Namespace:   ref.Namespace,
		Name:        ref.Name,
		ContainerID: ref.ContainerID,
	}
	var (
		path = pathPool
		wep  *cce.WorkloadEndpoint
	)
	switch {
	case spread != nil:
		path = pathPSTS
		wep, err = i.allocatePSTS(ctx, pod, n, owner, spread)
	default:
		if isFixedIPPod(pod) {
			path = pathFixed
		}
		wep, err = i.allocate(ctx, pod, n, owner)
	}
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

// repeatedADD answers a repeated ADD of a sandbox that already holds an IP
// on the node, and whose wep this replica committed: from what it knows, with
// no request (REQUESTS.md, "Repeated ADD"). An assignment the datastore holds
// without a known wep (a fixed IP whose commit failed stays assigned) goes on
// to commit.
func (i *IPAM) repeatedADD(n *node, ref podip.PodRef) (podip.Endpoint, bool) {
	rec, ok := i.knownFor(n, ref)
	if !ok {
		return podip.Endpoint{}, false
	}
	return rec.ep, true
}

// allocate takes an IP in the datastore and commits it with the wep; on a
// failed commit the IP goes back, unless the wep still reserves it (fixed).
func (i *IPAM) allocate(ctx context.Context, pod *corev1.Pod, n *node, owner datastore.Owner) (*cce.WorkloadEndpoint, error) {
	var (
		info   datastore.IPInfo
		fixed  bool
		subnet string
		old    *cce.WorkloadEndpoint // the pod's wep as last read or written, if any
		err    error
	)
	if isFixedIPPod(pod) {
		if info, subnet, fixed, old, err = i.takeFixedIP(ctx, n, owner); err != nil {
			return nil, err
		}
	}
	if !fixed {
		if info, err = i.takeIP(ctx, n, owner, subnet); err != nil {
			return nil, err
		}
	}
	if !isFixedIPPod(pod) {
		old = i.knownOld(n, owner.Pod()) // a fixed-IP pod's was just read
	}
	wep, err := i.commitOver(ctx, n, i.newWEP(pod, n, info), old)
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
	if err == nil && i.guardAllocation(n, info) {
		return datastore.IPInfo{}, true, nil // a running pod uses it (podipguard.go): pick again
	}
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

// commit writes the WorkloadEndpoint want: the allocation's commit point.
func (i *IPAM) commit(ctx context.Context, n *node, want *cce.WorkloadEndpoint) (*cce.WorkloadEndpoint, error) {
	return i.commitOver(ctx, n, want, nil)
}

// commitOver is commit when the pod's wep may already exist: old is it as
// last read (takeFixedIP) or written (knownOld), and want replaces it with
// one Update preconditioned on its resourceVersion. Without old, want is
// created, and an existing wep is read and replaced. A Conflict (the wep
// changed since old) reads it again, once. The replica remembers what it
// wrote (known.go), and forgets it on any failure: the write may have
// landed.
func (i *IPAM) commitOver(ctx context.Context, n *node, want, old *cce.WorkloadEndpoint) (*cce.WorkloadEndpoint, error) {
	pod := datastore.PodKey{Namespace: want.Namespace, Name: want.Name}
	wep, err := i.writeWEP(ctx, n, want, old)
	if err != nil {
		i.known.forget(n.name, pod)
		return nil, err
	}
	i.known.remember(n, wep)
	return wep, nil
}

func (i *IPAM) writeWEP(ctx context.Context, n *node, want, old *cce.WorkloadEndpoint) (*cce.WorkloadEndpoint, error) {
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
	if tok != nil {
		tok.Stamp(want)
	}
	if failpoint(fpBeforeWEPCreate, func() string { return n.name + " " + want.Namespace + "/" + want.Name }) {
		ctx = context.WithoutCancel(ctx) // a write already on the wire (see failpoint.go)
	}
	client := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(want.Namespace)
	// A known old wep is tried first; if it changed (Conflict) or went
	// (NotFound) since, the second round creates, and on AlreadyExists reads
	// the wep and replaces it, as without one.
	finalizers := want.Finalizers
	for round := 0; ; round++ {
		if old == nil {
			wep, err := client.Create(ctx, want, metav1.CreateOptions{})
			i.wepWritten(err)
			if err == nil {
				return wep, nil
			}
			if !apierrors.IsAlreadyExists(err) {
				return nil, fmt.Errorf("create WorkloadEndpoint: %w", err)
			}
			// A wep of an earlier sandbox (or of this pod on another
			// node): take it over with the resourceVersion we read, so a
			// concurrent writer loses.
			if old, err = client.Get(ctx, want.Name, metav1.GetOptions{}); err != nil {
				return nil, fmt.Errorf("read existing WorkloadEndpoint: %w", err)
			}
			round++
		}
		if old.Spec.Node != n.name || old.Spec.IP != want.Spec.IP {
			i.releaseStale(old)
		}
		want.ResourceVersion = old.ResourceVersion
		want.Finalizers = old.Finalizers
		wep, err := client.Update(ctx, want, metav1.UpdateOptions{})
		i.wepWritten(err)
		if err == nil {
			return wep, nil
		}
		if round > 0 || !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("update WorkloadEndpoint: %w", err)
		}
		old = nil
		want.ResourceVersion, want.Finalizers = "", finalizers
	}
}

// knownOld is the pod's wep on n as this replica last wrote it (whichever
// sandbox it names), as the old wep commitOver replaces: a new sandbox of a
// pod then costs one Update instead of a Create, a read and an Update.
func (i *IPAM) knownOld(n *node, pod datastore.PodKey) *cce.WorkloadEndpoint {
	rec, ok := i.known.get(n.name, pod)
	if !ok || rec.node != n {
		return nil
	}
	return &cce.WorkloadEndpoint{
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: rec.uid, ResourceVersion: rec.rv, Finalizers: rec.finalizers,
		},
		Spec: cce.WorkloadEndpointSpec{ContainerID: rec.containerID, IP: rec.ip.String(), Node: n.name},
	}
}

// releaseStale frees the IP an overwritten wep named, when this replica
// serves its node; otherwise the IP is left to that node's leaked-IP GC.
func (i *IPAM) releaseStale(old *cce.WorkloadEndpoint) {
	addr, err := netip.ParseAddr(old.Spec.IP)
	if err != nil {
		return
	}
	n, ok := i.node(old.Spec.Node)
	if !ok {
		return
	}
	rel, err := i.store.Release(old.Spec.Node, addr, old.Spec.ContainerID, i.deps.Clock.Now())
	if err != nil && !errors.Is(err, datastore.ErrUnknownIP) && !errors.Is(err, datastore.ErrNotAssigned) {
		i.log.Warn("could not free the IP of an overwritten WorkloadEndpoint", "wep", old.Namespace+"/"+old.Name,
			"ip", old.Spec.IP, "err", err)
	}
	if err == nil && rel.Removed {
		n.queueReturn(addr, rel.Info.ENIID) // a cross-subnet address serves no other pod
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

// CallNode returns the node a call names when the Node informer knows it:
// the CNI plugin runs on the sandbox's node, so a DEL or CheckIP is routed
// there without reading the wep (REQUESTS.md, "DEL"). ok=false: the call
// names no node or one not known here; the caller reads the wep instead.
func (i *IPAM) CallNode(ref podip.PodRef) (string, bool) {
	if ref.Node == "" {
		return "", false
	}
	if _, err := i.nodes.Get(ref.Node); err != nil {
		return "", false
	}
	return ref.Node, true
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
