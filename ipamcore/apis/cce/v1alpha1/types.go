package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Field types and JSON names follow the reference system exactly (see the
// package documentation). Every object type, the roots included, keeps
// unknown fields: the reference's schemas preserve everything, and objects it
// wrote may carry fields of its later releases. Every field is optional in the schema, also those
// the reference always writes, because objects created by hand or by older
// releases may lack them; lists and times the reference may write as null
// are nullable.

// +genclient
// +genclient:noStatus
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:pruning:PreserveUnknownFields
// +kubebuilder:resource:path=workloadendpoints,scope=Namespaced,shortName=wep,categories=cce;cce-ipam
// +kubebuilder:printcolumn:name="IP",type=string,JSONPath=`.spec.ip`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="ENI",type=string,JSONPath=`.spec.eniID`
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.type`
// +kubebuilder:printcolumn:name="Subnet",type=string,JSONPath=`.spec.subnetID`,priority=1
// +kubebuilder:printcolumn:name="Fixed",type=string,JSONPath=`.spec.enableFixIP`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:selectablefield:JSONPath=`.spec.node`
// +kubebuilder:selectablefield:JSONPath=`.spec.subnetTopologyReference`

// WorkloadEndpoint (wep) records the IP assigned to one pod. It has the pod's
// name and namespace, carries the finalizer WorkloadEndpointFinalizer, and has
// no status: everything is in the spec. spec.node and
// spec.subnetTopologyReference are selectable fields: a node's rebuild reads
// only that node's weps, and the leader's IPClaim keeper watches only PSTS
// weps.
type WorkloadEndpoint struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec WorkloadEndpointSpec `json:"spec,omitempty"`
}

// WorkloadEndpointSpec is where a pod's IP lives. All fields are omitted when
// empty.
//
// +kubebuilder:pruning:PreserveUnknownFields
type WorkloadEndpointSpec struct {
	// ContainerID is the infra container the IP was allocated for. A release
	// for another container ID leaves the wep alone (the release guard).
	// +optional
	ContainerID string `json:"containerID,omitempty"`
	// IP is the pod's IPv4 address.
	// +optional
	IP string `json:"ip,omitempty"`
	// IPv6 is the pod's IPv6 address (PSTS only).
	// +optional
	IPv6 string `json:"ipv6,omitempty"`
	// Type is WorkloadEndpointTypePod, WorkloadEndpointTypeStatefulSet or
	// WorkloadEndpointTypeReuseIPPod.
	// +optional
	Type string `json:"type,omitempty"`
	// Mac is the MAC address of the ENI that holds the IP.
	// +optional
	Mac string `json:"mac,omitempty"`
	// Gw is the gateway; the BCC IPAM leaves it empty.
	// +optional
	Gw string `json:"gw,omitempty"`
	// ENIID is the ENI that holds the IP.
	// +optional
	ENIID string `json:"eniID,omitempty"`
	// Node is the name of the pod's node.
	// +optional
	Node string `json:"node,omitempty"`
	// InstanceID is the BCC instance of the node.
	// +optional
	InstanceID string `json:"instanceID,omitempty"`
	// SubnetID is the subnet the IP belongs to (the ENI's subnet, or the
	// PSTS subnet for cross-subnet IPs).
	// +optional
	SubnetID string `json:"subnetID,omitempty"`
	// EnableFixIP is EnableFixIPTrue ("True") when the IP stays with the pod
	// name across restarts. PSTS also writes "true" and "false".
	// +optional
	EnableFixIP string `json:"enableFixIP,omitempty"`
	// FixIPDeletePolicy is FixIPDeletePolicyNever or FixIPDeletePolicyTTL;
	// only Never is acted on for StatefulSet pods.
	// +optional
	FixIPDeletePolicy string `json:"fixIPDeletePolicy,omitempty"`
	// UpdateAt is the Unix epoch after an ordinary allocation and the time
	// of the last change otherwise.
	// +optional
	// +nullable
	UpdateAt metav1.Time `json:"updateAt,omitempty"`
	// ENISubnetID is the subnet of the ENI when the IP comes from another
	// subnet (PSTS).
	// +optional
	ENISubnetID string `json:"eniSubnetID,omitempty"`
	// SubnetTopologyReference is the name of the PodSubnetTopologySpread
	// the IP was allocated for.
	// +optional
	SubnetTopologyReference string `json:"subnetTopologyReference,omitempty"`
	// Phase is WorkloadEndpointPhasePodRunning or
	// WorkloadEndpointPhasePodDeleted.
	// +optional
	Phase string `json:"phase,omitempty"`
	// Release says when the IP of a deleted pod may be released (PSTS).
	// +optional
	Release *WorkloadEndpointRelease `json:"release,omitempty"`
}

// WorkloadEndpointRelease is the release policy of a reusable IP.
//
// +kubebuilder:pruning:PreserveUnknownFields
type WorkloadEndpointRelease struct {
	// TTL is how long the IP is kept after the pod is deleted. The upper-case
	// JSON name is the reference's.
	// +optional
	TTL metav1.Duration `json:"TTL,omitempty"`
	// PodDeletedTime is when the pod was seen deleted.
	// +optional
	// +nullable
	PodDeletedTime metav1.Time `json:"podDeletedTime,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// WorkloadEndpointList is a list of WorkloadEndpoints.
type WorkloadEndpointList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []WorkloadEndpoint `json:"items"`
}

