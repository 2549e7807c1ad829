package ipam

import (
	"context"
	"net/netip"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
)

// The wep/ENI repair (the reference's §7.5). A wep's eniID (and mac) must
// name the ENI that holds its address in the cloud: the fixed-IP GC and the
// PSTS release delete the address from the ENI the wep names, and operators
// and the node agent read it. A fixed IP re-added on another ENI whose wep
// update was lost, or a wep written by hand or by an older version, can name
// the wrong one. The repair sets eniID, mac and updateAt from the datastore
// when they differ and the wep has not changed for 2 × the ENI sync period.
//
// Which ENI holds the address is the datastore's record, which the ENI sync
// checks against the cloud address by address every period (reconcile.go):
// a record the last read did not list on its ENI is in the node's drift and
// is not used, nor is one recorded less than a sync period ago.
//
// All weps are repaired, not only fixed and reuse ones as in the reference:
// there ordinary weps carry the epoch as updateAt and nobody reads their
// eniID after the ADD; here every wep carries a real updateAt, and the
// deleted-node sweep, the PSTS release and the operator read any wep's
// eniID. A repair costs one write per wep actually wrong, none in a settled
// cluster.
//
// It runs on the GC pass's paged read of every wep (collectServedWEP), not
// on a loop of its own every ENI sync: no replica caches weps (nodecache.go
// says why), and a second full read every sync period would cost the API
// server more than the reference's whole GC. The write goes through the
// fence like every wep write: the node's token is stamped (the API server's
// fencing policy refuses it from a replica that lost the node), the lease
// deadline bounds it, and the read's resourceVersion guards it against a
// concurrent ADD or DEL of the pod.

// repairWEP sets the eniID of a wep of a served node that names the wrong
// ENI for its address; w is the GC's (possibly stale) copy.
func (i *IPAM) repairWEP(ctx context.Context, w *cce.WorkloadEndpoint) {
	info, ok := i.wepNeedsRepair(w)
	if !ok {
		return
	}
	unlock := i.podLock.lock(w.Namespace + "/" + w.Name)
	defer unlock()
	tok, until, err := i.fenceFor(w.Spec.Node)
	if err != nil {
		return
	}
	ctx, cancel := fencedContext(ctx, until)
	defer cancel()
	upd := w.DeepCopy()
	upd.Spec.ENIID = info.ENIID
	if info.MAC != "" {
		upd.Spec.Mac = info.MAC
	}
	upd.Spec.UpdateAt = metav1.NewTime(i.deps.Clock.Now())
	if tok != nil {
		tok.Stamp(upd)
	}
	_, err = i.deps.CCE.CceV1alpha1().WorkloadEndpoints(w.Namespace).Update(ctx, upd, metav1.UpdateOptions{})
	i.wepWritten(err)
	switch {
	case err == nil:
		i.metrics.gcActions.WithLabelValues(gcWEPENIRepaired).Inc()
		i.log.Info("repair: set a wep's eniID to the ENI that holds its address", "wep", w.Namespace+"/"+w.Name,
			"ip", info.Addr, "eni", info.ENIID, "was", w.Spec.ENIID)
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		// Changed or gone since the GC's read: the next pass sees it anew.
	default:
		i.log.Warn("repair: could not update a wep's eniID; next pass", "wep", w.Namespace+"/"+w.Name, "err", err)
	}
}

const gcWEPENIRepaired = "wep_eni_repaired"

// wepNeedsRepair returns the datastore record of w's address when w names
// another ENI than the one the cloud confirmed holds it, and w is old enough.
func (i *IPAM) wepNeedsRepair(w *cce.WorkloadEndpoint) (datastore.IPInfo, bool) {
	addr, err := netip.ParseAddr(w.Spec.IP)
	if err != nil {
		return datastore.IPInfo{}, false
	}
	info, err := i.store.LookupIP(addr)
	if err != nil || info.Node != w.Spec.Node || info.State != datastore.StateAssigned || info.ENIID == w.Spec.ENIID ||
		info.Owner.Pod() != (datastore.PodKey{Namespace: w.Namespace, Name: w.Name}) {
		return datastore.IPInfo{}, false
	}
	now := i.deps.Clock.Now()
	sync := i.cfg.ENISyncPeriod
	if now.Sub(w.Spec.UpdateAt.Time) < 2*sync || now.Sub(info.AddedAt) < sync+i.cfg.ReadLag {
		return datastore.IPInfo{}, false
	}
	n, ok := i.node(w.Spec.Node)
	if !ok {
		return datastore.IPInfo{}, false
	}
	n.mu.Lock()
	_, doubted := n.drift.absent[info.Addr]
	n.mu.Unlock()
	return info, !doubted
}
