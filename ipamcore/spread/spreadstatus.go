package spread

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// Event reasons of the PSTS status controller.
const (
	ReasonStatusUpdateFailed = "StatusUpdateFailed"
	ReasonInvalidEndpoints   = "InvalidWorkloadEndpoints"
)

// maxProblemsInEvent bounds the problems one event lists.
const maxProblemsInEvent = 5

// syncStatus recomputes the status of the PSTS key from the caches and
// writes it when it changed.
func (r *run) syncStatus(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil //nolint:nilerr // keys come from our own handlers; a bad one cannot get better
	}
	p, err := r.spreads.PodSubnetTopologySpreads(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if p.DeletionTimestamp != nil {
		return nil
	}
	in := statusInputs{Subnets: map[string]*cce.Subnet{}}
	for id := range p.Spec.Subnets {
		if sn, err := r.subnets.Subnets(cce.SubnetNamespace).Get(id); err == nil {
			in.Subnets[id] = sn
		}
	}
	weps, _ := r.weps.ByIndex(byPSTS, key)
	for _, obj := range weps {
		if w, ok := obj.(*cce.WorkloadEndpoint); ok {
			in.WEPs = append(in.WEPs, w)
		}
	}
	pods, _ := r.pods.ByIndex(byPSTS, key)
	for _, obj := range pods {
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
			in.Pods = append(in.Pods, m.Name)
		}
	}
	st, problems := computeStatus(p, in)
	if statusEqual(p.Status, st) {
		return nil
	}
	upd := p.DeepCopy()
	upd.Status = st
	_, err = r.deps.CCE.CceV1alpha1().PodSubnetTopologySpreads(ns).UpdateStatus(ctx, upd, metav1.UpdateOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case apierrors.IsConflict(err):
		return err // the cache is behind: retry once it caught up
	case err != nil:
		r.events.Eventf(p, corev1.EventTypeWarning, ReasonStatusUpdateFailed, "update status: %v", err)
		return fmt.Errorf("update status of %s: %w", key, err)
	}
	r.metrics.statusWrites.WithLabelValues(controllerStatus).Inc()
	r.log.Debug("psts status written", "psts", key, "available", st.AvailableSubnetsNum,
		"unavailable", st.UnavailableSubnetsNum, "matched", st.PodMatchedCount, "affected", st.PodAffectedCount)
	if len(problems) > 0 {
		r.events.Event(p, corev1.EventTypeWarning, ReasonInvalidEndpoints, summarize(problems))
	}
	return nil
}

// statusEqual compares two statuses as the API server stores them:
// equality.Semantic takes an empty map for no map, as JSON's omitempty does.
func statusEqual(a, b cce.PodSubnetTopologySpreadStatus) bool {
	return equality.Semantic.DeepEqual(a, b)
}

func summarize(problems []string) string {
	if len(problems) <= maxProblemsInEvent {
		return strings.Join(problems, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(problems[:maxProblemsInEvent], "; "), len(problems)-maxProblemsInEvent)
}
