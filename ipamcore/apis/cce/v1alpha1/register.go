package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of every kind in this package.
const GroupName = "cce.io"

// Version is the only served and stored version of the group.
const Version = "v1alpha1"

// SchemeGroupVersion is the group and version of this package's kinds. The
// generated clientset refers to it by this name.
var SchemeGroupVersion = schema.GroupVersion{
	Group:   GroupName,
	Version: Version,
}

// Resource returns the GroupResource of a plural resource name in this group,
// as used in API errors (apierrors.NewNotFound(v1alpha1.Resource("ippools"), name)).
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

var (
	// SchemeBuilder registers this package's kinds with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds WorkloadEndpoint, IPPool, Subnet,
	// PodSubnetTopologySpread and PodSubnetTopologySpreadTable (and their
	// lists) to a scheme, e.g. for the generated clientset or a controller-runtime
	// client.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&WorkloadEndpoint{}, &WorkloadEndpointList{},
		&IPPool{}, &IPPoolList{},
		&Subnet{}, &SubnetList{},
		&PodSubnetTopologySpread{}, &PodSubnetTopologySpreadList{},
		&PodSubnetTopologySpreadTable{}, &PodSubnetTopologySpreadTableList{},
		&IPClaim{}, &IPClaimList{},
	)
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
