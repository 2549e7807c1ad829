package v1alpha1

import "time"

// Labels of a WorkloadEndpoint.
const (
	// LabelSubnetID carries the subnet ID of the wep's IP. The BCC IPAM
	// considers only weps that have this label (it lists them with an
	// "exists" selector at start-up).
	LabelSubnetID = "cce.io/subnet-id"
	// LabelInstanceType is the instance type of the wep's node; the BCC IPAM
	// writes InstanceTypeBCC.
	LabelInstanceType = "cce.io/instance-type"
	// LabelOwner is the StatefulSet of a StatefulSet wep: the wep's name
	// without its last "-<ordinal>" (see StatefulSetName).
	LabelOwner = "cce.io/owner"
)

// InstanceTypeBCC is the LabelInstanceType value of weps on BCC nodes.
const InstanceTypeBCC = "bcc"

// WorkloadEndpointFinalizer is on every wep. To delete a wep, remove it with
// an Update, then Delete with a zero grace period.
const WorkloadEndpointFinalizer = "cce-cni.cce.io"

// Values of WorkloadEndpointSpec.Type.
const (
	// WorkloadEndpointTypePod is an ordinary pod.
	WorkloadEndpointTypePod = "Pod"
	// WorkloadEndpointTypeStatefulSet is a pod controlled by a StatefulSet.
	WorkloadEndpointTypeStatefulSet = "StatefulSet"
	// WorkloadEndpointTypeReuseIPPod is a pod of a custom PSTS that reuses
	// its IP after restarts.
	WorkloadEndpointTypeReuseIPPod = "ReuseIPPod"
)

// EnableFixIPTrue is the value of WorkloadEndpointSpec.EnableFixIP and of the
// pod annotation AnnotationStsEnableFixIP that pins an IP to a pod name. The
// comparison is case-sensitive, as in the reference.
const EnableFixIPTrue = "True"

// Values of WorkloadEndpointSpec.FixIPDeletePolicy and of the pod annotation
// AnnotationStsPodFixIPDeletePolicy.
const (
	// FixIPDeletePolicyNever keeps a fixed IP even when its StatefulSet is
	// deleted or scaled down.
	FixIPDeletePolicyNever = "Never"
	// FixIPDeletePolicyTTL releases the IP some time after the pod is gone
	// (written by PSTS).
	FixIPDeletePolicyTTL = "TTL"
)

// Values of WorkloadEndpointSpec.Phase (PSTS).
const (
	WorkloadEndpointPhasePodRunning = "podRunning"
	WorkloadEndpointPhasePodDeleted = "podDeleted"
)

// Pod annotations read by the IPAM.
const (
	// AnnotationStsEnableFixIP set to EnableFixIPTrue on a StatefulSet pod
	// gives the pod its previous IP back after a restart or a move.
	AnnotationStsEnableFixIP = "cce.io/sts-enable-fix-ip"
	// AnnotationStsPodFixIPDeletePolicy set to FixIPDeletePolicyNever keeps
	// a fixed IP when its StatefulSet is deleted or scaled down.
	AnnotationStsPodFixIPDeletePolicy = "cce.io/sts-pod-fix-ip-delete-policy"
	// AnnotationPodSubnetTopologySpread names the PodSubnetTopologySpread
	// that a pod's IP comes from; the PSTS mutating webhook sets it.
	AnnotationPodSubnetTopologySpread = "cce.baidubce.com/PodSubnetTopologySpread"
)

// Values of IPAllocationStrategy.Type.
const (
	// IPAllocTypeNil (empty) means IPAllocTypeElastic.
	IPAllocTypeNil IPAllocType = ""
	// IPAllocTypeElastic takes any free address of the subnet, on a
	// non-exclusive subnet.
	IPAllocTypeElastic IPAllocType = "Elastic"
	// IPAllocTypeFixed gives a StatefulSet pod ("<name>-<ordinal>") the same
	// address, from the subnet's ipv4 / ipv4Range, across restarts.
	IPAllocTypeFixed IPAllocType = "Fixed"
	// IPAllocTypeManual takes a free address from the subnet's ipv4 /
	// ipv4Range.
	IPAllocTypeManual IPAllocType = "Manual"
	// IPAllocTypeCustom takes a free address from the subnet's custom
	// ranges, for any pod, and may give it back to the same pod name.
	IPAllocTypeCustom IPAllocType = "Custom"
)

// Values of IPAllocationStrategy.ReleaseStrategy.
const (
	// ReleaseStrategyTTL (also when empty) releases an address TTL after its
	// pod is gone.
	ReleaseStrategyTTL ReleaseStrategy = "TTL"
	// ReleaseStrategyNever keeps the address until the PSTS is deleted.
	ReleaseStrategyNever ReleaseStrategy = "Never"
)

// Values of PodSubnetTopologySpreadSpec.WhenUnsatisfiable.
const (
	DoNotSchedule  UnsatisfiableConstraintAction = "DoNotSchedule"
	ScheduleAnyway UnsatisfiableConstraintAction = "ScheduleAnyway"
)

// DefaultReuseIPTTL is the TTL of a Custom PSTS that reuses addresses and
// sets none: how long a deleted pod's address waits for the pod to return.
const DefaultReuseIPTTL = 7 * 24 * time.Hour

// ResourceIP is the extended resource a PSTS pod requests one of (the
// mutating webhook adds the request) and that nodes advertise, so that the
// scheduler places no more PSTS pods on a node than its ENIs can address.
const ResourceIP = "cce.baidubce.com/ip"

// Node annotations written by the node agent.
const (
	// AnnotationMaxIPPerENI is the number of IPs an ENI of the node may
	// hold, the primary IP included (decimal). It depends on the node's
	// memory. Without it, the per-ENI memory check passes.
	AnnotationMaxIPPerENI = "cce.io/max-ip-per-eni"
	// AnnotationMaxENINum is the number of ENIs the node may have (decimal):
	// min(CPUs, 8) unless raised by the agent's flag.
	AnnotationMaxENINum = "cce.io/max-eni-num"
	// AnnotationWarmIPTarget is the number of idle IPs the ENI sync keeps
	// available on the node (decimal); half of AnnotationMaxIPPerENI.
	AnnotationWarmIPTarget = "cce.io/warm-ip-target"
	// AnnotationPreAttachedENINum is the number of ENIs a node gets before
	// any pod needs them (decimal), 1 by default.
	AnnotationPreAttachedENINum = "cce.io/pre-attached-eni-num"
)

// IPPool conventions.
const (
	// IPPoolNamespace is the namespace of every IPPool.
	IPPoolNamespace = "default"
	// IPPoolNamePrefix starts the name of a node's own pool (see IPPoolName).
	IPPoolNamePrefix = "ippool-"
	// IPPoolCreationSourceCNI is the creationSource of pools created by the
	// node agent. GC deletes such a pool when its node is gone.
	IPPoolCreationSourceCNI = "cce-cni"
	// LabelHostname is the node label a node's own pool selects on.
	LabelHostname = "kubernetes.io/hostname"
)

// SubnetNamespace is the namespace of every Subnet.
const SubnetNamespace = "default"
