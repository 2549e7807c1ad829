// Package psts is the pure logic of PodSubnetTopologySpread (PSTS): the
// effective strategy of a subnet entry, the address ranges a strategy may
// take from, which addresses of a subnet are usable, and which PSTS a pod
// falls under. It does no I/O: the allocator (ipamcore/ipam), the webhooks
// and the status controller share it, so they cannot disagree on what a
// PSTS means.
package psts
