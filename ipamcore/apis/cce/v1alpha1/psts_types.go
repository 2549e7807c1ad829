package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8snet "k8s.io/utils/net"
)

// The PSTS kinds follow the same rules as the others (see types.go): the
// reference's JSON names, every field optional, unknown fields kept. Unlike
// the other three kinds, both have a status subresource, as in the
// reference: a plain Update ignores the status and UpdateStatus the spec.
// The schemas set no defaults and no enums, so an object the reference
// wrote is stored and read back unchanged; the values are checked where they
// are used.

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:pruning:PreserveUnknownFields
// +kubebuilder:resource:path=podsubnettopologyspreads,scope=Namespaced,shortName=psts,categories=cce;cce-ipam

// PodSubnetTopologySpread (psts) routes the pods it selects to the subnets it
// lists, each with an allocation strategy. A pod uses the PSTS named in its
// AnnotationPodSubnetTopologySpread annotation.
type PodSubnetTopologySpread struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec PodSubnetTopologySpreadSpec `json:"spec,omitempty"`
	// +optional
	Status PodSubnetTopologySpreadStatus `json:"status,omitempty"`
}

// PodSubnetTopologySpreadSpec says which pods a PSTS applies to and how their
// addresses are allocated from which subnets.
//
// +kubebuilder:pruning:PreserveUnknownFields
type PodSubnetTopologySpreadSpec struct {
	// Name is the PSTS's name inside a PodSubnetTopologySpreadTable.
	// +optional
	Name string `json:"name,omitempty"`
	// Subnets maps a subnet ID (sbn-...) to how addresses are allocated from
	// it. Always written.
	// +optional
	// +nullable
	Subnets map[string]SubnetAllocation `json:"subnets"`
	// Strategy, when set, applies to every subnet and overrides their own
	// strategy fields.
	// +optional
	Strategy *IPAllocationStrategy `json:"strategy,omitempty"`
	// Selector selects the pods the mutating webhook annotates.
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
	// Priority decides between PSTS objects that select the same pod: the
	// highest wins.
	// +optional
	Priority int32 `json:"priority,omitempty"`
	// MaxSkew and WhenUnsatisfiable make the zone spread of the selected
	// pods, as in a pod topology spread constraint.
	// +optional
	MaxSkew int32 `json:"maxSkew,omitempty"`
	// +optional
	WhenUnsatisfiable UnsatisfiableConstraintAction `json:"whenUnsatisfiable,omitempty"`
	// EnableIPAllocationStatus asks for the addresses of each subnet in the
	// status (SubnetPodStatus.IPAllocations). The JSON name lacks the "e":
	// it is the reference's, kept for compatibility.
	// +optional
	EnableIPAllocationStatus bool `json:"nableIPAllocationStatus,omitempty"`
	// EnablePodTopologySpread turns the zone spread on.
	// +optional
	EnablePodTopologySpread bool `json:"enablePodTopologySpread,omitempty"`
}

// IPAllocationStrategy is how addresses of a subnet are allocated and when
// they are released.
//
// +kubebuilder:pruning:PreserveUnknownFields
type IPAllocationStrategy struct {
	// Type is one of the IPAllocType values; empty means Elastic.
	// +optional
	Type IPAllocType `json:"type,omitempty"`
	// ReleaseStrategy is ReleaseStrategyTTL (also when empty) or
	// ReleaseStrategyNever.
	// +optional
	ReleaseStrategy ReleaseStrategy `json:"releaseStrategy,omitempty"`
	// EnableReuseIPAddress gives a Custom pod its previous address back
	// after a restart, within TTL.
	// +optional
	EnableReuseIPAddress bool `json:"enableReuseIPAddress,omitempty"`
	// TTL is how long an address is kept after its pod is gone; for Custom
	// reuse DefaultReuseIPTTL when unset.
	// +optional
	TTL *metav1.Duration `json:"ttl,omitempty"`
}

// SubnetAllocation is how addresses are allocated from one subnet: the
// strategy fields, and the addresses or ranges the strategy may use.
//
// +kubebuilder:pruning:PreserveUnknownFields
type SubnetAllocation struct {
	IPAllocationStrategy `json:",inline"`

	// IPv4 and IPv6 are single addresses a Fixed or Manual pod may get.
	// +optional
	IPv4 []string `json:"ipv4,omitempty"`
	// +optional
	IPv6 []string `json:"ipv6,omitempty"`
	// IPv4Range and IPv6Range are CIDRs a Fixed or Manual pod may get an
	// address from.
	// +optional
	IPv4Range []string `json:"ipv4Range,omitempty"`
	// +optional
	IPv6Range []string `json:"ipv6Range,omitempty"`
	// Custom are the address ranges of the Custom strategy, per family.
	// +optional
	Custom []CustomAllocation `json:"custom,omitempty"`
}

