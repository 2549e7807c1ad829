package spread

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

func table(uid types.UID, entries ...cce.PodSubnetTopologySpreadSpec) *cce.PodSubnetTopologySpreadTable {
	return &cce.PodSubnetTopologySpreadTable{
		ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "ns", UID: uid},
		Spec:       entries,
	}
}

func entry(name string, subnets ...string) cce.PodSubnetTopologySpreadSpec {
	e := cce.PodSubnetTopologySpreadSpec{Name: name, Subnets: map[string]cce.SubnetAllocation{}}
	for _, s := range subnets {
		e.Subnets[s] = cce.SubnetAllocation{}
	}
	return e
}

// existingOf is a PSTS of entry e as the table would have created it,
// with a status.
func existingOf(tb *cce.PodSubnetTopologySpreadTable, e cce.PodSubnetTopologySpreadSpec, pods int32) *cce.PodSubnetTopologySpread {
	p := ownedSpread(tb, &e)
	p.UID = types.UID("psts-" + e.Name)
	p.Status = cce.PodSubnetTopologySpreadStatus{Name: e.Name, PodMatchedCount: pods}
	return p
}

func names(list []*cce.PodSubnetTopologySpread) string {
	var out []string
	for _, p := range list {
		out = append(out, p.Name)
	}
	return strings.Join(out, ",")
}

func TestPlanTable_CreatesMissingOwned(t *testing.T) {
	tb := table("uid-1", entry("a", "sbn-1"), entry("b"))
	plan := planTable(tb, nil, nil)
	if names(plan.create) != "a,b" || len(plan.update)+len(plan.remove)+len(plan.refused) != 0 {
		t.Fatalf("plan %+v", plan)
	}
	ref := metav1.GetControllerOf(plan.create[0])
	if ref == nil || ref.UID != "uid-1" || ref.Kind != tableKind || ref.APIVersion != "cce.io/v1alpha1" || ref.Name != "t" {
		t.Fatalf("controller reference %+v", ref)
	}
	if plan.create[0].Namespace != "ns" || plan.create[0].Spec.Subnets == nil {
		t.Fatalf("created %+v", plan.create[0])
	}
	if len(plan.status) != 2 || plan.status[0].Name != "a" || plan.status[1].Name != "b" {
		t.Fatalf("status %+v", plan.status)
	}
}

func TestPlanTable_UpdatesDriftAndCopiesStatusInOrder(t *testing.T) {
	tb := table("uid-1", entry("b", "sbn-2"), entry("a", "sbn-1"))
	a := existingOf(tb, entry("a", "sbn-1"), 3)
	b := existingOf(tb, entry("b", "sbn-1"), 7) // drifted: sbn-1 instead of sbn-2
	plan := planTable(tb, map[string]*cce.PodSubnetTopologySpread{"a": a, "b": b}, []*cce.PodSubnetTopologySpread{a, b})
	if names(plan.update) != "b" || len(plan.create)+len(plan.remove)+len(plan.refused) != 0 {
		t.Fatalf("plan %+v", plan)
	}
	if _, ok := plan.update[0].Spec.Subnets["sbn-2"]; !ok || plan.update[0].UID != b.UID {
		t.Fatalf("update %+v", plan.update[0])
	}
	if plan.status[0].PodMatchedCount != 7 || plan.status[1].PodMatchedCount != 3 {
		t.Fatalf("status not in spec order: %+v", plan.status)
	}
}

func TestPlanTable_DeletesOwnedNoLongerListed(t *testing.T) {
	tb := table("uid-1", entry("a"))
	a, gone := existingOf(tb, entry("a"), 0), existingOf(tb, entry("gone"), 0)
	other := existingOf(table("uid-2"), entry("other"), 0) // another table's
	plan := planTable(tb, map[string]*cce.PodSubnetTopologySpread{"a": a}, []*cce.PodSubnetTopologySpread{gone, a, other})
	if names(plan.remove) != "gone" || len(plan.create)+len(plan.update) != 0 {
		t.Fatalf("plan %+v", plan)
	}
}

func TestPlanTable_NeverTakesOverForeign(t *testing.T) {
	tb := table("uid-1", entry("mine"), entry("user", "sbn-1", "sbn-2"), entry("old"), entry("other"))
	user := spreadOf("user", map[string]cce.SubnetAllocation{"sbn-9": {}}) // no owner
	user.Namespace = "ns"
	old := existingOf(table("uid-0"), entry("old"), 0) // a deleted table of the same name
	other := existingOf(table("uid-2"), entry("other"), 0)
	other.OwnerReferences[0].Name = "t2"
	plan := planTable(tb, map[string]*cce.PodSubnetTopologySpread{"user": user, "old": old, "other": other}, nil)
	if names(plan.create) != "mine" || len(plan.update)+len(plan.remove) != 0 {
		t.Fatalf("plan %+v", plan)
	}
	if len(plan.refused) != 3 {
		t.Fatalf("refused %+v", plan.refused)
	}
	for _, r := range plan.refused {
		if r.reason != refusedForeign || !strings.Contains(r.message, "is not owned by this table") {
			t.Errorf("refusal %+v", r)
		}
	}
	st := plan.status[1]
	if st.Name != "user" || st.UnavailableSubnetsNum != 2 || !strings.Contains(st.UnavailableSubnets["sbn-1"].Message, "ns/user exists") {
		t.Fatalf("status of a refused entry %+v", st)
	}
}

func TestPlanTable_InvalidEntries(t *testing.T) {
	tb := table("uid-1", entry(""), entry("Bad_Name"), entry("a"), entry("a", "sbn-1"))
	plan := planTable(tb, nil, nil)
	if names(plan.create) != "a" {
		t.Fatalf("create %s", names(plan.create))
	}
	want := []string{"entry 0 has no name", `entry 1: "Bad_Name" is not a valid object name`, `entry 3 repeats the name "a" of entry 2`}
	if len(plan.refused) != len(want) {
		t.Fatalf("refused %+v", plan.refused)
	}
	for i, w := range want {
		if plan.refused[i].reason != refusedInvalid || !strings.HasPrefix(plan.refused[i].message, w) {
			t.Errorf("refusal %d = %+v, want %q", i, plan.refused[i], w)
		}
	}
	if len(plan.status) != 4 || plan.status[3].UnavailableSubnets["sbn-1"].Message == "" {
		t.Fatalf("status %+v", plan.status)
	}
}

func TestPlanTable_Steady(t *testing.T) {
	tb := table("uid-1", entry("a", "sbn-1"))
	a := existingOf(tb, entry("a", "sbn-1"), 1)
	a.Spec.Subnets = map[string]cce.SubnetAllocation{"sbn-1": {}}
	plan := planTable(tb, map[string]*cce.PodSubnetTopologySpread{"a": a}, []*cce.PodSubnetTopologySpread{a})
	if len(plan.create)+len(plan.update)+len(plan.remove)+len(plan.refused) != 0 {
		t.Fatalf("a steady table plans writes: %+v", plan)
	}
}

func TestPlanTable_DeletingOwnedIsLeftToFinish(t *testing.T) {
	tb := table("uid-1", entry("a", "sbn-2"))
	a := existingOf(tb, entry("a", "sbn-1"), 0)
	now := metav1.Now()
	a.DeletionTimestamp = &now
	plan := planTable(tb, map[string]*cce.PodSubnetTopologySpread{"a": a}, []*cce.PodSubnetTopologySpread{a})
	if len(plan.create)+len(plan.update)+len(plan.remove)+len(plan.refused) != 0 {
		t.Fatalf("plan %+v", plan)
	}
}
