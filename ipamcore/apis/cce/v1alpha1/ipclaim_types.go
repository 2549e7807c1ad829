package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The IPClaim is cce-ipam's own kind, not the reference's: the ledger of the
// addresses of exclusive subnets (ipamcore/ipclaim, and "I7" in
// ipamcore/ipam/PSTS.md). Unlike the reference's kinds it is cluster-scoped
// (an address belongs to no namespace) and its schema prunes unknown fields.
// Like them, the schema checks field types only: the ledger reads the
// address from the object's name and reports a claim whose spec disagrees.

// +genclient
// +genclient:nonNamespaced
// +genclient:noStatus
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=ipclaims,scope=Cluster,shortName=ipc,categories=cce;cce-ipam
// +kubebuilder:printcolumn:name="IP",type=string,JSONPath=`.spec.ip`
// +kubebuilder:printcolumn:name="Subnet",type=string,JSONPath=`.spec.subnetID`
// +kubebuilder:printcolumn:name="Holder NS",type=string,JSONPath=`.spec.holder.namespace`
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.spec.holder.name`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`,priority=1
// +kubebuilder:printcolumn:name="Released",type=date,JSONPath=`.spec.releasedAt`,priority=1
// +kubebuilder:printcolumn:name="Not Before",type=date,JSONPath=`.spec.notBefore`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// IPClaim (ipc) records who may use one address of an exclusive subnet. It is
// named by the address (ClaimName) and labelled LabelSubnetID. A claim is
// held by one pod (Spec.Holder set) or free since Spec.ReleasedAt. etcd makes
// the Create of a claim exclusive and its takeover a compare-and-swap on the
// resourceVersion, so an address has at most one holder across replicas.
type IPClaim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec IPClaimSpec `json:"spec,omitempty"`
}

// IPClaimSpec is the whole state of a claim; there is no status.
type IPClaimSpec struct {
	// SubnetID is the exclusive subnet (sbn-...) the address belongs to;
	// also the value of the LabelSubnetID label.
	// +optional
	SubnetID string `json:"subnetID,omitempty"`
	// IP is the address, as in the claim's name (ClaimName); a claim whose
	// IP disagrees with its name is corrupt and is left alone.
	// +optional
	IP string `json:"ip,omitempty"`
	// Holder is the pod the address is reserved for; nil when the claim is
	// free. A Fixed pod's next incarnation has the same name and so holds
	// the same claim.
	// +optional
	Holder *IPClaimHolder `json:"holder,omitempty"`
	// Node, ENIID and PSTS say where the holder got the address (the last
	// holder's, once free). Informational: nothing decides on them.
	// +optional
	Node string `json:"node,omitempty"`
	// +optional
	ENIID string `json:"eniID,omitempty"`
	// +optional
	PSTS string `json:"psts,omitempty"`
	// ReservedAt is when the holder last reserved the address. The leader
	// frees a held claim whose holder has no wep naming the address only
	// when ReservedAt is older than the orphan grace.
	// +optional
	ReservedAt *metav1.Time `json:"reservedAt,omitempty"`
	// ReleasedAt is when a free claim was freed; nobody may take it before
	// ReleasedAt plus the cooling period.
	// +optional
	ReleasedAt *metav1.Time `json:"releasedAt,omitempty"`
	// NotBefore, on a free claim, keeps everyone off the address until then:
	// the cloud said it is in use by something outside the ledger.
	// +optional
	NotBefore *metav1.Time `json:"notBefore,omitempty"`
}

// IPClaimHolder names a pod.
type IPClaimHolder struct {
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// +optional
	Name string `json:"name,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// IPClaimList is a list of IPClaims.
type IPClaimList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []IPClaim `json:"items"`
}
