package spread

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

func podMeta(name, psts string) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns",
		Annotations: map[string]string{"other": "x"}, Labels: map[string]string{"app": "a"}}}
	if psts != "" {
		m.Annotations[cce.AnnotationPodSubnetTopologySpread] = psts
	}
	return m
}

func TestStreamFilter_PodEvents(t *testing.T) {
	f := newStreamFilter(podPSTS, setPodPSTS)
	f.listed(metav1.ListOptions{}, []runtime.Object{podMeta("listed", "p")})
	type step struct {
		in       watch.Event
		pass     bool
		wantType watch.EventType
		wantKey  string // pstsKey of the passed object
	}
	for i, s := range []step{
		{watch.Event{Type: watch.Added, Object: podMeta("plain", "")}, false, "", ""},
		{watch.Event{Type: watch.Modified, Object: podMeta("plain", "")}, false, "", ""},
		{watch.Event{Type: watch.Deleted, Object: podMeta("plain", "")}, false, "", ""},
		{watch.Event{Type: watch.Added, Object: podMeta("a", "p")}, true, watch.Added, "ns/p"},
		{watch.Event{Type: watch.Modified, Object: podMeta("a", "q")}, true, watch.Modified, "ns/q"},
		// a loses its annotation: its deletion, naming the PSTS it had.
		{watch.Event{Type: watch.Modified, Object: podMeta("a", "")}, true, watch.Deleted, "ns/q"},
		{watch.Event{Type: watch.Modified, Object: podMeta("a", "")}, false, "", ""},
		// A pod gaining the annotation is added.
		{watch.Event{Type: watch.Modified, Object: podMeta("late", "p")}, true, watch.Modified, "ns/p"},
		{watch.Event{Type: watch.Deleted, Object: podMeta("late", "p")}, true, watch.Deleted, "ns/p"},
		// Kept by the list, deleted in a state without the annotation.
		{watch.Event{Type: watch.Deleted, Object: podMeta("listed", "")}, true, watch.Deleted, "ns/p"},
		{watch.Event{Type: watch.Bookmark, Object: &metav1.PartialObjectMetadata{}}, true, watch.Bookmark, ""},
	} {
		out, pass := f.event(s.in)
		if pass != s.pass {
			t.Fatalf("step %d (%s %s): passed %v", i, s.in.Type, objectKey(s.in.Object), pass)
		}
		if !pass {
			continue
		}
		if out.Type != s.wantType || pstsKey(out.Object) != s.wantKey {
			t.Fatalf("step %d: got %s naming %q, want %s naming %q", i, out.Type, pstsKey(out.Object), s.wantType, s.wantKey)
		}
	}
	if len(f.kept) != 0 {
		t.Fatalf("kept after every deletion: %v", f.kept)
	}
}

func TestStreamFilter_NewListForgets(t *testing.T) {
	f := newStreamFilter(wepPSTS, setWEPPSTS)
	w := wep("a", "sbn", "10.0.0.1", "")
	keep := f.listed(metav1.ListOptions{}, []runtime.Object{w, wep("b", "", "", "")})
	if !keep[0] || !keep[1] {
		t.Fatalf("keep %v", keep)
	}
	plain := &cce.WorkloadEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns"}}
	if keep := f.listed(metav1.ListOptions{Continue: "page-2"}, []runtime.Object{plain}); keep[0] {
		t.Fatal("a wep without a reference kept")
	}
	if len(f.kept) != 2 {
		t.Fatalf("a second page forgot the first: %v", f.kept)
	}
	f.listed(metav1.ListOptions{}, nil)
	if len(f.kept) != 0 {
		t.Fatalf("a new list kept the old record: %v", f.kept)
	}
	f.kept["ns/x"] = "p"
	f.watching(metav1.ListOptions{ResourceVersion: "5"})
	if len(f.kept) != 1 {
		t.Fatal("resuming a watch forgot the record")
	}
	yes := true
	f.watching(metav1.ListOptions{SendInitialEvents: &yes})
	if len(f.kept) != 0 {
		t.Fatal("a watch list kept the old record")
	}
}

func TestStrip_KeepsWhatTheStatusReads(t *testing.T) {
	w := wep("a", "sbn", "10.0.0.1", cce.WorkloadEndpointPhasePodRunning)
	w.Spec.IPv6, w.Spec.Node, w.Labels = "fd00::1", "node-1", map[string]string{"x": "y"}
	w.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "m"}}
	out, _ := stripWEP(w)
	got := out.(*cce.WorkloadEndpoint)
	if got.Spec.IP != w.Spec.IP || got.Spec.IPv6 != w.Spec.IPv6 || got.Spec.SubnetID != "sbn" || got.Spec.Phase != w.Spec.Phase ||
		got.Spec.SubnetTopologyReference != "p" || got.Name != "a" || got.Namespace != "ns" {
		t.Fatalf("stripped %+v", got)
	}
	if got.Spec.Node != "" || got.Labels != nil || got.ManagedFields != nil {
		t.Fatalf("kept too much: %+v", got)
	}
	again, _ := stripWEP(got)
	if !equality.Semantic.DeepEqual(again, got) {
		t.Fatal("stripping twice differs")
	}

	pod, _ := stripPod(podMeta("a", "p"))
	pm := pod.(*metav1.PartialObjectMetadata)
	if pm.Name != "a" || pm.Namespace != "ns" || len(pm.Annotations) != 1 || pm.Labels != nil || pstsKey(pm) != "ns/p" {
		t.Fatalf("stripped pod %+v", pm)
	}
	if obj, _ := stripPod("not a pod"); obj != "not a pod" {
		t.Fatal("an unknown object changed")
	}
}

func TestPSTSKey_Tombstones(t *testing.T) {
	if k := pstsKey(cache.DeletedFinalStateUnknown{Key: "ns/a", Obj: wep("a", "sbn", "", "")}); k != "ns/p" {
		t.Fatalf("tombstone key %q", k)
	}
	if k := pstsKey("junk"); k != "" {
		t.Fatalf("junk key %q", k)
	}
}

func TestIndexes(t *testing.T) {
	tb := table("uid-1", entry("a"), entry("b"))
	keys, _ := indexTableByEntry(tb)
	if len(keys) != 2 || keys[0] != "ns/a" || keys[1] != "ns/b" {
		t.Fatalf("entry keys %v", keys)
	}
	p := existingOf(tb, entry("a", "sbn-2", "sbn-1"), 0)
	if keys, _ := indexPSTSByOwner(p); len(keys) != 1 || keys[0] != "uid-1" {
		t.Fatalf("owner keys %v", keys)
	}
	if keys, _ := indexPSTSBySubnet(p); len(keys) != 2 || keys[0] != "sbn-1" {
		t.Fatalf("subnet keys %v", keys)
	}
	p.OwnerReferences[0].APIVersion = "apps/v1"
	if keys, _ := indexPSTSByOwner(p); keys != nil {
		t.Fatalf("another group's owner indexed: %v", keys)
	}
	if _, err := indexPSTSBySubnet(tb); err == nil {
		t.Fatal("a table indexed as a PSTS")
	}
}
