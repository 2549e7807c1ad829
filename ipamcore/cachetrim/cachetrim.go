// Package cachetrim holds the transforms the informers apply before they
// cache an object: what no controller here reads is dropped, so that the
// caches of every replica stay small.
package cachetrim

import "k8s.io/apimachinery/pkg/api/meta"

// StripManagedFields is an informer transform (cache.TransformFunc) that
// drops server-side apply bookkeeping, often half an object's size, which
// nothing here reads. Objects without metadata pass unchanged.
func StripManagedFields(obj any) (any, error) {
	if a, err := meta.Accessor(obj); err == nil && a.GetManagedFields() != nil {
		a.SetManagedFields(nil)
	}
	return obj, nil
}
