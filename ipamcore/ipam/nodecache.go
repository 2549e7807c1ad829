package ipam

import (
	"context"
	"sync"
	"sync/atomic"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/cachetrim"
)

// nodeCache is the watch-fed view of one served node's pods (field selector
// spec.nodeName: the watch every kubelet keeps, which the API server's watch
// cache serves from an index). A replica watches only the nodes it serves,
// so its memory follows its share of the cluster rather than its size.
//
// WorkloadEndpoints are deliberately not watched per node: their field
// selector (the CRD's selectable field spec.node) has no index, so every
// such watch start makes the API server scan every wep, and a takeover of
// many nodes turned that into an overload. They are read live where needed
// and once per GC pass in pages.
//
// The view is a hint, as any informer cache is: a miss or a stale object is
// answered by a live read where it matters (getPod, the GC's confirmations),
// so a cache that has not synced yet only costs reads, never correctness.
type nodeCache struct {
	pods   *nodeStore
	cancel context.CancelFunc
	done   sync.WaitGroup
}

// startNodeCache starts the node's pod watch; stop ends it.
func startNodeCache(ctx context.Context, name string, kube kubernetes.Interface) *nodeCache {
	ctx, cancel := context.WithCancel(ctx)
	c := &nodeCache{
		pods:   newNodeStore(slimPod),
		cancel: cancel,
	}
	r := cache.NewReflectorWithOptions(nodePodsListWatch(kube, name), &corev1.Pod{}, c.pods,
		cache.ReflectorOptions{Name: "pods of node " + name})
	c.done.Go(func() { r.RunWithContext(ctx) })
	return c
}

// nodePodsListWatch lists and watches the pods bound to node. It tells the
// reflector not to stream its initial list (WatchList): the API server
// answers a streamed start by walking every pod in its watch cache, while a
// list from the cache (resourceVersion 0) uses its spec.nodeName index. A
// takeover starts one watch per node: at 1,000 nodes and 30,000 pods the
// streamed starts took two thirds of the API server's CPU and its lease
// writes slowed past the renew deadline.
func nodePodsListWatch(kube kubernetes.Interface, node string) cache.ListerWatcher {
	sel := fields.OneTermEqualSelector("spec.nodeName", node).String()
	return listThenWatch{&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return kube.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, o)
		},
	}}
}

// listThenWatch is a ListWatch whose reflector lists, then watches.
type listThenWatch struct{ *cache.ListWatch }

// IsWatchListSemanticsUnSupported is what client-go's reflector asks
// (k8s.io/client-go/util/watchlist) before streaming an initial list.
func (listThenWatch) IsWatchListSemanticsUnSupported() bool { return true }

// stop ends the watch and waits for it.
func (c *nodeCache) stop() {
	c.cancel()
	c.done.Wait()
}

// synced reports whether the watch has delivered its first list.
func (c *nodeCache) synced() bool { return c.pods.synced.Load() }

func (c *nodeCache) pod(namespace, name string) (*corev1.Pod, bool) {
	obj, ok, _ := c.pods.GetByKey(namespace + "/" + name)
	if !ok {
		return nil, false
	}
	p, ok := obj.(*corev1.Pod)
	return p, ok
}

// nodeStore is a thread-safe store that a reflector fills. It keeps each
// object as slim() leaves it and remembers whether the first list arrived.
type nodeStore struct {
	cache.Store
	slim   func(any) any
	synced atomic.Bool
}

func newNodeStore(slim func(any) any) *nodeStore {
	return &nodeStore{
		Store: cache.NewStore(cache.MetaNamespaceKeyFunc),
		slim:  slim,
	}
}

func (s *nodeStore) Add(obj any) error    { return s.Store.Add(s.slim(obj)) }
func (s *nodeStore) Update(obj any) error { return s.Store.Update(s.slim(obj)) }

func (s *nodeStore) Replace(list []any, rv string) error {
	for k := range list {
		list[k] = s.slim(list[k])
	}
	err := s.Store.Replace(list, rv)
	if err == nil {
		s.synced.Store(true)
	}
	return err
}

// slimPod keeps what the IPAM reads of a pod (its node, deletion, the
// fixed-IP and PSTS annotations and controller, the labels and creation time
// a PSTS selector is matched against, what an Event needs to name it, and
// whether it runs with which addresses) and drops the rest (containers, the
// rest of its status, managedFields, other annotations
// such as last-applied-configuration), which is most of a pod's size.
func slimPod(obj any) any {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj
	}
	out := &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			DeletionTimestamp: p.DeletionTimestamp, OwnerReferences: p.OwnerReferences,
			Labels: p.Labels, CreationTimestamp: p.CreationTimestamp,
		},
		Spec: corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		// The podIP guard (podipguard.go) reads which addresses running
		// pods use.
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs},
	}
	for _, k := range []string{cce.AnnotationStsEnableFixIP, cce.AnnotationStsPodFixIPDeletePolicy, cce.AnnotationPodSubnetTopologySpread} {
		if v, ok := p.Annotations[k]; ok {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	return out
}

// slimClusterObject is the transform of the Node and StatefulSet informers,
// whose caches every replica holds whole whatever its share: it keeps what
// the IPAM and the shard layer read and drops the rest. Of a Node: its
// metadata (the capacity annotations, labels) and spec (the provider ID);
// its status (images, conditions, volumes: most of a real node's size) is
// never read. Of a StatefulSet: its metadata and spec.replicas (the fixed-IP
// GC's scale-down check); its pod template is never read.
func slimClusterObject(obj any) (any, error) {
	obj, _ = cachetrim.StripManagedFields(obj) // never fails
	switch o := obj.(type) {
	case *corev1.Node:
		// Only the Ready condition's status is read (ENIs ahead of
		// demand skip nodes that are not Ready); its times would only
		// cost memory.
		var ready []corev1.NodeCondition
		for _, c := range o.Status.Conditions {
			if c.Type == corev1.NodeReady {
				ready = []corev1.NodeCondition{{Type: c.Type, Status: c.Status}}
			}
		}
		o.Status = corev1.NodeStatus{Conditions: ready}
		delete(o.Annotations, corev1.LastAppliedConfigAnnotation)
	case *appsv1.StatefulSet:
		o.Spec = appsv1.StatefulSetSpec{Replicas: o.Spec.Replicas}
		o.Status = appsv1.StatefulSetStatus{}
		delete(o.Annotations, corev1.LastAppliedConfigAnnotation)
	}
	return obj, nil
}
