package spread

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/cache"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// tableKind is the kind of a PodSubnetTopologySpreadTable in owner
// references.
const tableKind = "PodSubnetTopologySpreadTable"

// Event reasons of the PSTT controller.
const (
	ReasonEntryRefused      = "EntryRefused"
	ReasonSpreadWriteFailed = "PodSubnetTopologySpreadWriteFailed"
)

// Reasons an entry is refused (the "reason" label of the refusals metric).
const (
	refusedForeign = "foreign"
	refusedInvalid = "invalid"
)

func isCCEGroup(apiVersion string) bool {
	return strings.HasPrefix(apiVersion, cce.SchemeGroupVersion.Group+"/")
}

// refusal is an entry of a table that is not applied.
type refusal struct {
	entry   int
	reason  string // refusedForeign or refusedInvalid
	message string
}

// tablePlan is what the reconcile of a table writes.
type tablePlan struct {
	// create are the PSTS objects of entries that have none yet.
	create []*cce.PodSubnetTopologySpread
	// update are owned PSTS objects whose spec drifted from their entry,
	// with the entry's spec.
	update []*cce.PodSubnetTopologySpread
	// remove are owned PSTS objects no entry lists, by name.
	remove []*cce.PodSubnetTopologySpread
	// refused are the entries left unapplied, in spec order.
	refused []refusal
	// status is the table's status: per entry, in spec order, the status
	// of its PSTS, or why it has none.
	status []cce.PodSubnetTopologySpreadStatus
}

// planTable decides a table's writes from the PSTS objects of its namespace
// named by its entries (existing, by name) and those it controls (owned).
// An entry's PSTS is created owned by the table when missing and has its
// spec set back when it drifted; a PSTS of the same name that the table
// does not control (none, another, or a deleted table of the same name) is
// never taken over. An owned PSTS no entry names is deleted.
func planTable(t *cce.PodSubnetTopologySpreadTable, existing map[string]*cce.PodSubnetTopologySpread,
	owned []*cce.PodSubnetTopologySpread) tablePlan {
	var plan tablePlan
	listed := map[string]int{} // entry name → its first entry
	for i := range t.Spec {
		entry := &t.Spec[i]
		st := cce.PodSubnetTopologySpreadStatus{Name: entry.Name}
		var refused *refusal
		first, dup := listed[entry.Name]
		switch {
		case entry.Name == "":
			refused = &refusal{i, refusedInvalid, fmt.Sprintf("entry %d has no name", i)}
		case len(validation.IsDNS1123Subdomain(entry.Name)) > 0:
			refused = &refusal{i, refusedInvalid, fmt.Sprintf("entry %d: %q is not a valid object name: %s", i, entry.Name,
				strings.Join(validation.IsDNS1123Subdomain(entry.Name), "; "))}
		case dup:
			refused = &refusal{i, refusedInvalid, fmt.Sprintf("entry %d repeats the name %q of entry %d", i, entry.Name, first)}
		}
		if refused == nil {
			listed[entry.Name] = i
			switch cur := existing[entry.Name]; {
			case cur == nil:
				plan.create = append(plan.create, ownedSpread(t, entry))
			case !controlledBy(cur, t):
				refused = &refusal{i, refusedForeign, fmt.Sprintf(
					"PodSubnetTopologySpread %s/%s exists and is not owned by this table: it is left alone", t.Namespace, entry.Name)}
			default:
				st = *cur.Status.DeepCopy()
				if st.Name == "" {
					st.Name = entry.Name
				}
				if cur.DeletionTimestamp == nil && !equality.Semantic.DeepEqual(cur.Spec, *entry) {
					upd := cur.DeepCopy()
					upd.Spec = *entry.DeepCopy()
					plan.update = append(plan.update, upd)
				}
			}
		}
		if refused != nil {
			plan.refused = append(plan.refused, *refused)
			st = refusedStatus(entry, refused.message)
		}
		plan.status = append(plan.status, st)
	}
	for _, p := range owned {
		if _, ok := listed[p.Name]; !ok && p.DeletionTimestamp == nil && controlledBy(p, t) {
			plan.remove = append(plan.remove, p)
		}
	}
	slices.SortFunc(plan.remove, func(a, b *cce.PodSubnetTopologySpread) int { return strings.Compare(a.Name, b.Name) })
	return plan
}

// controlledBy reports whether t is p's controller.
func controlledBy(p *cce.PodSubnetTopologySpread, t *cce.PodSubnetTopologySpreadTable) bool {
	ref := tableRef(p)
	return ref != nil && ref.UID == t.UID && ref.Name == t.Name
}