// CustomAllocation lists the ranges of one address family.
//
// +kubebuilder:pruning:PreserveUnknownFields
type CustomAllocation struct {
	// Family is "4" or "6" (k8s.io/utils/net.IPv4, IPv6).
	// +optional
	Family k8snet.IPFamily `json:"family,omitempty"`
	// CustomIPRange are the ranges, each inside the subnet.
	// +optional
	CustomIPRange []CustomIPRange `json:"customIPRange,omitempty"`
}

// CustomIPRange is the addresses from Start to End, both included.
//
// +kubebuilder:pruning:PreserveUnknownFields
type CustomIPRange struct {
	// +optional
	Start string `json:"start"`
	// +optional
	End string `json:"end"`
}

// PodSubnetTopologySpreadStatus is written by the PSTS controller.
//
// +kubebuilder:pruning:PreserveUnknownFields
type PodSubnetTopologySpreadStatus struct {
	// +optional
	Name string `json:"name,omitempty"`
	// AvailableSubnetsNum is the number of AvailableSubnets.
	// +optional
	AvailableSubnetsNum int32 `json:"availableSubnetsNum,omitempty"`
	// UnavailableSubnetsNum is the number of UnavailableSubnets.
	// +optional
	UnavailableSubnetsNum int32 `json:"unavailableSubnetsNum,omitempty"`
	// AvailableSubnets are the enabled subnets of the spec, by subnet ID.
	// +optional
	AvailableSubnets map[string]SubnetPodStatus `json:"availableSubnets,omitempty"`
	// UnavailableSubnets are the others, with the reason in Message.
	// +optional
	UnavailableSubnets map[string]SubnetPodStatus `json:"unavailableSubnets,omitempty"`
	// PodMatchedCount is the number of pods the selector matches.
	// +optional
	PodMatchedCount int32 `json:"podMatchedCount,omitempty"`
	// PodAffectedCount is the number of pods that use this PSTS.
	// +optional
	PodAffectedCount int32 `json:"podAffectedCount,omitempty"`
}

// SubnetPodStatus is one subnet of a PSTS: a copy of its Subnet object and
// the pods using it.
//
// +kubebuilder:pruning:PreserveUnknownFields
type SubnetPodStatus struct {
	// +optional
	AvailableIPNum int32 `json:"availableIPNum,omitempty"`
	// +optional
	Enable bool `json:"enable,omitempty"`
	// +optional
	HasNoMoreIP bool `json:"hasNoMoreIP,omitempty"`
	// +optional
	ID string `json:"id,omitempty"`
	// +optional
	Name string `json:"name,omitempty"`
	// +optional
	AvailabilityZone string `json:"availabilityZone,omitempty"`
	// +optional
	CIDR string `json:"cidr,omitempty"`
	// IPv6CIDR is the subnet's IPv6 CIDR, which later reference releases
	// write.
	// +optional
	IPv6CIDR string `json:"ipv6Cidr,omitempty"`
	// PodCount is the number of pods with an address of the subnet.
	// +optional
	PodCount int32 `json:"podCount,omitempty"`
	// Message says why a subnet is unavailable.
	// +optional
	Message string `json:"message,omitempty"`
	// IPAllocations maps an address to the pod it was given to, when the
	// spec enables it.
	// +optional
	IPAllocations map[string]string `json:"ipAllocations,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// PodSubnetTopologySpreadList is a list of PodSubnetTopologySpreads.
type PodSubnetTopologySpreadList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []PodSubnetTopologySpread `json:"items"`
}

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:pruning:PreserveUnknownFields
// +kubebuilder:resource:path=podsubnettopologyspreadtables,scope=Namespaced,shortName=pstt,categories=cce;cce-ipam

// PodSubnetTopologySpreadTable (pstt) is a table of PSTS specs: its
// controller keeps one PodSubnetTopologySpread per entry, owned by the
// table, and copies their statuses back. The spec and status are lists, as
// in the reference.
type PodSubnetTopologySpreadTable struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec []PodSubnetTopologySpreadSpec `json:"spec,omitempty"`
	// +optional
	Status []PodSubnetTopologySpreadStatus `json:"status,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// PodSubnetTopologySpreadTableList is a list of
// PodSubnetTopologySpreadTables.
type PodSubnetTopologySpreadTableList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []PodSubnetTopologySpreadTable `json:"items"`
}

// IPAllocType is the allocation strategy of a PSTS subnet (the IPAllocType
// constants in wellknown.go).
type IPAllocType string

// ReleaseStrategy says when the address of a deleted PSTS pod is released
// (the ReleaseStrategy constants in wellknown.go).
type ReleaseStrategy string

// UnsatisfiableConstraintAction is what the zone spread does with a pod it
// cannot place within MaxSkew (DoNotSchedule or ScheduleAnyway).
type UnsatisfiableConstraintAction string
