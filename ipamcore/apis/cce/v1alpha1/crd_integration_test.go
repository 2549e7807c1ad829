//go:build integration

package v1alpha1_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/cce-ipam/sharded/e2e/cluster"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/generated/informers/externalversions"
)

var cp *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.RunTests(m, cluster.Options{}, &cp))
}

// crdDir is charts/cce-ipam/crds, seen from this package's directory.
var crdDir = filepath.Join("..", "..", "..", "..", "charts", "cce-ipam", "crds")

// The chart installs the CRDs; the API server reports the kinds with the
// reference's names, short names and scope, and a status subresource only
// for the PSTS kinds; and cce-ipam's own IPClaim, cluster-scoped.
func TestCRDs_InstallFromChart(t *testing.T) {
	ctx := testContext(t)
	crds := chartCRDs(t)
	if len(crds) != 6 {
		t.Fatalf("%s has %d CRDs, want 6", crdDir, len(crds))
	}
	applyCRDs(ctx, t, crds, true)

	cs := versioned.NewForConfigOrDie(cp.Config)
	list, err := cs.Discovery().ServerResourcesForGroupVersion(cce.SchemeGroupVersion.String())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]metav1.APIResource{}
	for _, r := range list.APIResources {
		got[r.Name] = r
	}
	for _, want := range []struct {
		plural, kind       string
		short              []string
		status, namespaced bool
	}{
		{"workloadendpoints", "WorkloadEndpoint", []string{"wep"}, false, true},
		{"ippools", "IPPool", []string{"pool", "ipl"}, false, true},
		{"subnets", "Subnet", []string{"sbn"}, false, true},
		{"podsubnettopologyspreads", "PodSubnetTopologySpread", []string{"psts"}, true, true},
		{"podsubnettopologyspreadtables", "PodSubnetTopologySpreadTable", []string{"pstt"}, true, true},
		// cce-ipam's own kind: the exclusive-subnet address ledger.
		{"ipclaims", "IPClaim", []string{"ipc"}, false, false},
	} {
		r, ok := got[want.plural]
		if !ok {
			t.Errorf("discovery has no %s: %v", want.plural, list.APIResources)
			continue
		}
		if r.Kind != want.kind || r.Namespaced != want.namespaced || !reflect.DeepEqual(r.ShortNames, want.short) {
			t.Errorf("%s: kind %s namespaced %v short names %v; want %s, %v, %v",
				want.plural, r.Kind, r.Namespaced, r.ShortNames, want.kind, want.namespaced, want.short)
		}
		if _, ok := got[want.plural+"/status"]; ok != want.status {
			t.Errorf("%s: status subresource %v, want %v (as the reference)", want.plural, ok, want.status)
		}
	}
}

// Objects in the reference's exact format (every field of the appendix), in
// the shape older releases wrote (empty strings, nulls), and with fields we
// do not know: the server keeps every byte of their data, and the typed
// client reads every field into the right Go field.
func TestCRDs_ReferenceObjects_RoundTrip(t *testing.T) {
	ctx := testContext(t)
	applyCRDs(ctx, t, chartCRDs(t), true)
	ns := cp.Namespace(t)
	cs := versioned.NewForConfigOrDie(cp.Config)
	rc := cs.CceV1alpha1().RESTClient()
	t.Cleanup(func() { removeFinalizers(t, cs, ns) })

	all := append(referenceFixtures(), legacyFixtures()...)
	for _, f := range all {
		createFixture(ctx, t, rc, ns, f.resource, readFixture(t, f.file))
	}
	for _, file := range unknownFieldFixtures() {
		createFixture(ctx, t, rc, ns, resourceOf(t, readFixture(t, file)), readFixture(t, file))
	}
	for _, f := range all {
		assertStoredAsWritten(ctx, t, rc, ns, f.resource, readFixture(t, f.file))
		assertTypedEqual(t, getTyped(ctx, t, cs, ns, f.want), f.want)
	}
	for _, file := range unknownFieldFixtures() {
		data := readFixture(t, file)
		assertStoredAsWritten(ctx, t, rc, ns, resourceOf(t, data), data)
	}

	// kubectl's columns come from the right fields.
	for resource, want := range map[string]map[string]string{
		"workloadendpoints": {"Name": "web-0", "IP": "10.0.1.23", "Node": "10.0.0.5", "ENI": "eni-x1y2z3w4",
			"Type": "StatefulSet", "Subnet": "sbn-a1b2c3d4", "Fixed": "True"},
		"ippools": {"Name": "ippool-10-0-0-5", "Node Selector": "kubernetes.io/hostname=10.0.0.5",
			"Source": "cce-cni", "Priority": "10", "Zone": "zoneD"},
		"subnets": {"Name": "sbn-a1b2c3d4", "CIDR": "10.0.1.0/24", "Zone": "zoneD", "Available": "0",
			"Enable": "true", "Exclusive": "true", "No More IP": "true"},
	} {
		assertTableRow(ctx, t, rc, ns, resource, want)
	}

	// A typed Update writes the reference's format back: apart from the new
	// label, the stored document is the fixture, field for field.
	for _, f := range referenceFixtures() {
		obj := getTyped(ctx, t, cs, ns, f.want)
		setLabel(obj, "cce-ipam.test/touched", "yes")
		updateTyped(ctx, t, cs, ns, obj)
		want := jsonMap(t, readFixture(t, f.file))
		labels, _ := metaOf(want)["labels"].(map[string]any)
		if labels == nil {
			labels = map[string]any{}
		}
		labels["cce-ipam.test/touched"] = "yes"
		metaOf(want)["labels"] = labels
		assertStoredMap(t, f.file+" after a typed Update", getRaw(ctx, t, rc, ns, f.resource, nameOf(want)), want)
	}
}

