package cloud

import (
	"context"
	"time"
)

// Provider is everything the IPAM needs from BCE. Client implements it over
// bce-sdk-go; tests can implement it over anything. Every method is safe for
// concurrent use, takes tokens from the client-side rate limiter, and returns
// errors that ClassOf / errors.Is classify (see errors.go). Callers must not
// hold their own locks across a call: a call can wait for tokens and for SDK
// retries.
//
// Mutating methods send a fresh clientToken per call, so the SDK's automatic
// retry of a 5xx cannot apply the same change twice.
type Provider interface {
	// ListENIs returns every ENI matching opts, following all pages. ERIs
	// and RoCE interfaces (traffic mode other than standard) are left out:
	// they are never pod ENIs.
	ListENIs(ctx context.Context, opts ListENIsOptions) ([]ENI, error)
	// GetENI returns one ENI; ErrENINotFound if it does not exist.
	GetENI(ctx context.Context, eniID string) (*ENI, error)
	// CreateENI creates an unattached ENI with an auto-assigned primary address.
	CreateENI(ctx context.Context, req CreateENIRequest) (string, error)
	// AttachENI starts attaching an ENI; poll GetENI until StatusInUse.
	AttachENI(ctx context.Context, eniID, instanceID string) error
	// DetachENI starts detaching an ENI from an instance.
	DetachENI(ctx context.Context, eniID, instanceID string) error
	// DeleteENI deletes an available ENI.
	DeleteENI(ctx context.Context, eniID string) error
	// AddPrivateIP adds one secondary address; ip "" auto-assigns.
	AddPrivateIP(ctx context.Context, eniID, ip string) (string, error)
	// BatchAddPrivateIPs adds up to MaxBatchIPs addresses, by count or explicitly.
	BatchAddPrivateIPs(ctx context.Context, eniID string, req BatchAddRequest) ([]string, error)
	// BatchAddPrivateIPsCrossSubnet adds up to MaxBatchIPs addresses of
	// another subnet of the ENI's VPC and zone (or of its own), by count or
	// explicitly; BCE has to have the feature enabled for the account. The
	// addresses are released like any other (DeletePrivateIP).
	BatchAddPrivateIPsCrossSubnet(ctx context.Context, eniID string, req CrossSubnetAddRequest) ([]string, error)
	// DeletePrivateIP releases one secondary address.
	DeletePrivateIP(ctx context.Context, eniID, ip string) error
	// BatchDeletePrivateIPs releases several secondary addresses at once.
	BatchDeletePrivateIPs(ctx context.Context, eniID string, ips []string) error
	// DescribeSubnet returns one subnet with its current availableIp.
	DescribeSubnet(ctx context.Context, subnetID string) (*Subnet, error)
	// ListSubnets returns every subnet matching opts, following all pages.
	ListSubnets(ctx context.Context, opts ListSubnetsOptions) ([]Subnet, error)
	// GetInstance returns a BCC instance's capacity and placement.
	GetInstance(ctx context.Context, instanceID string) (*Instance, error)
}

// MaxBatchIPs is BCE's limit of addresses per batch-add call.
const MaxBatchIPs = 10

// ENIStatus is an ENI's lifecycle state.
type ENIStatus string

// ENI states reported by BCE.
const (
	ENIStatusAvailable ENIStatus = "available"
	ENIStatusAttaching ENIStatus = "attaching"
	ENIStatusInUse     ENIStatus = "inuse"
	ENIStatusDetaching ENIStatus = "detaching"
	ENIStatusDeleting  ENIStatus = "deleting"
)

// ENI is an elastic network interface.
type ENI struct {
	ID               string
	Name             string
	Description      string
	ZoneName         string
	InstanceID       string
	MACAddress       string
	VPCID            string
	SubnetID         string
	Status           ENIStatus
	PrivateIPs       []PrivateIP
	SecurityGroupIDs []string
	// EnterpriseSecurityGroupIDs: set instead of SecurityGroupIDs on an
	// ENI created with enterprise security groups.
	EnterpriseSecurityGroupIDs []string
	CreatedTime                time.Time // zero if BCE sent none or an unparsable one
}

// PrivateIP is one address on an ENI.
type PrivateIP struct {
	Address  string
	Primary  bool
	PublicIP string
}

// PrimaryIP returns the ENI's primary address, or "".
func (e *ENI) PrimaryIP() string {
	for _, ip := range e.PrivateIPs {
		if ip.Primary {
			return ip.Address
		}
	}
	return ""
}

// ListENIsOptions filters ListENIs; empty fields do not filter.
type ListENIsOptions struct {
	VPCID      string
	InstanceID string
	// NamePrefix keeps ENIs whose name starts with it, e.g. "<clusterID>/".
	// BCE matches names loosely, so the client re-checks the prefix.
	NamePrefix string
	// PrivateIPs keeps ENIs holding any of these addresses.
	PrivateIPs []string
	// Instances, when not nil, keeps only ENIs attached to one of these
	// instances, and unattached ones (no instance or status available,
	// whatever an instanceId left behind says: the leak sweep reads them). A replica lists the whole VPC but keeps only its share:
	// the rest of each page is dropped before it is converted, so what the
	// list holds follows the replica's nodes, not the cluster.
	Instances map[string]bool
}

// CreateENIRequest describes a new ENI. The primary address is auto-assigned
// unless PrimaryIP is set.
type CreateENIRequest struct {
	Name     string
	SubnetID string
	// SecurityGroupIDs and EnterpriseSecurityGroupIDs: exactly one of the
	// two is set (BCE refuses both and neither).
	SecurityGroupIDs           []string
	EnterpriseSecurityGroupIDs []string
	Description                string
	PrimaryIP                  string
	// SecondaryIPs is how many auto-assigned secondary addresses the ENI is
	// created with (the create's privateIpSet holds them beside the
	// primary), at most MaxCreateSecondaryIPs. 0: the primary only, as the
	// reference creates ENIs.
	SecondaryIPs int
}

// MaxCreateSecondaryIPs bounds CreateENIRequest.SecondaryIPs: more than any
// ENI holds (BCE's per-ENI cap by instance memory is at most 40 addresses).
const MaxCreateSecondaryIPs = 64

// BatchAddRequest asks for Count auto-assigned addresses or for the explicit
// IPs, not both; either way at most MaxBatchIPs.
type BatchAddRequest struct {
	Count int
	IPs   []string
}

// CrossSubnetAddRequest asks for Count auto-assigned addresses of SubnetID,
// or for the explicit IPs, which must lie in SubnetID; not both, and either
// way at most MaxBatchIPs. IPv6 asks for IPv6 addresses (explicit ones must
// then all be IPv6, otherwise all IPv4).
type CrossSubnetAddRequest struct {
	SubnetID string
	Count    int
	IPs      []string
	IPv6     bool
}

// Subnet is a VPC subnet.
type Subnet struct {
	ID          string
	Name        string
	ZoneName    string
	CIDR        string
	VPCID       string
	SubnetType  string
	AvailableIP int
}

// ListSubnetsOptions filters ListSubnets; empty fields do not filter.
type ListSubnetsOptions struct {
	VPCID    string
	ZoneName string
}

// Instance is the part of a BCC instance the IPAM sizes pools by.
type Instance struct {
	ID                 string
	Name               string
	Status             string
	ZoneName           string
	VPCID              string
	SubnetID           string
	InternalIP         string
	CPUCount           int
	MemoryCapacityInGB int
	ENIQuota           int
}
