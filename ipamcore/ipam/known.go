package ipam

import (
	"net/netip"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
	"github.com/cce-ipam/sharded/ipamcore/podip"
)

// knownWEP is what this replica knows of a wep from its own last write of it
// (or its last read): enough to answer a repeated ADD or a CheckIP, and to
// send a DEL's first write with the resourceVersion as its precondition,
// without reading the wep first (REQUESTS.md says why each is safe). It is a
// hint: every write made from it carries the resourceVersion, so a wep that
// changed since (another writer, an external edit, a delete) answers
// Conflict or NotFound and the caller reads it instead. It keeps a few
// strings, not the object, so that its memory stays small per pod.
type knownWEP struct {
	node        *node // the serving of the node it was written under: a record from an earlier serving is ignored
	uid         types.UID
	rv          string
	containerID string
	ip          netip.Addr
	finalizers  []string
	token       string // the fencing token the wep carries as written (tokenOf), "" without one
	kind        wepKind
	ep          podip.Endpoint
}

// wepKind says which release path a known wep takes.
type wepKind uint8

const (
	wepOrdinary wepKind = iota // deleted on release
	wepFixed                   // a fixed-IP StatefulSet wep: kept and stamped on release
	wepOther                   // PSTS and custom reuse: released from a fresh read (psts_release.go)
)

// knownWEPs holds the records of the served nodes' weps, by node and pod. Its
// lock is held for map operations only, never across a call.
type knownWEPs struct {
	mu     sync.Mutex
	byNode map[string]map[datastore.PodKey]knownWEP
}

func newKnownWEPs() *knownWEPs {
	return &knownWEPs{byNode: map[string]map[datastore.PodKey]knownWEP{}}
}

// remember records w as this replica just wrote or read it, for node n.
func (k *knownWEPs) remember(n *node, w *cce.WorkloadEndpoint) {
	addr, err := netip.ParseAddr(w.Spec.IP)
	if err != nil || w.Spec.Node != n.name || w.DeletionTimestamp != nil {
		k.forget(n.name, datastore.PodKey{Namespace: w.Namespace, Name: w.Name})
		return
	}
	kind := wepOrdinary
	switch {
	case w.Spec.SubnetTopologyReference != "" || w.IsCustomReuse():
		kind = wepOther
	case w.IsFixedStatefulSet():
		kind = wepFixed
	}
	rec := knownWEP{
		node:        n,
		uid:         w.UID,
		rv:          w.ResourceVersion,
		containerID: w.Spec.ContainerID,
		ip:          addr.Unmap(),
		finalizers:  w.Finalizers,
		token:       tokenOf(w),
		kind:        kind,
		ep:          endpointOf(w),
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	m := k.byNode[n.name]
	if m == nil {
		m = map[datastore.PodKey]knownWEP{}
		k.byNode[n.name] = m
	}
	m[datastore.PodKey{Namespace: w.Namespace, Name: w.Name}] = rec
}

func (k *knownWEPs) get(node string, pod datastore.PodKey) (knownWEP, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	rec, ok := k.byNode[node][pod]
	return rec, ok
}

// forget drops the pod's record: after a delete, and after any write whose
// outcome is unknown (the record's resourceVersion may be stale).
func (k *knownWEPs) forget(node string, pod datastore.PodKey) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if m := k.byNode[node]; m != nil {
		delete(m, pod)
		if len(m) == 0 {
			delete(k.byNode, node)
		}
	}
}

// forgetNode drops the records of a node no longer served here.
func (k *knownWEPs) forgetNode(node string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.byNode, node)
}

// knownFor returns the record of the wep of ref's sandbox on the served node
// n, when the record and the datastore agree that this sandbox holds the
// address the wep names. Anything else (no record, another sandbox, a record
// of an earlier serving of the node, an address the datastore gave back or
// moved) is not known: the caller reads the wep. A record the datastore
// contradicts is dropped.
func (i *IPAM) knownFor(n *node, ref podip.PodRef) (knownWEP, bool) {
	pod := datastore.PodKey{Namespace: ref.Namespace, Name: ref.Name}
	rec, ok := i.known.get(n.name, pod)
	if !ok {
		return knownWEP{}, false
	}
	held, err := i.store.LookupPod(n.name, pod)
	if rec.node != n || err != nil || held.State != datastore.StateAssigned ||
		held.Owner.ContainerID != rec.containerID || held.Addr != rec.ip {
		i.known.forget(n.name, pod)
		return knownWEP{}, false
	}
	return rec, rec.containerID == ref.ContainerID
}