// A cluster migrated from the reference has objects written under the
// reference's schema-less CRDs. Replacing those CRDs with ours loses no data
// on read, the typed client reads them, and they pass our schema on Update.
func TestCRDs_AdoptObjectsWrittenUnderReferenceCRDs(t *testing.T) {
	ctx := testContext(t)
	ours := chartCRDs(t)
	var theirs []*apiextensionsv1.CustomResourceDefinition
	for _, crd := range ours {
		theirs = append(theirs, referenceStyle(crd))
	}
	applyCRDs(ctx, t, theirs, false)
	ns := cp.Namespace(t)
	cs := versioned.NewForConfigOrDie(cp.Config)
	rc := cs.CceV1alpha1().RESTClient()
	t.Cleanup(func() { removeFinalizers(t, cs, ns) })

	all := append(referenceFixtures(), legacyFixtures()...)
	for _, f := range all {
		createFixture(ctx, t, rc, ns, f.resource, readFixture(t, f.file))
	}
	for _, file := range unknownFieldFixtures() {
		createFixture(ctx, t, rc, ns, resourceOf(t, readFixture(t, file)), readFixture(t, file))
	}

	applyCRDs(ctx, t, ours, true)

	for _, f := range all {
		assertStoredAsWritten(ctx, t, rc, ns, f.resource, readFixture(t, f.file))
		obj := getTyped(ctx, t, cs, ns, f.want)
		assertTypedEqual(t, obj, f.want)
		setLabel(obj, "cce-ipam.test/adopted", "yes")
		updateTyped(ctx, t, cs, ns, obj)
		assertTypedEqual(t, getTyped(ctx, t, cs, ns, f.want), f.want)
	}
	for _, file := range unknownFieldFixtures() {
		data := readFixture(t, file)
		assertStoredAsWritten(ctx, t, rc, ns, resourceOf(t, data), data)
	}
	// Listing decodes every adopted object, those with unknown fields too.
	weps, err := cs.CceV1alpha1().WorkloadEndpoints(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pools, err := cs.CceV1alpha1().IPPools(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	subnets, err := cs.CceV1alpha1().Subnets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(weps.Items) != 3 || len(pools.Items) != 3 || len(subnets.Items) != 3 {
		t.Errorf("listed %d weps, %d pools, %d subnets; want 3 of each", len(weps.Items), len(pools.Items), len(subnets.Items))
	}
}

// The generated informers list what exists and then watch changes, including
// a status written with a plain Update and a wep deleted the reference's way
// (finalizer cleared by Update, then Delete with a zero grace period).
func TestCRDs_Informer_ListAndWatch(t *testing.T) {
	ctx := testContext(t)
	applyCRDs(ctx, t, chartCRDs(t), true)
	ns := cp.Namespace(t)
	cs := versioned.NewForConfigOrDie(cp.Config)
	rc := cs.CceV1alpha1().RESTClient()
	t.Cleanup(func() { removeFinalizers(t, cs, ns) })
	for _, f := range referenceFixtures() {
		createFixture(ctx, t, rc, ns, f.resource, readFixture(t, f.file))
	}

	factory := externalversions.NewSharedInformerFactoryWithOptions(cs, 0, externalversions.WithNamespace(ns))
	informers := factory.Cce().V1alpha1()
	events := make(chan string, 100)
	record := func(verb string) func(obj any) {
		return func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			events <- fmt.Sprintf("%s %T %s", verb, obj, obj.(metav1.Object).GetName())
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    record("add"),
		UpdateFunc: func(_, obj any) { record("update")(obj) },
		DeleteFunc: record("delete"),
	}
	for _, inf := range []cache.SharedIndexInformer{
		informers.WorkloadEndpoints().Informer(),
		informers.IPPools().Informer(),
		informers.Subnets().Informer(),
	} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	factory.Start(stop)
	defer func() {
		close(stop)
		factory.Shutdown()
	}()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("informer for %v did not sync", typ)
		}
	}

	// List: the listers hold the objects that existed before the start.
	wep, err := informers.WorkloadEndpoints().Lister().WorkloadEndpoints(ns).Get("web-0")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := informers.IPPools().Lister().IPPools(ns).Get("ippool-10-0-0-5")
	if err != nil {
		t.Fatal(err)
	}
	subnet, err := informers.Subnets().Lister().Subnets(ns).Get("sbn-a1b2c3d4")
	if err != nil {
		t.Fatal(err)
	}
	for i, got := range []runtime.Object{wep, pool, subnet} {
		assertTypedEqual(t, got, referenceFixtures()[i].want)
	}
	expectEvents(ctx, t, events,
		"add *v1alpha1.WorkloadEndpoint web-0",
		"add *v1alpha1.IPPool ippool-10-0-0-5",
		"add *v1alpha1.Subnet sbn-a1b2c3d4")

	// Watch: a new wep.
	newWep := &cce.WorkloadEndpoint{
		ObjectMeta: metav1.ObjectMeta{
			Name:       "web-1",
			Labels:     map[string]string{cce.LabelSubnetID: "sbn-a1b2c3d4", cce.LabelOwner: "web"},
			Finalizers: []string{cce.WorkloadEndpointFinalizer},
		},
		Spec: cce.WorkloadEndpointSpec{IP: "10.0.1.24", Type: cce.WorkloadEndpointTypeStatefulSet, UpdateAt: metav1.Unix(0, 0)},
	}
	if _, err := cs.CceV1alpha1().WorkloadEndpoints(ns).Create(ctx, newWep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expectEvents(ctx, t, events, "add *v1alpha1.WorkloadEndpoint web-1")

	// Watch: IPPool status written with a plain Update (no subresource).
	pool = pool.DeepCopy()
	eni := pool.Status.ENI.ENIs["eni-n9m8b7v6"]
	eni.InterfaceIndex = 4
	pool.Status.ENI.ENIs["eni-n9m8b7v6"] = eni
	if _, err := cs.CceV1alpha1().IPPools(ns).Update(ctx, pool, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expectEvents(ctx, t, events, "update *v1alpha1.IPPool ippool-10-0-0-5")
	cached, err := informers.IPPools().Lister().IPPools(ns).Get(pool.Name)
	if err != nil {
		t.Fatal(err)
	}
	if got := cached.Status.ENI.ENIs["eni-n9m8b7v6"].InterfaceIndex; got != 4 {
		t.Errorf("cached interfaceIndex = %d after the status Update, want 4", got)
	}

	// Watch: delete a wep the reference's way.
	wep = wep.DeepCopy()
	wep.Finalizers = nil
	if _, err := cs.CceV1alpha1().WorkloadEndpoints(ns).Update(ctx, wep, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	now := metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}
	if err := cs.CceV1alpha1().WorkloadEndpoints(ns).Delete(ctx, wep.Name, now); err != nil {
		t.Fatal(err)
	}
	if err := cs.CceV1alpha1().Subnets(ns).Delete(ctx, subnet.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expectEvents(ctx, t, events,
		"update *v1alpha1.WorkloadEndpoint web-0",
		"delete *v1alpha1.WorkloadEndpoint web-0",
		"delete *v1alpha1.Subnet sbn-a1b2c3d4")
	if _, err := informers.WorkloadEndpoints().Lister().WorkloadEndpoints(ns).Get("web-0"); !apierrors.IsNotFound(err) {
		t.Errorf("lister Get(web-0) after delete: %v, want NotFound", err)
	}
	left, err := informers.WorkloadEndpoints().Lister().List(labels.Everything())
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].Name != "web-1" {
		t.Errorf("lister holds %d weps, want only web-1", len(left))
	}
}

// Objects with wrong field types are rejected by the schema with an error
// that names the field; nothing is stored, so readers keep working.
func TestCRDs_RejectCorruptObjects(t *testing.T) {
	ctx := testContext(t)
	applyCRDs(ctx, t, chartCRDs(t), true)
	ns := cp.Namespace(t)
	cs := versioned.NewForConfigOrDie(cp.Config)
	rc := cs.CceV1alpha1().RESTClient()
	t.Cleanup(func() { removeFinalizers(t, cs, ns) })

	for _, tc := range []struct {
		name, resource, body, field string
	}{
		{"wep ip is a number", "workloadendpoints", `{"spec":{"ip":1234}}`, "spec.ip"},
		{"wep updateAt is not a time", "workloadendpoints", `{"spec":{"updateAt":"yesterday"}}`, "spec.updateAt"},
		{"wep release TTL is a number", "workloadendpoints", `{"spec":{"release":{"TTL":3600}}}`, "spec.release.TTL"},
		{"wep spec is a string", "workloadendpoints", `{"spec":"10.0.0.1"}`, "spec"},
		{"pool priority is a string", "ippools", `{"spec":{"priority":"high"}}`, "spec.priority"},
		{"pool subnets is a string", "ippools", `{"spec":{"eni":{"subnets":"sbn-1"}}}`, "spec.eni.subnets"},
		{"pool range version is a string", "ippools", `{"spec":{"ipv4Ranges":[{"version":"4"}]}}`, "spec.ipv4Ranges[0].version"},
		{"pool interfaceIndex is a string", "ippools",
			`{"status":{"eni":{"enis":{"eni-1":{"interfaceIndex":"three"}}}}}`, "status.eni.enis.eni-1.interfaceIndex"},
		{"pool address isPrimary is a string", "ippools",
			`{"status":{"eni":{"enis":{"eni-1":{"addresses":[{"isPrimary":"yes"}]}}}}}`, "isPrimary"},
		{"subnet availableIPNum is a string", "subnets", `{"status":{"availableIPNum":"many"}}`, "status.availableIPNum"},
		{"subnet exclusive is a string", "subnets", `{"spec":{"exclusive":"yes"}}`, "spec.exclusive"},
		{"psts priority is a string", "podsubnettopologyspreads", `{"spec":{"priority":"high"}}`, "spec.priority"},
		{"psts subnets is a list", "podsubnettopologyspreads", `{"spec":{"subnets":["sbn-1"]}}`, "spec.subnets"},
		{"psts ttl is a number", "podsubnettopologyspreads", `{"spec":{"strategy":{"ttl":3600}}}`, "spec.strategy.ttl"},
		{"psts subnet ipv4 is a string", "podsubnettopologyspreads", `{"spec":{"subnets":{"sbn-1":{"ipv4":"10.0.0.9"}}}}`,
			"spec.subnets.sbn-1.ipv4"},
		{"psts custom range start is a number", "podsubnettopologyspreads",
			`{"spec":{"subnets":{"sbn-1":{"custom":[{"customIPRange":[{"start":1}]}]}}}}`, "start"},
		{"psts selector is a string", "podsubnettopologyspreads", `{"spec":{"selector":"app=web"}}`, "spec.selector"},
		{"pstt spec is an object", "podsubnettopologyspreadtables", `{"spec":{"name":"x"}}`, "spec"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := corruptObject(t, tc.resource, "corrupt", tc.body)
			// Error (not Raw) decodes the server's Status into the error.
			err := rc.Post().Namespace(ns).Resource(tc.resource).
				SetHeader("Content-Type", "application/json").SetHeader("Accept", "application/json").Body(body).Do(ctx).Error()
			if err == nil {
				t.Fatalf("the API server accepted %s", body)
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("got %v, want an Invalid error", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.field) || !strings.Contains(msg, "must be of type") {
				t.Errorf("error %q does not say that %s has the wrong type", msg, tc.field)
			}
			t.Logf("rejected: %v", err)
		})
	}

	// Nothing corrupt was stored: typed lists decode and are empty.
	weps, err := cs.CceV1alpha1().WorkloadEndpoints(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pools, err := cs.CceV1alpha1().IPPools(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	subnets, err := cs.CceV1alpha1().Subnets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pstss, err := cs.CceV1alpha1().PodSubnetTopologySpreads(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pstts, err := cs.CceV1alpha1().PodSubnetTopologySpreadTables(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(weps.Items) + len(pools.Items) + len(subnets.Items) + len(pstss.Items) + len(pstts.Items); n != 0 {
		t.Errorf("%d corrupt objects were stored", n)
	}
}

// The PSTS kinds have a status subresource, as in the reference: create and
// Update keep the stored status and write the spec, UpdateStatus writes the
// status and keeps the spec, and a status of the wrong shape is refused. The
// generated informers see both kinds of write.
func TestCRDs_PSTS_StatusSubresource(t *testing.T) {
	ctx := testContext(t)
	applyCRDs(ctx, t, chartCRDs(t), true)
	ns := cp.Namespace(t)
	cs := versioned.NewForConfigOrDie(cp.Config)
	pstsClient := cs.CceV1alpha1().PodSubnetTopologySpreads(ns)

	factory := externalversions.NewSharedInformerFactoryWithOptions(cs, 0, externalversions.WithNamespace(ns))
	informer := factory.Cce().V1alpha1().PodSubnetTopologySpreads()
	seen := make(chan *cce.PodSubnetTopologySpread, 10)
	if _, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { seen <- obj.(*cce.PodSubnetTopologySpread) },
		UpdateFunc: func(_, obj any) { seen <- obj.(*cce.PodSubnetTopologySpread) },
	}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	defer func() {
		close(stop)
		factory.Shutdown()
	}()
	factory.WaitForCacheSync(ctx.Done())
	// next waits for the informer's view of the PSTS at resourceVersion rv.
	next := func(rv string) *cce.PodSubnetTopologySpread {
		t.Helper()
		for {
			select {
			case p := <-seen:
				if p.ResourceVersion == rv {
					return p
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("the informer did not see resourceVersion %s", rv)
			}
		}
	}

	want := referenceFixtures()[3].want.(*cce.PodSubnetTopologySpread)
	obj := want.DeepCopy()
	obj.ResourceVersion = ""
	created, err := pstsClient.Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(created.Spec, want.Spec) || !equality.Semantic.DeepEqual(created.Status, cce.PodSubnetTopologySpreadStatus{}) {
		t.Fatalf("created spec\n%s\nstatus\n%s\nwant the fixture's spec and no status", pretty(created.Spec), pretty(created.Status))
	}
	next(created.ResourceVersion)

	withStatus := created.DeepCopy()
	withStatus.Status = want.Status
	withStatus.Spec.Priority = 99 // ignored by UpdateStatus
	updated, err := pstsClient.UpdateStatus(ctx, withStatus, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(updated.Status, want.Status) || updated.Spec.Priority != want.Spec.Priority {
		t.Fatalf("after UpdateStatus: priority %d, status\n%s\nwant priority %d and the fixture's status",
			updated.Spec.Priority, pretty(updated.Status), want.Spec.Priority)
	}
	if got := next(updated.ResourceVersion); !equality.Semantic.DeepEqual(got.Status, want.Status) {
		t.Fatalf("informer after UpdateStatus: status\n%s", pretty(got.Status))
	}

	specChange := updated.DeepCopy()
	specChange.Spec.Priority = 7
	specChange.Status.PodAffectedCount = 1000 // ignored by Update
	updated, err = pstsClient.Update(ctx, specChange, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if updated.Spec.Priority != 7 || updated.Status.PodAffectedCount != want.Status.PodAffectedCount {
		t.Fatalf("after Update: priority %d podAffectedCount %d; want 7 and %d (kept)", updated.Spec.Priority,
			updated.Status.PodAffectedCount, want.Status.PodAffectedCount)
	}
	if got := next(updated.ResourceVersion); got.Spec.Priority != 7 {
		t.Fatalf("informer after Update: priority %d, want 7", got.Spec.Priority)
	}
	cached, err := informer.Lister().PodSubnetTopologySpreads(ns).Get(want.Name)
	if err != nil || cached.ResourceVersion != updated.ResourceVersion {
		t.Fatalf("lister: %v %v, want resourceVersion %s", cached, err, updated.ResourceVersion)
	}

	// A status of the wrong shape is refused by the schema.
	rc := cs.CceV1alpha1().RESTClient()
	raw := getRaw(ctx, t, rc, ns, "podsubnettopologyspreads", want.Name)
	raw["status"] = map[string]any{"availableSubnets": map[string]any{"sbn-1": map[string]any{"podCount": "two"}}}
	data, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	err = rc.Put().Namespace(ns).Resource("podsubnettopologyspreads").Name(want.Name).SubResource("status").
		SetHeader("Content-Type", "application/json").SetHeader("Accept", "application/json").Body(data).Do(ctx).Error()
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "status.availableSubnets.sbn-1.podCount") {
		t.Fatalf("corrupt status: %v, want Invalid naming status.availableSubnets.sbn-1.podCount", err)
	}

	// The table: the same through its own typed client.
	table := referenceFixtures()[4].want.(*cce.PodSubnetTopologySpreadTable).DeepCopy()
	tables := cs.CceV1alpha1().PodSubnetTopologySpreadTables(ns)
	createdTable, err := tables.Create(ctx, table, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if createdTable.Status != nil || !equality.Semantic.DeepEqual(createdTable.Spec, table.Spec) {
		t.Fatalf("created table: %d statuses, spec equal %v; want none and the fixture's spec",
			len(createdTable.Status), equality.Semantic.DeepEqual(createdTable.Spec, table.Spec))
	}
	createdTable.Status = table.Status
	updatedTable, err := tables.UpdateStatus(ctx, createdTable, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(updatedTable.Status, table.Status) {
		t.Fatalf("table status after UpdateStatus:\n%s", pretty(updatedTable.Status))
	}
}

// --- helpers ---

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// chartCRDs reads the CRD manifests of the chart.
func chartCRDs(t *testing.T) []*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(crdDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		crds = append(crds, crd)
	}
	return crds
}

// referenceStyle turns one of our CRDs into what the reference installs: the
// same names and subresources (status for the PSTS kinds), a schema that only
// says "object, keep everything", no printer columns.
func referenceStyle(crd *apiextensionsv1.CustomResourceDefinition) *apiextensionsv1.CustomResourceDefinition {
	crd = crd.DeepCopy()
	for i := range crd.Spec.Versions {
		v := &crd.Spec.Versions[i]
		v.Schema = &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
			Type:                   "object",
			XPreserveUnknownFields: ptr.To(true),
		}}
		v.AdditionalPrinterColumns = nil
		v.SelectableFields = nil // the reference's CRDs declare none
	}
	return crd
}

// applyCRDs creates or replaces the CRDs, waits until they are established
// and until the API server validates with the new schemas: strict (ours)
// rejects a field of the wrong type, lenient (the reference's) accepts it.
func applyCRDs(ctx context.Context, t *testing.T, crds []*apiextensionsv1.CustomResourceDefinition, strict bool) {
	t.Helper()
	client := apiextensionsclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions()
	for _, crd := range crds {
		existing, err := client.Get(ctx, crd.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = client.Create(ctx, crd, metav1.CreateOptions{})
		case err == nil:
			crd = crd.DeepCopy()
			crd.ResourceVersion = existing.ResourceVersion
			_, err = client.Update(ctx, crd, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatalf("apply CRD %s: %v", crd.Name, err)
		}
	}
	for _, crd := range crds {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err := client.Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return condition(got, apiextensionsv1.Established) && condition(got, apiextensionsv1.NamesAccepted), nil
		})
		if err != nil {
			t.Fatalf("CRD %s not established: %v", crd.Name, err)
		}
	}

	// Probe with a dry-run create in a namespace that always exists.
	rc := versioned.NewForConfigOrDie(cp.Config).CceV1alpha1().RESTClient()
	probes := map[string]string{
		"workloadendpoints":             `{"spec":{"ip":1}}`,
		"ippools":                       `{"spec":{"priority":"x"}}`,
		"subnets":                       `{"spec":{"exclusive":"x"}}`,
		"podsubnettopologyspreads":      `{"spec":{"priority":"x"}}`,
		"podsubnettopologyspreadtables": `{"spec":"x"}`,
	}
	for resource, spec := range probes {
		body := corruptObject(t, resource, "schema-probe", spec)
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := rc.Post().Namespace(metav1.NamespaceDefault).Resource(resource).Param("dryRun", "All").
				SetHeader("Content-Type", "application/json").SetHeader("Accept", "application/json").Body(body).Do(ctx).Raw()
			if strict {
				return apierrors.IsInvalid(err), nil
			}
			return err == nil || apierrors.IsAlreadyExists(err), nil
		})
		if err != nil {
			t.Fatalf("%s: schema (strict=%v) not in effect: %v", resource, strict, err)
		}
	}
}

func condition(crd *apiextensionsv1.CustomResourceDefinition, typ apiextensionsv1.CustomResourceDefinitionConditionType) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == typ {
			return c.Status == apiextensionsv1.ConditionTrue
		}
	}
	return false
}

// corruptObject builds a raw object of the resource's kind around a JSON
// fragment with the top-level spec and/or status.
func corruptObject(t *testing.T, resource, name, fragment string) []byte {
	t.Helper()
	obj := jsonMap(t, []byte(fragment))
	obj["apiVersion"] = cce.SchemeGroupVersion.String()
	obj["kind"] = kindOf[resource]
	obj["metadata"] = map[string]any{"name": name}
	data, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// kindOf maps the plural of each kind of the group to the kind.
var kindOf = map[string]string{
	"workloadendpoints":             "WorkloadEndpoint",
	"ippools":                       "IPPool",
	"subnets":                       "Subnet",
	"podsubnettopologyspreads":      "PodSubnetTopologySpread",
	"podsubnettopologyspreadtables": "PodSubnetTopologySpreadTable",
}

// withStatus are the resources with a status subresource: create drops the
// status of the body, which is then written through the subresource.
var withStatus = map[string]bool{"podsubnettopologyspreads": true, "podsubnettopologyspreadtables": true}

// createFixture creates an object from raw JSON, its status included: for a
// kind with a status subresource it writes the status with a raw PUT to
// /status, as the reference's controller does with UpdateStatus.
func createFixture(ctx context.Context, t *testing.T, rc rest.Interface, ns, resource string, body []byte) {
	t.Helper()
	createRaw(ctx, t, rc, ns, resource, body)
	want := jsonMap(t, body)
	if !withStatus[resource] || want["status"] == nil {
		return
	}
	stored := getRaw(ctx, t, rc, ns, resource, nameOf(want))
	if stored["status"] != nil {
		t.Fatalf("%s/%s: create kept the status %v; the status subresource is not in effect", resource, nameOf(want), stored["status"])
	}
	stored["status"] = want["status"]
	data, err := json.Marshal(stored)
	if err != nil {
		t.Fatal(err)
	}
	_, err = rc.Put().Namespace(ns).Resource(resource).Name(nameOf(want)).SubResource("status").
		SetHeader("Content-Type", "application/json").SetHeader("Accept", "application/json").Body(data).Do(ctx).Raw()
	if err != nil {
		t.Fatalf("write the status of %s/%s: %v", resource, nameOf(want), err)
	}
}

func createRaw(ctx context.Context, t *testing.T, rc rest.Interface, ns, resource string, body []byte) {
	t.Helper()
	_, err := rc.Post().Namespace(ns).Resource(resource).
		SetHeader("Content-Type", "application/json").SetHeader("Accept", "application/json").Body(body).Do(ctx).Raw()
	if err != nil {
		t.Fatalf("create %s from raw JSON: %v\n%s", resource, err, body)
	}
}

func getRaw(ctx context.Context, t *testing.T, rc rest.Interface, ns, resource, name string) map[string]any {
	t.Helper()
	data, err := rc.Get().Namespace(ns).Resource(resource).Name(name).
		SetHeader("Accept", "application/json").Do(ctx).Raw()
	if err != nil {
		t.Fatalf("get %s/%s: %v", resource, name, err)
	}
	return jsonMap(t, data)
}

// assertStoredAsWritten compares what the server returns with the raw JSON
// that created the object.
func assertStoredAsWritten(ctx context.Context, t *testing.T, rc rest.Interface, ns, resource string, written []byte) {
	t.Helper()
	want := jsonMap(t, written)
	assertStoredMap(t, resource+"/"+nameOf(want), getRaw(ctx, t, rc, ns, resource, nameOf(want)), want)
}

// assertStoredMap checks that every top-level field except metadata is
// identical, and so are the name, labels and finalizers.
func assertStoredMap(t *testing.T, what string, got, want map[string]any) {
	t.Helper()
	for _, m := range []map[string]any{got, want} {
		for k := range m {
			if k == "metadata" {
				continue
			}
			if !reflect.DeepEqual(got[k], want[k]) {
				t.Errorf("%s: stored %q is\n%s\nwritten\n%s", what, k, pretty(got[k]), pretty(want[k]))
			}
		}
	}
	gm, wm := metaOf(got), metaOf(want)
	for _, k := range []string{"name", "labels", "finalizers"} {
		if !reflect.DeepEqual(gm[k], wm[k]) {
			t.Errorf("%s: stored metadata.%s %v, written %v", what, k, gm[k], wm[k])
		}
	}
}

func metaOf(obj map[string]any) map[string]any {
	m, _ := obj["metadata"].(map[string]any)
	return m
}

func nameOf(obj map[string]any) string {
	name, _ := metaOf(obj)["name"].(string)
	return name
}

func resourceOf(t *testing.T, data []byte) string {
	t.Helper()
	kind := jsonMap(t, data)["kind"]
	for resource, k := range kindOf {
		if k == kind {
			return resource
		}
	}
	t.Fatalf("unknown kind %v", kind)
	return ""
}

func getTyped(ctx context.Context, t *testing.T, cs versioned.Interface, ns string, like runtime.Object) runtime.Object {
	t.Helper()
	c := cs.CceV1alpha1()
	var (
		got runtime.Object
		err error
	)
	switch o := like.(type) {
	case *cce.WorkloadEndpoint:
		got, err = c.WorkloadEndpoints(ns).Get(ctx, o.Name, metav1.GetOptions{})
	case *cce.IPPool:
		got, err = c.IPPools(ns).Get(ctx, o.Name, metav1.GetOptions{})
	case *cce.Subnet:
		got, err = c.Subnets(ns).Get(ctx, o.Name, metav1.GetOptions{})
	case *cce.PodSubnetTopologySpread:
		got, err = c.PodSubnetTopologySpreads(ns).Get(ctx, o.Name, metav1.GetOptions{})
	case *cce.PodSubnetTopologySpreadTable:
		got, err = c.PodSubnetTopologySpreadTables(ns).Get(ctx, o.Name, metav1.GetOptions{})
	default:
		t.Fatalf("unexpected %T", like)
	}
	if err != nil {
		t.Fatalf("typed get: %v", err)
	}
	return got
}

func updateTyped(ctx context.Context, t *testing.T, cs versioned.Interface, ns string, obj runtime.Object) {
	t.Helper()
	c := cs.CceV1alpha1()
	var err error
	switch o := obj.(type) {
	case *cce.WorkloadEndpoint:
		_, err = c.WorkloadEndpoints(ns).Update(ctx, o, metav1.UpdateOptions{})
	case *cce.IPPool:
		_, err = c.IPPools(ns).Update(ctx, o, metav1.UpdateOptions{})
	case *cce.Subnet:
		_, err = c.Subnets(ns).Update(ctx, o, metav1.UpdateOptions{})
	case *cce.PodSubnetTopologySpread:
		_, err = c.PodSubnetTopologySpreads(ns).Update(ctx, o, metav1.UpdateOptions{})
	case *cce.PodSubnetTopologySpreadTable:
		_, err = c.PodSubnetTopologySpreadTables(ns).Update(ctx, o, metav1.UpdateOptions{})
	default:
		t.Fatalf("unexpected %T", obj)
	}
	if err != nil {
		t.Fatalf("typed update of %T: %v", obj, err)
	}
}

func setLabel(obj runtime.Object, key, value string) {
	m := obj.(metav1.Object)
	labels := m.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[key] = value
	m.SetLabels(labels)
}

// assertTypedEqual compares a typed object read from the server with the
// expected one: name, labels minus the tests' own, finalizers, spec and
// status. Server-set metadata and TypeMeta are ignored.
func assertTypedEqual(t *testing.T, got, want runtime.Object) {
	t.Helper()
	got = got.DeepCopyObject()
	want = want.DeepCopyObject()
	gm, wm := got.(metav1.Object), want.(metav1.Object)
	labels := map[string]string{}
	for k, v := range gm.GetLabels() {
		if !strings.HasPrefix(k, "cce-ipam.test/") {
			labels[k] = v
		}
	}
	if len(labels) == 0 {
		labels = nil
	}
	if gm.GetName() != wm.GetName() || !reflect.DeepEqual(labels, wm.GetLabels()) ||
		!reflect.DeepEqual(gm.GetFinalizers(), wm.GetFinalizers()) {
		t.Errorf("%T %s: metadata name %q labels %v finalizers %v; want %q %v %v", got, wm.GetName(),
			gm.GetName(), labels, gm.GetFinalizers(), wm.GetName(), wm.GetLabels(), wm.GetFinalizers())
	}
	var g, w any
	switch o := got.(type) {
	case *cce.WorkloadEndpoint:
		g, w = o.Spec, want.(*cce.WorkloadEndpoint).Spec
	case *cce.IPPool:
		g, w = [2]any{o.Spec, o.Status}, [2]any{want.(*cce.IPPool).Spec, want.(*cce.IPPool).Status}
	case *cce.Subnet:
		g, w = [2]any{o.Spec, o.Status}, [2]any{want.(*cce.Subnet).Spec, want.(*cce.Subnet).Status}
	case *cce.PodSubnetTopologySpread:
		g, w = [2]any{o.Spec, o.Status}, [2]any{want.(*cce.PodSubnetTopologySpread).Spec, want.(*cce.PodSubnetTopologySpread).Status}
	case *cce.PodSubnetTopologySpreadTable:
		g, w = [2]any{o.Spec, o.Status}, [2]any{want.(*cce.PodSubnetTopologySpreadTable).Spec, want.(*cce.PodSubnetTopologySpreadTable).Status}
	}
	if !equality.Semantic.DeepEqual(g, w) {
		t.Errorf("%T %s: typed read\n%s\nwant\n%s", got, wm.GetName(), pretty(g), pretty(w))
	}
}

// assertTableRow checks the server-side table (what kubectl get prints) of
// one object.
func assertTableRow(ctx context.Context, t *testing.T, rc rest.Interface, ns, resource string, want map[string]string) {
	t.Helper()
	data, err := rc.Get().Namespace(ns).Resource(resource).Name(want["Name"]).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(ctx).Raw()
	if err != nil {
		t.Fatalf("get %s table: %v", resource, err)
	}
	var table metav1.Table
	if err := json.Unmarshal(data, &table); err != nil {
		t.Fatal(err)
	}
	if len(table.Rows) != 1 {
		t.Fatalf("%s table has %d rows, want 1", resource, len(table.Rows))
	}
	got := map[string]string{}
	for i, c := range table.ColumnDefinitions {
		got[c.Name] = fmt.Sprint(table.Rows[0].Cells[i])
	}
	for col, v := range want {
		if got[col] != v {
			t.Errorf("%s column %q = %q, want %q (row %v)", resource, col, got[col], v, got)
		}
	}
}

// expectEvents waits for every wanted event, in any order; other events are
// ignored.
func expectEvents(ctx context.Context, t *testing.T, events <-chan string, want ...string) {
	t.Helper()
	pending := map[string]bool{}
	for _, w := range want {
		pending[w] = true
	}
	timeout := time.After(30 * time.Second)
	for len(pending) > 0 {
		select {
		case e := <-events:
			delete(pending, e)
		case <-timeout:
			t.Fatalf("informer events not seen within 30s: %v", pending)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
}

// removeFinalizers clears the finalizers of the namespace's weps so that the
// namespace can go away.
func removeFinalizers(t *testing.T, cs versioned.Interface, ns string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	weps, err := cs.CceV1alpha1().WorkloadEndpoints(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range weps.Items {
		w := &weps.Items[i]
		if len(w.Finalizers) == 0 {
			continue
		}
		w.Finalizers = nil
		if _, err := cs.CceV1alpha1().WorkloadEndpoints(ns).Update(ctx, w, metav1.UpdateOptions{}); err != nil {
			t.Errorf("clear finalizer of %s: %v", w.Name, err)
		}
	}
}
