// Package podip is the contract of the CNI backend: what a pod's IP request
// names (PodRef), what it is answered with (Endpoint), the Backend that
// answers it, and the error kinds every layer shares.
//
// It sits below both sides of that contract. The IPAM (ipamcore/ipam)
// implements Backend; the shard router implements it too, in front of the
// IPAM; the gRPC adapter (ipamcore/cni) serves any Backend to the CNI plugin
// and carries the shared error kinds over the wire. None of them imports
// another for these types:
//
//	var b podip.Backend = ipamImpl          // or the shard router
//	ep, err := b.Allocate(ctx, podip.PodRef{Namespace: "default", Name: "web-0", ContainerID: id})
//	if errors.Is(err, podip.ErrNotHere) {
//		// this replica does not serve the pod's node now: route again
//	}
//
// The package holds types and sentinels only: no I/O, no state.
package podip
