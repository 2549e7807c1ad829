package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
	"github.com/cce-ipam/sharded/ipamcore/podip"
)

// Release implements podip.Backend. On the node's owner, a DEL of the
// sandbox whose wep this replica wrote costs only the writes the finalizer
// needs (releaseKnown). Otherwise it reads the wep from the API server, not
// a cache: a DEL right after an ADD must see the ADD's wep, or the IP would
// stay assigned to nobody until GC.
func (i *IPAM) Release(ctx context.Context, ref podip.PodRef) (podip.Endpoint, bool, error) {
	unlock, waited := i.podLock.lockWatched(ref.Namespace + "/" + ref.Name)
	ep, ok, handled, finish, err := i.releaseKnown(ctx, ref)
	if finish != nil {
		// The wep's delete is marked: the call is answered now, and the
		// finalizer and the address follow under the pod's lock, which a
		// later call for the pod (a new sandbox's ADD) waits for. Until then
		// the address stays assigned, so it cannot go to another pod early.
		finish.start(unlock, waited)
		return ep, ok, err
	}
	defer unlock()
	if handled {
		return ep, ok, err
	}
	client := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(ref.Namespace)
	wep, err := client.Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return podip.Endpoint{}, false, nil
	}
	if err != nil {
		return podip.Endpoint{}, false, fmt.Errorf("get WorkloadEndpoint: %w", err)
	}
	// A DEL of an older sandbox must not free the current sandbox's IP.
	if wep.Spec.ContainerID != ref.ContainerID {
		i.log.Info("stale DEL ignored", "pod", ref.String(), "current", wep.Spec.ContainerID)
		return podip.Endpoint{}, false, nil
	}
	n, done, ok := i.acquire(wep.Spec.Node)
	if !ok {
		return podip.Endpoint{}, false, fmt.Errorf("%w: %s", ErrNodeNotServed, wep.Spec.Node)
	}
	defer done()
	tok, until, err := i.fenceFor(n.name)
	if err != nil {
		return podip.Endpoint{}, false, err
	}
	if wep.Spec.SubnetTopologyReference != "" {
		return i.releasePSTS(ctx, n, wep, tok, until)
	}
	if wep.IsFixedStatefulSet() {
		// The IP stays reserved for the pod's next incarnation; GC frees
		// it when the StatefulSet is deleted or scaled below the pod.
		upd := wep.DeepCopy()
		upd.Spec.UpdateAt = metav1.NewTime(i.deps.Clock.Now())
		if kept, ok := i.keepOnRelease(ctx, upd, tok, until); ok {
			i.known.remember(n, kept)
		}
		i.metrics.releases.WithLabelValues("ok", pathFixed).Inc()
		return endpointOf(wep), true, nil
	}
	addr, err := netip.ParseAddr(wep.Spec.IP)
	if err != nil {
		return podip.Endpoint{}, false, fmt.Errorf("WorkloadEndpoint %s/%s has an unparsable IP %q", wep.Namespace, wep.Name, wep.Spec.IP)
	}

	// The wep goes first: while it exists the IP stays assigned, so a
	// failure here leaves everything consistent and kubelet retries.
	if err := i.deleteWEP(ctx, wep); err != nil {
		i.metrics.releases.WithLabelValues("error", pathPool).Inc()
		return podip.Endpoint{}, false, err
	}
	i.known.forget(n.name, datastore.PodKey{Namespace: ref.Namespace, Name: ref.Name})
	i.freeReleased(n, addr, ref)
	return endpointOf(wep), true, nil
}

// freeReleased frees the address of a sandbox whose wep is deleted.
func (i *IPAM) freeReleased(n *node, addr netip.Addr, ref podip.PodRef) {
	rel, err := i.store.Release(n.name, addr, ref.ContainerID, i.deps.Clock.Now())
	switch {
	case err == nil:
	case errors.Is(err, datastore.ErrUnknownIP), errors.Is(err, datastore.ErrNotAssigned):
		// Already free (a retried DEL after a crash): nothing to do.
	default:
		i.log.Error("wep deleted but the IP could not be freed in the datastore", "node", n.name, "ip", addr, "err", err)
	}
	if rel.Removed {
		// Cross-subnet addresses cannot serve other pods.
		n.queueReturn(addr, rel.Info.ENIID)
	}
	i.metrics.releases.WithLabelValues("ok", pathPool).Inc()
	if st, err := i.store.Stats(n.name, i.deps.Clock.Now()); err == nil && st.Idle > i.cfg.IdleMax {
		n.poke() // the worker trims the pool back to IdleMax
	}
}

