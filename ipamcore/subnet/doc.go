// Package subnet keeps a Subnet custom resource for every subnet that an
// IPPool lists, with its free-IP count and exhaustion flag current.
//
// The reference meant to mark a subnet exhausted when the cloud said "subnet
// has no more IP" but wrote the unmodified object back; here the periodic
// sync sets status.hasNoMoreIP from DescribeSubnet's availableIp, and the
// IPAM's pool planner skips ENIs of exhausted subnets.
//
//	c := subnet.NewController(subnet.DefaultConfig(), cceClient, provider, logger, reg)
//	go c.Run(ctx) // one replica runs it (the leader, once sharding lands)
//
// It writes a Subnet only when a field changed, so a steady cluster costs one
// DescribeSubnet per subnet per period and no API-server writes.
package subnet