// +genclient
// +genclient:noStatus
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:pruning:PreserveUnknownFields
// +kubebuilder:resource:path=ippools,scope=Namespaced,shortName=pool;ipl,categories=cce;cce-ipam
// +kubebuilder:printcolumn:name="Node Selector",type=string,JSONPath=`.spec.nodeSelector`
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.creationSource`
// +kubebuilder:printcolumn:name="Priority",type=integer,JSONPath=`.spec.priority`
// +kubebuilder:printcolumn:name="Zone",type=string,JSONPath=`.spec.eni.availabilityZone`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// IPPool says which subnets and security groups the ENIs of matching nodes
// use. The node agent creates one per node, named IPPoolName(node) in
// IPPoolNamespace with creationSource IPPoolCreationSourceCNI; users may add
// pools with any selector and priority. The status lists the node's ENIs and
// their IPs. There is no status subresource: status is written with Update.
type IPPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec IPPoolSpec `json:"spec,omitempty"`
	// +optional
	Status IPPoolStatus `json:"status,omitempty"`
}

// IPPoolSpec selects nodes and configures their ENIs.
//
// +kubebuilder:pruning:PreserveUnknownFields
type IPPoolSpec struct {
	// NodeSelector is a label selector in string form
	// ("kubernetes.io/hostname=node-1"). Always written.
	// +optional
	NodeSelector string `json:"nodeSelector"`
	// CreationSource is who created the pool; IPPoolCreationSourceCNI for the
	// node agent. Always written.
	// +optional
	CreationSource string `json:"creationSource"`
	// Priority orders pools that select the same node; the highest wins.
	// +optional
	Priority int32 `json:"priority,omitempty"`
	// IPv4Ranges are the IPv4 ranges of the host-local mode.
	// +optional
	IPv4Ranges []Range `json:"ipv4Ranges,omitempty"`
	// IPv6Ranges are the IPv6 ranges of the host-local mode.
	// +optional
	IPv6Ranges []Range `json:"ipv6Ranges,omitempty"`
	// ENI configures the ENIs of the selected nodes.
	// +optional
	ENI ENISpec `json:"eni"`
	// PodSubnets are the pod subnets of primary-ENI secondary-IP modes.
	// +optional
	PodSubnets []string `json:"podSubnets,omitempty"`
}

// Range is an address range of the host-local mode.
//
// +kubebuilder:pruning:PreserveUnknownFields
type Range struct {
	// Version is the IP version, 4 or 6.
	// +optional
	Version int32 `json:"version"`
	// +optional
	CIDR string `json:"cidr"`
	// +optional
	RangeStart string `json:"rangeStart"`
	// +optional
	RangeEnd string `json:"rangeEnd"`
	// +optional
	// +nullable
	Excludes []string `json:"excludes"`
	// +optional
	Gateway string `json:"gateway"`
	// +optional
	// +nullable
	Routes []Route `json:"routes"`
	// +optional
	VlanID int32 `json:"vlanID"`
}

// Route is a route of a host-local Range.
//
// +kubebuilder:pruning:PreserveUnknownFields
type Route struct {
	// Dst is the destination CIDR.
	// +optional
	Dst string `json:"dst"`
	// Gw is the next hop.
	// +optional
	Gw string `json:"gw"`
}

// ENISpec is where new ENIs of the selected nodes go. All fields are always
// written.
//
// +kubebuilder:pruning:PreserveUnknownFields
type ENISpec struct {
	// +optional
	VPCID string `json:"vpcID"`
	// +optional
	AvailabilityZone string `json:"availabilityZone"`
	// Subnets are the subnet IDs new ENIs may use.
	// +optional
	// +nullable
	Subnets []string `json:"subnets"`
	// SecurityGroups of new ENIs; exactly one of SecurityGroups and
	// EnterpriseSecurityGroups is set.
	// +optional
	// +nullable
	SecurityGroups []string `json:"securityGroups"`
	// +optional
	// +nullable
	EnterpriseSecurityGroups []string `json:"enterpriseSecurityGroups"`
}

// IPPoolStatus is written by both the IPAM and the node agent.
//
// +kubebuilder:pruning:PreserveUnknownFields
type IPPoolStatus struct {
	// +optional
	ENI ENIStatus `json:"eni,omitempty"`
}

// ENIStatus lists the node's in-use ENIs.
//
// +kubebuilder:pruning:PreserveUnknownFields
type ENIStatus struct {
	// ENIs maps an ENI ID to its state.
	// +optional
	ENIs map[string]ENI `json:"enis,omitempty"`
}

// ENI is the state of one ENI attached to the node.
//
// +kubebuilder:pruning:PreserveUnknownFields
type ENI struct {
	// +optional
	ID string `json:"id,omitempty"`
	// +optional
	MAC string `json:"mac,omitempty"`
	// +optional
	AvailabilityZone string `json:"availabilityZone,omitempty"`
	// +optional
	Description string `json:"description,omitempty"`
	// InterfaceIndex is the link index on the node, written by the node
	// agent; -1 until it is known.
	// +optional
	InterfaceIndex int32 `json:"interfaceIndex,omitempty"`
	// Subnet is the ENI's subnet ID.
	// +optional
	Subnet string `json:"subnet,omitempty"`
	// VPC is the ENI's VPC ID.
	// +optional
	VPC string `json:"vpc,omitempty"`
	// PrivateIPSet lists the ENI's IPs, the primary one included.
	// +optional
	PrivateIPSet []PrivateIP `json:"addresses,omitempty"`
	// +optional
	SecurityGroups []string `json:"securityGroups,omitempty"`
}

// PrivateIP is one IP of an ENI.
//
// +kubebuilder:pruning:PreserveUnknownFields
type PrivateIP struct {
	// +optional
	IsPrimary bool `json:"isPrimary"`
	// +optional
	PublicIPAddress string `json:"publicIPAddress,omitempty"`
	// +optional
	PrivateIPAddress string `json:"privateIPAddress"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// IPPoolList is a list of IPPools.
type IPPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []IPPool `json:"items"`
}

// +genclient
// +genclient:noStatus
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:pruning:PreserveUnknownFields
// +kubebuilder:resource:path=subnets,scope=Namespaced,shortName=sbn,categories=cce;cce-ipam
// +kubebuilder:printcolumn:name="CIDR",type=string,JSONPath=`.spec.cidr`
// +kubebuilder:printcolumn:name="Zone",type=string,JSONPath=`.spec.availabilityZone`
// +kubebuilder:printcolumn:name="Available",type=integer,JSONPath=`.status.availableIPNum`
// +kubebuilder:printcolumn:name="Enable",type=boolean,JSONPath=`.status.enable`
// +kubebuilder:printcolumn:name="Exclusive",type=boolean,JSONPath=`.spec.exclusive`
// +kubebuilder:printcolumn:name="No More IP",type=boolean,JSONPath=`.status.hasNoMoreIP`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// Subnet mirrors a VPC subnet. It is named by the subnet ID and lives in
// SubnetNamespace. There is no status subresource: status is written with
// Update.
type Subnet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec SubnetSpec `json:"spec,omitempty"`
	// +optional
	Status SubnetStatus `json:"status,omitempty"`
}

// SubnetSpec describes the VPC subnet.
//
// +kubebuilder:pruning:PreserveUnknownFields
type SubnetSpec struct {
	// ID is the subnet ID (sbn-...), also the object's name.
	// +optional
	ID string `json:"id"`
	// +optional
	Name string `json:"name"`
	// +optional
	AvailabilityZone string `json:"availabilityZone"`
	// +optional
	CIDR string `json:"cidr"`
	// Exclusive subnets are reserved for fixed, manual and custom PSTS
	// allocation: they never get ENIs.
	// +optional
	Exclusive bool `json:"exclusive"`
}

// SubnetStatus is refreshed from DescribeSubnet.
//
// +kubebuilder:pruning:PreserveUnknownFields
type SubnetStatus struct {
	// +optional
	AvailableIPNum int32 `json:"availableIPNum"`
	// Enable is set at creation and never changes.
	// +optional
	Enable bool `json:"enable"`
	// HasNoMoreIP marks an exhausted subnet.
	// +optional
	HasNoMoreIP bool `json:"hasNoMoreIP"`
	// Reason explains a disabled subnet.
	// +optional
	Reason string `json:"reason,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// SubnetList is a list of Subnets.
type SubnetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []Subnet `json:"items"`
}
