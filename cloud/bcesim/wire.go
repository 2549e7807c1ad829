package bcesim

import "time"

// Wire types: the JSON shapes BCE sends and receives, field for field as in
// the spec (§2). They are written here rather than borrowed from the SDK so
// the simulator does not depend on SDK struct tags being right.

// PrivateIPView is one entry of an ENI's privateIpSet.
type PrivateIPView struct {
	PublicIPAddress  string `json:"publicIpAddress"`
	Primary          bool   `json:"primary"`
	PrivateIPAddress string `json:"privateIpAddress"`
	SubnetID         string `json:"subnetId,omitempty"`
}

// ENIView is an ENI as GET /v1/eni/{id} and the list call return it.
type ENIView struct {
	ENIID                       string          `json:"eniId"`
	Name                        string          `json:"name"`
	ZoneName                    string          `json:"zoneName"`
	Description                 string          `json:"description"`
	InstanceID                  string          `json:"instanceId"`
	MACAddress                  string          `json:"macAddress"`
	VPCID                       string          `json:"vpcId"`
	SubnetID                    string          `json:"subnetId"`
	Status                      ENIStatus       `json:"status"`
	PrivateIPSet                []PrivateIPView `json:"privateIpSet"`
	IPv6PrivateIPSet            []PrivateIPView `json:"ipv6PrivateIpSet"`
	SecurityGroupIDs            []string        `json:"securityGroupIds"`
	EnterpriseSecurityGroupIDs  []string        `json:"enterpriseSecurityGroupIds"`
	CreatedTime                 string          `json:"createdTime"`
	Tags                        []Tag           `json:"tags"`
	NetworkInterfaceTrafficMode string          `json:"networkInterfaceTrafficMode"`
}

// ENIPage is the list response.
type ENIPage struct {
	ENIs        []ENIView `json:"enis"`
	Marker      string    `json:"marker"`
	IsTruncated bool      `json:"isTruncated"`
	NextMarker  string    `json:"nextMarker"`
	MaxKeys     int       `json:"maxKeys"`
}

// SubnetView is a subnet as the VPC API returns it.
type SubnetView struct {
	SubnetID              string `json:"subnetId"`
	Name                  string `json:"name"`
	ZoneName              string `json:"zoneName"`
	CIDR                  string `json:"cidr"`
	IPv6CIDR              string `json:"ipv6Cidr"`
	VPCID                 string `json:"vpcId"`
	SubnetType            string `json:"subnetType"`
	Description           string `json:"description"`
	CreatedTime           string `json:"createdTime"`
	AvailableIP           int    `json:"availableIp"`
	AvailableUnreservedIP int    `json:"availableUnreservedIp"`
	Tags                  []Tag  `json:"tags"`
}

// SubnetPage is the subnet list response.
type SubnetPage struct {
	Marker      string       `json:"marker"`
	IsTruncated bool         `json:"isTruncated"`
	NextMarker  string       `json:"nextMarker"`
	MaxKeys     int          `json:"maxKeys"`
	Subnets     []SubnetView `json:"subnets"`
}

// InstanceView is the part of a BCC instance detail the IPAM reads.
type InstanceView struct {
	ID                 string `json:"id"`
	Name               string `json:"name"`
	InstanceType       string `json:"instanceType"`
	Status             string `json:"status"`
	CPUCount           int    `json:"cpuCount"`
	MemoryCapacityInGB int    `json:"memoryCapacityInGB"`
	ZoneName           string `json:"zoneName"`
	SubnetID           string `json:"subnetId"`
	VPCID              string `json:"vpcId"`
	InternalIP         string `json:"internalIp"`
	ENIQuota           int    `json:"eniQuota"`
	CreateTime         string `json:"createTime"`
}

// SecurityGroupView is a security group in the list response.
type SecurityGroupView struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Desc        string `json:"desc"`
	VPCID       string `json:"vpcId"`
	Rules       []any  `json:"rules"`
	Tags        []Tag  `json:"tags"`
	CreatedTime string `json:"createdTime"`
}

// SecurityGroupPage is the security group list response.
type SecurityGroupPage struct {
	SecurityGroups []SecurityGroupView `json:"securityGroups"`
	Marker         string              `json:"marker"`
	IsTruncated    bool                `json:"isTruncated"`
	NextMarker     string              `json:"nextMarker"`
	MaxKeys        int                 `json:"maxKeys"`
}

// QuotaView is the ENI quota response.
type QuotaView struct {
	TotalQuantity     int `json:"totalQuantity"`
	AvailableQuantity int `json:"availableQuantity"`
}

// WorldDump is the whole world, for the admin API and for tests.
type WorldDump struct {
	Subnets        []SubnetView        `json:"subnets"`
	Instances      []InstanceView      `json:"instances"`
	SecurityGroups []SecurityGroupView `json:"securityGroups"`
	ENIs           []ENIView           `json:"enis"`
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339) }
