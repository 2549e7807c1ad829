// Package subnet keeps a Subnet custom resource for every subnet that an
// IPPool or a PodSubnetTopologySpread (PSTS) lists, with its free-IP count
// and exhaustion flag current.
//
// The reference meant to mark a subnet exhausted when the cloud said "subnet
// has no more IP" but wrote the unmodified object back; here the periodic
// sync sets status.hasNoMoreIP from DescribeSubnet's availableIp (and clears
// it, also when the IPAM had declared it, once the cloud reports free
// addresses again), reports the subnet becoming exhausted with a Warning
// event on the Subnet, and the IPAM's pool planner skips ENIs of exhausted
// subnets. A missing Subnet of a PSTS subnet is created exclusive when the
// PSTS's strategy picks addresses itself (Fixed, Manual, Custom): the PSTS
// validating webhook normally creates it, this covers a PSTS admitted while
// the webhook was down.
//
//	c := subnet.NewController(subnet.DefaultConfig(), cceClient, provider, logger, reg, subnet.WithEvents(kube))
//	err := c.Run(ctx) // on the leader; returns when ctx ends
//
// It writes a Subnet only when a field changed, so a steady cluster costs one
// DescribeSubnet per subnet per period and no API-server writes.
package subnet
