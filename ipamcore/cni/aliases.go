package cni

import "github.com/cce-ipam/sharded/ipamcore/podip"

// The contract types moved to podip, which the IPAM and the shard router
// implement without importing this adapter. These aliases keep the callers
// that still name them here compiling until they move; new code uses podip.
type (
	// PodRef is podip.PodRef.
	PodRef = podip.PodRef
	// Endpoint is podip.Endpoint.
	Endpoint = podip.Endpoint
	// Backend is podip.Backend.
	Backend = podip.Backend
)