// releaseKnown is the DEL of a sandbox whose wep this replica wrote, on the
// served node the call names: no read (REQUESTS.md, "DEL"). The wep's
// writes carry the resourceVersion this replica last wrote; if the wep
// changed or went since (Conflict, NotFound), done=false sends the caller
// to the read path. done=false too when nothing is known. A non-nil finish
// is the rest of a release whose wep's delete is marked (finishRelease): the
// caller runs it, holding the pod's lock until it returns.
func (i *IPAM) releaseKnown(ctx context.Context, ref podip.PodRef) (ep podip.Endpoint, ok, done bool,
	finish *pendingFinish, err error) {
	n, release, served := i.acquire(ref.Node)
	if !served {
		return podip.Endpoint{}, false, false, nil, nil
	}
	defer func() {
		if finish == nil {
			release()
		}
	}()
	rec, known := i.knownFor(n, ref)
	if !known || rec.kind == wepOther {
		return podip.Endpoint{}, false, false, nil, nil
	}
	pod := datastore.PodKey{Namespace: ref.Namespace, Name: ref.Name}
	// Whatever happens next, this record is spent: a write from it either
	// lands (and is remembered again below) or leaves its outcome unknown.
	i.known.forget(n.name, pod)
	tok, until, err := i.fenceFor(n.name)
	if err != nil {
		return podip.Endpoint{}, false, true, nil, err
	}
	if rec.kind == wepFixed {
		kept, err := i.stampKnownWEP(ctx, ref, rec, tok, until)
		if err != nil {
			return podip.Endpoint{}, false, false, nil, nil // read it and stamp that (or log why not)
		}
		i.known.remember(n, kept)
		i.metrics.releases.WithLabelValues("ok", pathFixed).Inc()
		return rec.ep, true, true, nil, nil
	}
	// The delete goes first when the wep already carries the current
	// token (deleteKnownFirst says why that is fenced); otherwise the token
	// is stamped first, with the finalizer's removal, as the read path does.
	marked := tok == nil || rec.token == stampedToken(*tok)
	if marked {
		err = i.deleteKnownFirst(ctx, ref, rec, until)
	} else {
		err = i.deleteKnownWEP(ctx, ref, rec, tok, until)
	}
	switch {
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return podip.Endpoint{}, false, false, nil, nil
	case err != nil:
		i.metrics.releases.WithLabelValues("error", pathPool).Inc()
		return podip.Endpoint{}, false, true, nil, err
	}
	if marked && slices.Contains(rec.finalizers, cce.WorkloadEndpointFinalizer) {
		return rec.ep, true, true, i.finishRelease(n, release, ref, rec), nil
	}
	i.freeReleased(n, rec.ip, ref)
	return rec.ep, true, true, nil, nil
}

// finishTimeout bounds finishRelease's attempts, from when a slot is free.
const finishTimeout = 30 * time.Second

// finishWhenStopping bounds what a pending finish may still try once its
// node stops being served here: the hand-over waits for it (it holds the
// node), and the fence lets it write while the node drains.
const finishWhenStopping = 2 * time.Second

// finishSlots is how many finalizer removals run at once. A DEL's answer
// does not wait for a slot: its finish waits for one in the background (the
// pod stays locked and its address assigned meanwhile), so under a burst of
// DELs the API server serves the DELs' deletes first and the removals follow
// at this concurrency. Until 12-07 a DEL that found the slots taken finished
// before its answer; at 8 and 32 DELs in flight most did, and a DEL waited
// for two writes against an ADD's one (bench 8b: DEL p50 2.2–2.4× the ADD's).
const finishSlots = 4

// maxFinishPendingPerNode bounds the releases of a node answered and not
// yet finished. Their addresses stay assigned until they finish, so it
// bounds what a burst of DELs keeps from the node's pool for a while (the
// cooling keeps a freed address from reuse for a while too, 5 s by
// default). A DEL beyond it finishes before its answer, as before.
const maxFinishPendingPerNode = 64

// pendingFinish is the rest of a release whose DEL is answered (the wep's
// delete is marked): finishRelease's work.
type pendingFinish struct {
	i   *IPAM
	n   *node
	run func() // frees the node's hold (acquire's release) when done
}

// start lets the DEL be answered: the finish runs on its own goroutine,
// waiting for a slot, under the pod's lock (unlock ends it; waited is closed
// once another call waits for that lock). With the node's bound of pending
// finishes reached it runs now, before the answer.
func (f *pendingFinish) start(unlock func(), waited <-chan struct{}) {
	f.i.metrics.finishesPending.Inc()
	if int(f.n.finishPending.Add(1)) > f.i.finishPendingMax {
		f.finish(unlock, nil, false)
		return
	}
	go f.finish(unlock, waited, true)
}

func (f *pendingFinish) finish(unlock func(), waited <-chan struct{}, wait bool) {
	defer unlock()
	defer f.i.metrics.finishesPending.Dec()
	defer f.n.finishPending.Add(-1)
	if wait {
		select {
		case f.i.finishing <- struct{}{}:
			defer func() { <-f.i.finishing }()
		case <-f.n.life.Done():
			// The node is being handed over, which waits for this: go now.
		case <-waited:
			// A call for the pod (a new sandbox's ADD) waits for this on
			// the pod's lock: go now, not behind the other pods' finishes.
		}
	}
	f.run()
}