// ownedSpread is the PSTS of entry, controlled by t. It blocks no owner
// deletion: the garbage collector deletes it after the table (a blocking
// reference would need the right to update the table's finalizers).
func ownedSpread(t *cce.PodSubnetTopologySpreadTable, entry *cce.PodSubnetTopologySpreadSpec) *cce.PodSubnetTopologySpread {
	controller := true
	return &cce.PodSubnetTopologySpread{
		ObjectMeta: metav1.ObjectMeta{
			Name:      entry.Name,
			Namespace: t.Namespace,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: cce.SchemeGroupVersion.String(),
				Kind:       tableKind,
				Name:       t.Name,
				UID:        t.UID,
				Controller: &controller,
			}},
		},
		Spec: *entry.DeepCopy(),
	}
}

// refusedStatus is the status of a refused entry: the message on each of
// its subnets, the only place for a message in a PSTS status.
func refusedStatus(entry *cce.PodSubnetTopologySpreadSpec, msg string) cce.PodSubnetTopologySpreadStatus {
	st := cce.PodSubnetTopologySpreadStatus{Name: entry.Name}
	for id := range entry.Subnets {
		st.UnavailableSubnets = setSubnet(st.UnavailableSubnets, id, cce.SubnetPodStatus{ID: id, Message: msg})
	}
	st.UnavailableSubnetsNum = int32(len(st.UnavailableSubnets))
	return st
}

// syncTable applies the plan of the table key, then writes its status when
// it changed.
func (r *run) syncTable(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil //nolint:nilerr // keys come from our own handlers; a bad one cannot get better
	}
	t, err := r.tables.PodSubnetTopologySpreadTables(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil // the garbage collector deletes its PSTS objects
	}
	if err != nil {
		return err
	}
	if t.DeletionTimestamp != nil {
		return nil
	}
	existing := map[string]*cce.PodSubnetTopologySpread{}
	for _, entry := range t.Spec {
		if p, err := r.spreads.PodSubnetTopologySpreads(ns).Get(entry.Name); err == nil {
			existing[entry.Name] = p
		}
	}
	var owned []*cce.PodSubnetTopologySpread
	objs, _ := r.spreadIdx.ByIndex(byOwner, string(t.UID))
	for _, obj := range objs {
		if p, ok := obj.(*cce.PodSubnetTopologySpread); ok && p.Namespace == ns {
			owned = append(owned, p)
		}
	}
	plan := planTable(t, existing, owned)
	r.log.Debug("table planned", "table", key, "entries", len(t.Spec), "create", len(plan.create), "update", len(plan.update),
		"delete", len(plan.remove), "refused", len(plan.refused))

	var errs []error
	client := r.deps.CCE.CceV1alpha1().PodSubnetTopologySpreads(ns)
	for _, p := range plan.create {
		_, err := client.Create(ctx, p, metav1.CreateOptions{})
		errs = append(errs, r.spreadWritten(t, "create", p.Name, err))
	}
	for _, p := range plan.update {
		_, err := client.Update(ctx, p, metav1.UpdateOptions{})
		errs = append(errs, r.spreadWritten(t, "update", p.Name, err))
	}
	for _, p := range plan.remove {
		err := client.Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})
		if apierrors.IsNotFound(err) {
			err = nil
		}
		errs = append(errs, r.spreadWritten(t, "delete", p.Name, err))
	}

	if !equality.Semantic.DeepEqual(t.Status, plan.status) {
		upd := t.DeepCopy()
		upd.Status = plan.status
		_, err := r.deps.CCE.CceV1alpha1().PodSubnetTopologySpreadTables(ns).UpdateStatus(ctx, upd, metav1.UpdateOptions{})
		switch {
		case err == nil:
			r.metrics.statusWrites.WithLabelValues(controllerTable).Inc()
			// A refusal changes the status: it is reported once, when new.
			for _, ref := range plan.refused {
				r.metrics.refused.WithLabelValues(ref.reason).Inc()
				r.events.Event(t, corev1.EventTypeWarning, ReasonEntryRefused, ref.message)
			}
		case apierrors.IsNotFound(err):
		case apierrors.IsConflict(err):
			errs = append(errs, err)
		default:
			r.events.Eventf(t, corev1.EventTypeWarning, ReasonStatusUpdateFailed, "update status: %v", err)
			errs = append(errs, fmt.Errorf("update status of %s: %w", key, err))
		}
	}
	return errors.Join(errs...)
}

// spreadWritten accounts for one PSTS write of table t: a failure is
// reported on the table (a conflict or a name taken meanwhile only retried:
// the caches are behind).
func (r *run) spreadWritten(t *cce.PodSubnetTopologySpreadTable, op, name string, err error) error {
	switch {
	case err == nil:
		r.metrics.spreadWrites.WithLabelValues(op).Inc()
		r.log.Info("table wrote a PodSubnetTopologySpread", "table", t.Namespace+"/"+t.Name, "op", op, "psts", name)
		return nil
	case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
		return fmt.Errorf("%s PodSubnetTopologySpread %s: %w", op, name, err)
	}
	r.events.Eventf(t, corev1.EventTypeWarning, ReasonSpreadWriteFailed, "%s PodSubnetTopologySpread %s: %v", op, name, err)
	return fmt.Errorf("%s PodSubnetTopologySpread %s: %w", op, name, err)
}
