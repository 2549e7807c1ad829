package ipam

import (
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
)

// StoreForTest gives the external tests the datastore, to check an address's
// record and the store's invariants after a path ran.
func (i *IPAM) StoreForTest() *datastore.Store { return i.store }

// StatefulSetCachedForTest reports whether the IPAM's StatefulSet informer
// has the StatefulSet, for tests that wait for it to see a delete.
func (i *IPAM) StatefulSetCachedForTest(namespace, name string) bool {
	_, err := i.statefulSets.StatefulSets(namespace).Get(name)
	return err == nil
}

// ENICreatingForTest reports whether an ENI creation runs for the node, for
// tests that check a sync started none.
func (i *IPAM) ENICreatingForTest(node string) bool {
	n, ok := i.node(node)
	return ok && n.eniCreating()
}

// SubnetCachedForTest returns the IPAM's cached Subnet resource (nil when
// the cache lacks it), for tests that wait for it to see a change.
func (i *IPAM) SubnetCachedForTest(id string) *cce.Subnet { return i.subnetCR(id) }

// ReleaseSettledForTest waits until no release of the pod is still finishing
// here: a DEL is answered once its wep's delete is marked, and the finalizer's
// removal and the address's release follow under the pod's lock.
func (i *IPAM) ReleaseSettledForTest(namespace, name string) {
	i.podLock.lock(namespace + "/" + name)()
}

// SetFinishPendingMaxForTest sets the bound of releases per node answered
// and not yet finished (maxFinishPendingPerNode).
func (i *IPAM) SetFinishPendingMaxForTest(n int) { i.finishPendingMax = n }
