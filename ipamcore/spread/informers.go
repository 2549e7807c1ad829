package spread

import (
	"context"
	"fmt"
	"maps"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
)

// The leader watches every pod and every wep of the cluster (150,000 of
// each in a large one), but the status needs only the few that belong to a
// PSTS. So both informers are filtered where the objects arrive, before
// anything is cached: a pod without the PSTS annotation and a wep without a
// subnetTopologyReference never reach the store, and the pods come from the
// metadata API (no spec, no status on the wire). What is kept is stripped
// to the fields the status reads. Memory follows the PSTS pods, not the
// cluster.

// Index names.
const (
	// byPSTS indexes pods by "<namespace>/<annotation>" and weps by
	// "<namespace>/<subnetTopologyReference>": the key of their PSTS.
	byPSTS = "psts"
	// bySubnet indexes PSTS objects by the subnet IDs of their spec.
	bySubnet = "subnet"
	// byEntry indexes tables by "<namespace>/<entry name>" of their spec.
	byEntry = "entry"
	// byOwner indexes PSTS objects by the UID of their controlling table.
	byOwner = "owner"
)

var podsResource = corev1.SchemeGroupVersion.WithResource("pods")

// streamFilter keeps the objects of a list and watch that name a PSTS,
// and remembers which PSTS each kept object named: the modification that
// makes a kept object stop naming one (its annotation or reference removed)
// becomes its deletion, carrying the PSTS it named, so that the informer
// drops it and the handler requeues that PSTS. Modifications and deletions
// of objects never kept are dropped: the status of no PSTS depends on them.
type streamFilter struct {
	// pstsOf is the PSTS an object names, "" if none.
	pstsOf func(runtime.Object) string
	// setPSTS writes the PSTS an object named back into it.
	setPSTS func(runtime.Object, string)

	mu   sync.Mutex
	kept map[string]string // object key → the PSTS it names, as last passed on
}

func newStreamFilter(pstsOf func(runtime.Object) string, setPSTS func(runtime.Object, string)) *streamFilter {
	return &streamFilter{pstsOf: pstsOf, setPSTS: setPSTS, kept: map[string]string{}}
}

// listed filters one page of a list; the first page of a list starts a new
// record of the kept objects (the informer replaces its store with the list).
func (f *streamFilter) listed(opts metav1.ListOptions, items []runtime.Object) []bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if opts.Continue == "" {
		f.kept = map[string]string{}
	}
	keep := make([]bool, len(items))
	for i, obj := range items {
		if name := f.pstsOf(obj); name != "" {
			f.kept[objectKey(obj)] = name
			keep[i] = true
		}
	}
	return keep
}

// watching starts a watch; one that sends the initial events (a watch list)
// starts a new record, as a list does.
func (f *streamFilter) watching(opts metav1.ListOptions) {
	if opts.SendInitialEvents != nil && *opts.SendInitialEvents {
		f.mu.Lock()
		f.kept = map[string]string{}
		f.mu.Unlock()
	}
}

// event is the watch.FilterFunc.
func (f *streamFilter) event(e watch.Event) (watch.Event, bool) {
	switch e.Type {
	case watch.Added, watch.Modified, watch.Deleted:
	default:
		return e, true // bookmarks, errors
	}
	name := f.pstsOf(e.Object)
	key := objectKey(e.Object)
	f.mu.Lock()
	defer f.mu.Unlock()
	old, wasKept := f.kept[key]
	switch {
	case e.Type == watch.Deleted:
		if !wasKept && name == "" {
			return e, false
		}
		delete(f.kept, key)
		if name == "" {
			f.setPSTS(e.Object, old)
		}
		return e, true
	case name != "":
		f.kept[key] = name
		return e, true
	case wasKept:
		delete(f.kept, key)
		f.setPSTS(e.Object, old)
		return watch.Event{Type: watch.Deleted, Object: e.Object}, true
	}
	return e, false
}

func objectKey(obj runtime.Object) string {
	m, err := meta.Accessor(obj)
	if err != nil {
		return ""
	}
	return m.GetNamespace() + "/" + m.GetName()
}

func podPSTS(obj runtime.Object) string {
	m, err := meta.Accessor(obj)
	if err != nil {
		return ""
	}
	return m.GetAnnotations()[cce.AnnotationPodSubnetTopologySpread]
}

func setPodPSTS(obj runtime.Object, name string) {
	if m, err := meta.Accessor(obj); err == nil {
		a := maps.Clone(m.GetAnnotations())
		if a == nil {
			a = map[string]string{}
		}
		a[cce.AnnotationPodSubnetTopologySpread] = name
		m.SetAnnotations(a)
	}
}

func wepPSTS(obj runtime.Object) string {
	if w, ok := obj.(*cce.WorkloadEndpoint); ok {
		return w.Spec.SubnetTopologyReference
	}
	return ""
}

func setWEPPSTS(obj runtime.Object, name string) {
	if w, ok := obj.(*cce.WorkloadEndpoint); ok {
		w.Spec.SubnetTopologyReference = name
	}
}