// finishRelease completes a release whose wep's delete is marked: it
// removes our finalizer (dropFinalizer), which lets the API server remove
// the wep, then frees the address. It holds the node (release ends that)
// so that a hand-over waits for it, and gives up finishWhenStopping after the
// node stops being served here. If it cannot finish, the wep stays marked with the address
// assigned in the datastore, so nothing reuses the address; GC frees it as
// a deleted pod's wep (freeLeakedPod), here or on the node's next owner.
func (i *IPAM) finishRelease(n *node, release func(), ref podip.PodRef, rec knownWEP) *pendingFinish {
	return &pendingFinish{i: i, n: n, run: func() {
		defer release()
		ctx, cancel := context.WithTimeout(context.Background(), finishTimeout)
		defer cancel()
		// Once the node stops being served here, a little longer: the
		// hand-over waits for this, and the fence allows it while the
		// node drains.
		defer context.AfterFunc(n.life, func() { time.AfterFunc(finishWhenStopping, cancel) })()
		rest := slices.DeleteFunc(slices.Clone(rec.finalizers), func(f string) bool { return f == cce.WorkloadEndpointFinalizer })
		backoff := 50 * time.Millisecond
		for {
			tok, until, err := i.fenceFor(n.name)
			if err == nil {
				err = i.dropFinalizer(ctx, ref, rec.uid, rest, tok, until)
			}
			if err == nil || apierrors.IsNotFound(err) {
				i.freeReleased(n, rec.ip, ref)
				return
			}
			if errors.Is(err, ErrFenced) || refusedByFencingPolicy(err) || apierrors.IsInvalid(err) {
				i.log.Warn("release: the wep is marked deleted but its finalizer cannot be removed here; "+
					"its address stays held until GC frees it", "pod", ref.String(), "ip", rec.ip, "err", err)
				return
			}
			select {
			case <-ctx.Done():
				i.log.Warn("release: gave up removing the finalizer of a wep marked deleted; "+
					"its address stays held until GC frees it", "pod", ref.String(), "ip", rec.ip, "err", err)
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
		}
	}}
}

// keepOnRelease writes the wep of a released pod whose address stays
// reserved (upd: the wep with its release stamped), fenced like every wep
// write, and returns it as written. A failure is only logged: the
// reservation holds either way, and GC stamps what it needs later.
func (i *IPAM) keepOnRelease(ctx context.Context, upd *cce.WorkloadEndpoint, tok *FenceToken,
	until time.Time) (*cce.WorkloadEndpoint, bool) {
	if tok != nil {
		tok.Stamp(upd)
	}
	uctx, cancel := fencedContext(ctx, until)
	defer cancel()
	kept, err := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(upd.Namespace).Update(uctx, upd, metav1.UpdateOptions{})
	i.wepWritten(err)
	if err != nil {
		i.log.Info("could not stamp a kept wep on release", "wep", upd.Namespace+"/"+upd.Name, "err", err)
		return nil, false
	}
	return kept, true
}

// Check implements podip.Backend: the pod's current wep, if the sandbox owns
// it. The node's owner answers from the wep it wrote for the sandbox (the
// router sends CheckIP there), any other replica reads it.
func (i *IPAM) Check(ctx context.Context, ref podip.PodRef) (podip.Endpoint, bool, error) {
	if n, release, served := i.acquire(ref.Node); served {
		rec, known := i.knownFor(n, ref)
		release()
		if known {
			return rec.ep, true, nil
		}
	}
	wep, err := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return podip.Endpoint{}, false, nil
	}
	if err != nil {
		return podip.Endpoint{}, false, err
	}
	if wep.Spec.ContainerID != ref.ContainerID {
		return podip.Endpoint{}, false, nil
	}
	return endpointOf(wep), true, nil
}

// NodeGone reports whether a node no longer exists (confirmed with the API
// server): no shard serves it, so calls for it cannot be routed.
func (i *IPAM) NodeGone(ctx context.Context, node string) bool {
	return i.nodeGone(ctx, node)
}

// ReleaseOnDeletedNode is the DEL of a pod whose node no longer exists: its
// IP went with the node's ENIs, so only the wep is deleted (guarded by the
// sandbox's container ID, as Release is). Fixed-IP weps stay reserved.
func (i *IPAM) ReleaseOnDeletedNode(ctx context.Context, ref podip.PodRef) (podip.Endpoint, bool, error) {
	unlock := i.podLock.lock(ref.Namespace + "/" + ref.Name)
	defer unlock()
	wep, err := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return podip.Endpoint{}, false, nil
	}
	if err != nil {
		return podip.Endpoint{}, false, fmt.Errorf("get WorkloadEndpoint: %w", err)
	}
	if wep.Spec.ContainerID != ref.ContainerID || !i.nodeGone(ctx, wep.Spec.Node) {
		return podip.Endpoint{}, false, nil
	}
	if wep.IsFixedStatefulSet() || wep.IsCustomReuse() {
		return endpointOf(wep), true, nil
	}
	if err := i.deleteWEP(ctx, wep); err != nil {
		return podip.Endpoint{}, false, err
	}
	i.metrics.releases.WithLabelValues("ok", pathPool).Inc()
	i.log.Info("released the wep of a pod on a deleted node", "pod", ref.String(), "node", wep.Spec.Node)
	return endpointOf(wep), true, nil
}
