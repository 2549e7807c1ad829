//go:build integration

package spread_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/spread"
)

func tableEntry(name string, ids ...string) cce.PodSubnetTopologySpreadSpec {
	s := spreadOver(name, false, ids...).Spec
	s.Name = name
	return s
}

func (e *env) createTable(name string, entries ...cce.PodSubnetTopologySpreadSpec) *cce.PodSubnetTopologySpreadTable {
	e.t.Helper()
	tb, err := e.cce.CceV1alpha1().PodSubnetTopologySpreadTables(e.ns).Create(e.ctx, &cce.PodSubnetTopologySpreadTable{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec:       entries,
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return tb
}

func (e *env) updateTable(name string, mod func(*cce.PodSubnetTopologySpreadTable)) {
	e.t.Helper()
	client := e.cce.CceV1alpha1().PodSubnetTopologySpreadTables(e.ns)
	// The controller writes the table's status meanwhile: a conflict is
	// read again, as any client of a controlled object must.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		tb, err := client.Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mod(tb)
		_, err = client.Update(e.ctx, tb, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

// spreadsOf waits until the namespace's PSTS objects controlled by tb are
// exactly names, each with its entry's spec.
func (e *env) spreadsOf(tb *cce.PodSubnetTopologySpreadTable, what string, want ...cce.PodSubnetTopologySpreadSpec) {
	e.t.Helper()
	e.eventually(what, func() (bool, string) {
		list, err := e.cce.CceV1alpha1().PodSubnetTopologySpreads(e.ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var got []string
		for _, p := range list.Items {
			ref := metav1.GetControllerOf(&p)
			if ref == nil || ref.UID != tb.UID || p.DeletionTimestamp != nil {
				continue
			}
			got = append(got, p.Name)
			i := slices.IndexFunc(want, func(s cce.PodSubnetTopologySpreadSpec) bool { return s.Name == p.Name })
			if i < 0 || !equality.Semantic.DeepEqual(p.Spec, want[i]) {
				return false, fmt.Sprintf("%s has spec %+v", p.Name, p.Spec)
			}
		}
		if len(got) != len(want) {
			return false, fmt.Sprintf("owned %v, want %d", got, len(want))
		}
		return true, ""
	})
}

// tableStatus waits until the table's status has the names, in order, and
// check passes.
func (e *env) tableStatus(name, what string, names []string, check func([]cce.PodSubnetTopologySpreadStatus) string) {
	e.t.Helper()
	e.eventually(what, func() (bool, string) {
		tb, err := e.cce.CceV1alpha1().PodSubnetTopologySpreadTables(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		var got []string
		for _, s := range tb.Status {
			got = append(got, s.Name)
		}
		if !slices.Equal(got, names) {
			return false, fmt.Sprintf("status names %v", got)
		}
		if check != nil {
			if msg := check(tb.Status); msg != "" {
				return false, fmt.Sprintf("%s in %+v", msg, tb.Status)
			}
		}
		return true, ""
	})
}

// A table creates its PSTS objects owned by it, sets drifted specs back,
// deletes those it no longer lists, shows their statuses in spec order, and
// takes them along when it is deleted.
func TestTable_CreatesUpdatesDeletes(t *testing.T) {
	e := newEnv(t)
	ok := e.subnet("ok", "10.50.0.0/24", nil)
	e.start(spread.DefaultConfig())
	a, b := tableEntry("a", ok), tableEntry("b", "sbn-none-"+e.ns)
	tb := e.createTable("t", b, a)
	e.spreadsOf(tb, "a and b created", a, b)
	e.tableStatus("t", "statuses of b and a", []string{"b", "a"}, func(st []cce.PodSubnetTopologySpreadStatus) string {
		if st[0].UnavailableSubnetsNum != 1 || st[1].AvailableSubnetsNum != 1 {
			return "the PSTS statuses not copied"
		}
		return ""
	})
	p, err := e.getSpread("a")
	if err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(p); ref.Kind != "PodSubnetTopologySpreadTable" || ref.APIVersion != "cce.io/v1alpha1" || ref.Name != "t" {
		t.Fatalf("controller reference %+v", ref)
	}

	// The table's entry changes: the PSTS follows.
	a2 := tableEntry("a", ok, "sbn-extra-"+e.ns)
	a2.Priority = 7
	e.updateTable("t", func(tb *cce.PodSubnetTopologySpreadTable) { tb.Spec[1] = a2 })
	e.spreadsOf(tb, "a updated", a2, b)

	// The PSTS drifts: the table sets it back.
	p, err = e.getSpread("b")
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.Subnets = map[string]cce.SubnetAllocation{"sbn-hand-edited": {}}
	if _, err := e.cce.CceV1alpha1().PodSubnetTopologySpreads(e.ns).Update(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.spreadsOf(tb, "b set back", a2, b)

	// b is no longer listed: deleted.
	e.updateTable("t", func(tb *cce.PodSubnetTopologySpreadTable) { tb.Spec = tb.Spec[1:] })
	e.spreadsOf(tb, "b deleted", a2)
	e.tableStatus("t", "status of a only", []string{"a"}, nil)
	if _, err := e.getSpread("b"); !isNotFound(err) {
		t.Fatalf("b: %v, want deleted", err)
	}

	// The table is deleted: the garbage collector takes a.
	if err := e.cce.CceV1alpha1().PodSubnetTopologySpreadTables(e.ns).Delete(e.ctx, "t", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("a collected with its table", func() (bool, string) {
		_, err := e.getSpread("a")
		return isNotFound(err), fmt.Sprintf("get a: %v", err)
	})
	for op, want := range map[string]float64{"create": 2, "update": 2, "delete": 1} {
		if n := counter(t, e.reg, "cce_ipam_spread_table_psts_writes_total", map[string]string{"op": op}); n != want {
			t.Errorf("%v PSTS %s writes counted, want %v", n, op, want)
		}
	}
}

// A table never takes over a PSTS it does not control: a Warning event and
// the entry's status say so, the PSTS stays as it is. Once it is gone, the
// table creates its own.
func TestTable_RefusesForeign(t *testing.T) {
	e := newEnv(t)
	e.start(spread.DefaultConfig())
	user := spreadOver("user", false, "sbn-user-"+e.ns)
	user.Labels = map[string]string{"by": "hand"}
	e.createSpread(user)
	mine := tableEntry("mine", "sbn-mine-"+e.ns)
	wanted := tableEntry("user", "sbn-table-"+e.ns)
	tb := e.createTable("t", wanted, mine, tableEntry("Bad_Name"), tableEntry("mine"))

	e.spreadsOf(tb, "only mine created", mine)
	e.tableStatus("t", "refusals in the status", []string{"user", "mine", "Bad_Name", "mine"},
		func(st []cce.PodSubnetTopologySpreadStatus) string {
			if msg := st[0].UnavailableSubnets["sbn-table-"+e.ns].Message; !strings.Contains(msg, "is not owned by this table") {
				return fmt.Sprintf("user entry message %q", msg)
			}
			return ""
		})
	e.eventContaining(e.ns, "t", spread.ReasonEntryRefused, "PodSubnetTopologySpread "+e.ns+"/user exists and is not owned by this table")
	e.eventContaining(e.ns, "t", spread.ReasonEntryRefused, `"Bad_Name" is not a valid object name`)
	e.eventContaining(e.ns, "t", spread.ReasonEntryRefused, `entry 3 repeats the name "mine" of entry 1`)
	got, err := e.getSpread("user")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.OwnerReferences) != 0 || got.Labels["by"] != "hand" || !equality.Semantic.DeepEqual(got.Spec, user.Spec) {
		t.Fatalf("the foreign PSTS was touched: %+v", got)
	}

	if err := e.cce.CceV1alpha1().PodSubnetTopologySpreads(e.ns).Delete(e.ctx, "user", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.spreadsOf(tb, "the table's own user created once the foreign one is gone", mine, wanted)
}