// podListWatch lists and watches the metadata of the pods with the PSTS
// annotation.
func podListWatch(client metadata.Interface) cache.ListerWatcher {
	pods := client.Resource(podsResource).Namespace(metav1.NamespaceAll)
	return filteredListWatch(newStreamFilter(podPSTS, setPodPSTS), pods.List,
		func(l *metav1.PartialObjectMetadataList) *[]metav1.PartialObjectMetadata { return &l.Items }, pods.Watch)
}

// wepListWatch lists and watches the weps with a PSTS reference.
func wepListWatch(client cceclient.Interface) cache.ListerWatcher {
	weps := client.CceV1alpha1().WorkloadEndpoints(metav1.NamespaceAll)
	return filteredListWatch(newStreamFilter(wepPSTS, setWEPPSTS), weps.List,
		func(l *cce.WorkloadEndpointList) *[]cce.WorkloadEndpoint { return &l.Items }, weps.Watch)
}

// filteredListWatch lists and watches through f: a list keeps only the
// items f keeps, a watch is filtered by f's event rule.
func filteredListWatch[L runtime.Object, T any, PT interface {
	*T
	runtime.Object
}](f *streamFilter, list func(context.Context, metav1.ListOptions) (L, error), items func(L) *[]T,
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) cache.ListerWatcher {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			l, err := list(ctx, opts)
			if err != nil {
				return nil, err
			}
			all := items(l)
			objs := make([]runtime.Object, len(*all))
			for i := range *all {
				objs[i] = PT(&(*all)[i])
			}
			keep := f.listed(opts, objs)
			var kept []T
			for i := range *all {
				if keep[i] {
					kept = append(kept, (*all)[i])
				}
			}
			*all = kept
			return l, nil
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			w, err := watchFn(ctx, opts)
			if err != nil {
				return nil, err
			}
			f.watching(opts)
			return watch.Filter(w, f.event), nil
		},
	}
}

// stripPod keeps what the status reads of a pod: its name, namespace and
// PSTS annotation.
func stripPod(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	out := &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
	}}
	if v := m.Annotations[cce.AnnotationPodSubnetTopologySpread]; v != "" {
		out.Annotations = map[string]string{cce.AnnotationPodSubnetTopologySpread: v}
	}
	return out, nil
}

// stripWEP keeps what the status reads of a wep.
func stripWEP(obj any) (any, error) {
	w, ok := obj.(*cce.WorkloadEndpoint)
	if !ok {
		return obj, nil
	}
	return &cce.WorkloadEndpoint{
		TypeMeta: w.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: w.Name, Namespace: w.Namespace, UID: w.UID, ResourceVersion: w.ResourceVersion,
		},
		Spec: cce.WorkloadEndpointSpec{
			IP:                      w.Spec.IP,
			IPv6:                    w.Spec.IPv6,
			SubnetID:                w.Spec.SubnetID,
			SubnetTopologyReference: w.Spec.SubnetTopologyReference,
			Phase:                   w.Spec.Phase,
		},
	}, nil
}

// pstsKey is the key of the PSTS a pod or wep names, "" if none.
func pstsKey(obj any) string {
	o, ok := unwrap(obj).(runtime.Object)
	if !ok {
		return ""
	}
	name := podPSTS(o)
	if _, isWEP := o.(*cce.WorkloadEndpoint); isWEP {
		name = wepPSTS(o)
	}
	m, err := meta.Accessor(o)
	if name == "" || err != nil {
		return ""
	}
	return m.GetNamespace() + "/" + name
}

func indexByPSTS(obj any) ([]string, error) {
	if k := pstsKey(obj); k != "" {
		return []string{k}, nil
	}
	return nil, nil
}

func indexPSTSBySubnet(obj any) ([]string, error) {
	p, ok := obj.(*cce.PodSubnetTopologySpread)
	if !ok {
		return nil, fmt.Errorf("index %T by subnet: not a PodSubnetTopologySpread", obj)
	}
	return sortedKeys(p.Spec.Subnets), nil
}

func indexPSTSByOwner(obj any) ([]string, error) {
	p, ok := obj.(*cce.PodSubnetTopologySpread)
	if !ok {
		return nil, fmt.Errorf("index %T by owner: not a PodSubnetTopologySpread", obj)
	}
	if ref := tableRef(p); ref != nil {
		return []string{string(ref.UID)}, nil
	}
	return nil, nil
}

func indexTableByEntry(obj any) ([]string, error) {
	t, ok := obj.(*cce.PodSubnetTopologySpreadTable)
	if !ok {
		return nil, fmt.Errorf("index %T by entry: not a PodSubnetTopologySpreadTable", obj)
	}
	var keys []string
	for _, s := range t.Spec {
		keys = append(keys, t.Namespace+"/"+s.Name)
	}
	return keys, nil
}

// tableRef is the controller reference of p when its controller is a
// PodSubnetTopologySpreadTable.
func tableRef(p *cce.PodSubnetTopologySpread) *metav1.OwnerReference {
	ref := metav1.GetControllerOfNoCopy(p)
	if ref == nil || ref.Kind != tableKind || !isCCEGroup(ref.APIVersion) {
		return nil
	}
	return ref
}

// unwrap returns the object of a deletion tombstone.
func unwrap(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}
