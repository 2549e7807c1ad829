package ipam

import "github.com/cce-ipam/sharded/ipamcore/datastore"

// StoreForTest gives the external tests the datastore, to check an address's
// record and the store's invariants after a path ran.
func (i *IPAM) StoreForTest() *datastore.Store { return i.store }

// StatefulSetCachedForTest reports whether the IPAM's StatefulSet informer
// has the StatefulSet, for tests that wait for it to see a delete.
func (i *IPAM) StatefulSetCachedForTest(namespace, name string) bool {
	_, err := i.statefulSets.StatefulSets(namespace).Get(name)
	return err == nil
}
