package kubeletsim

import (
	"errors"
	"time"

	"github.com/spf13/pflag"
)

// LabelSimulator marks the Node objects a simulator plays the kubelet of; its
// value is Config.Name. Run serves exactly the nodes carrying it.
const LabelSimulator = "kubeletsim.cce-ipam.io/simulator"

// Labels CCE puts on its nodes, as the simulated nodes carry them.
const (
	LabelInstanceType     = "node.kubernetes.io/instance-type"
	LabelInstanceTypeBeta = "beta.kubernetes.io/instance-type"
	LabelHostname         = "kubernetes.io/hostname"
	LabelZone             = "topology.kubernetes.io/zone"
)

// Config configures a Simulator. The defaults below are RegisterFlags'
// flag defaults, which DefaultConfig returns; New uses the config as given.
type Config struct {
	// Name is the value of LabelSimulator on the nodes this simulator
	// registers and serves. Two simulators with different names can share a
	// cluster. Defaults to "kubelet-sim".
	Name string
	// CNIEndpoint is the host:port of the rpc.CNIBackend service the
	// simulated CNI plugin calls (the reference plugin's "endpoint"). Run
	// requires it or CNIEndpoints.
	CNIEndpoint string
	// CNIEndpoints are more CNI service addresses, e.g. one per IPAM
	// replica. With several endpoints (CNIEndpoint included) every
	// AllocateIP / ReleaseIP call goes to one of them picked at random, so
	// calls spread over the replicas and a retry after a failure usually
	// reaches another one, as a Service in front of the replicas would do.
	CNIEndpoints []string
	// CNIConnectionPerCall opens a new connection for every CNI call, as the
	// CNI plugin does (a process per call): through a Service, every call is
	// then balanced on its own, and a replica that leaves the endpoints gets
	// no new calls. By default one connection per endpoint is kept, which a
	// Service pins to one backend.
	CNIConnectionPerCall bool
	// Namespace limits the pods the simulator schedules and runs; empty means
	// every namespace.
	Namespace string
	// Workers bounds the pods handled at once (binds, CNI calls, status
	// writes). Defaults to 32.
	Workers int
	// NoScheduling leaves unscheduled pods to a real scheduler; by default
	// the simulator binds every unscheduled pod in Namespace to the least
	// loaded simulated node.
	NoScheduling bool
	// MaxPodsPerNode is the most pods the simulator binds to one node (the
	// kubelet's max-pods). Defaults to 110.
	MaxPodsPerNode int
	// CNITimeout bounds one AllocateIP / ReleaseIP call. Defaults to 60s.
	CNITimeout time.Duration
	// RetryBase and RetryMax shape the per-pod exponential backoff after a
	// failed sync (kubelet's sandbox backoff, shortened for tests). Default
	// 200ms and 10s.
	RetryBase time.Duration
	RetryMax  time.Duration
	// NodeLeasePeriod, when set, renews each simulated node's Lease in
	// kube-node-lease this often (kubelet: 10s), which keeps the nodes Ready
	// under kube-controller-manager's node lifecycle controller. Zero (the
	// default) sends no heartbeats: fine without kube-controller-manager,
	// and cheaper with thousands of nodes.
	NodeLeasePeriod time.Duration

	// The rest is used by RegisterNodes only.

	// ClusterID names the cluster: the pre-attached ENI of node N on
	// instance I is named "<ClusterID>/I/N/000000". Required.
	ClusterID string
	// VPCID is the VPC of the subnet. Required.
	VPCID string
	// SubnetID is the subnet of the instances and their first ENI. Required.
	SubnetID string
	// Zone is the subnet's availability zone (zone label, IPPool).
	Zone string
	// SecurityGroupIDs go to instances and ENIs. At least one is required.
	SecurityGroupIDs []string
	// InstanceCPUs and InstanceMemoryGB size every instance; the node
	// agent's capacity annotations follow from them. Default 8 and 32.
	InstanceCPUs     int
	InstanceMemoryGB int
	// InstanceType is the instance-type label value. Defaults to "BCC".
	InstanceType string
	// IPPool also writes the node agent's IPPool ippool-<node> (namespace
	// default) for every node.
	IPPool bool
	// RegisterWorkers bounds nodes registered at once. Defaults to 8.
	RegisterWorkers int
	// AttachTimeout bounds the wait for a new ENI to be in use. Defaults to
	// 60s.
	AttachTimeout time.Duration
}

// RegisterFlags binds the config to command-line flags. The flag defaults
// are the config's only defaults (see DefaultConfig).
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Name, "name", "kubelet-sim",
		"simulator name: value of the "+LabelSimulator+" label on the nodes it registers and serves")
	fs.StringVar(&c.CNIEndpoint, "cni-endpoint", "",
		"host:port of the IPAM's CNI gRPC service (rpc.CNIBackend); this or --cni-endpoints is required")
	fs.StringSliceVar(&c.CNIEndpoints, "cni-endpoints", nil,
		"more CNI service addresses (comma-separated); each call goes to a random one of all endpoints")
	fs.BoolVar(&c.CNIConnectionPerCall, "cni-connection-per-call", false,
		"open a new connection for every CNI call, as the CNI plugin binary does (through a Service each call is balanced on its own)")
	fs.StringVar(&c.Namespace, "namespace", "", "only schedule and run pods of this namespace; empty means all")
	fs.IntVar(&c.Workers, "workers", 32, "pods handled at once (binds, CNI calls, status writes)")
	fs.BoolVar(&c.NoScheduling, "no-scheduling", false, "do not bind unscheduled pods (leave them to a real scheduler)")
	fs.IntVar(&c.MaxPodsPerNode, "max-pods", 110, "most pods bound to one simulated node")
	fs.DurationVar(&c.CNITimeout, "cni-timeout", time.Minute, "deadline of one AllocateIP / ReleaseIP call")
	fs.DurationVar(&c.RetryBase, "retry-base", 200*time.Millisecond, "first backoff after a failed pod sync; doubles per failure")
	fs.DurationVar(&c.RetryMax, "retry-max", 10*time.Second, "cap of the per-pod backoff")
	fs.DurationVar(&c.NodeLeasePeriod, "node-lease-period", 0,
		"renew each node's heartbeat Lease this often (kubelet: 10s), needed when kube-controller-manager runs; 0 disables")
	fs.StringVar(&c.ClusterID, "cluster-id", "",
		"CCE cluster ID; pre-attached ENIs are named <cluster-id>/<instance>/<node>/000000 (required)")
	fs.StringVar(&c.VPCID, "vpc-id", "", "VPC of the subnet (required)")
	fs.StringVar(&c.SubnetID, "subnet-id", "", "subnet of the simulated instances and their first ENI (required)")
	fs.StringVar(&c.Zone, "zone", "", "availability zone of the subnet (zone label and IPPool)")
	fs.StringSliceVar(&c.SecurityGroupIDs, "security-group", nil, "security group of instances and ENIs (repeatable, at least one)")
	fs.IntVar(&c.InstanceCPUs, "instance-cpus", 8, "vCPUs of each simulated instance (max-eni-num = min(cpus, 8))")
	fs.IntVar(&c.InstanceMemoryGB, "instance-memory-gb", 32, "memory of each simulated instance (sets max-ip-per-eni)")
	fs.StringVar(&c.InstanceType, "instance-type", "BCC", "value of the instance-type node labels")
	fs.BoolVar(&c.IPPool, "ippool", true, "write the node agent's IPPool ippool-<node> for every node")
	fs.IntVar(&c.RegisterWorkers, "register-workers", 8, "nodes registered at once")
	fs.DurationVar(&c.AttachTimeout, "attach-timeout", time.Minute, "how long to wait for a node's first ENI to be in use")
}

// DefaultConfig returns the flag defaults, for tests and library users, who
// then set the fields they need (the CNI endpoint, the cloud placement).
func DefaultConfig() Config {
	var c Config
	c.RegisterFlags(pflag.NewFlagSet("kubeletsim", pflag.ContinueOnError))
	return c
}

// endpoints returns every CNI endpoint, CNIEndpoint first, without
// duplicates or empty entries.
func (c Config) endpoints() []string {
	var out []string
	seen := map[string]bool{}
	for _, e := range append([]string{c.CNIEndpoint}, c.CNIEndpoints...) {
		if e != "" && !seen[e] {
			seen[e] = true
			out = append(out, e)
		}
	}
	return out
}

// Validate reports settings that cannot work; a zero is no exception (start
// from DefaultConfig). The cloud placement (cluster, VPC, subnet, security
// groups) is checked by RegisterNodes, the CNI endpoint by Run.
func (c Config) Validate() error {
	var errs []error
	if c.Name == "" || c.InstanceType == "" {
		errs = append(errs, errors.New("name and instance type are required"))
	}
	if c.Workers < 1 || c.MaxPodsPerNode < 1 || c.RegisterWorkers < 1 {
		errs = append(errs, errors.New("workers, max pods and register workers must be at least 1"))
	}
	if c.InstanceCPUs < 1 || c.InstanceMemoryGB < 1 {
		errs = append(errs, errors.New("instance CPUs and memory must be at least 1"))
	}
	if c.CNITimeout <= 0 || c.RetryBase <= 0 || c.RetryMax < c.RetryBase || c.AttachTimeout <= 0 {
		errs = append(errs, errors.New("timeouts and retry base must be positive and retry max must not be below retry base"))
	}
	if c.NodeLeasePeriod < 0 {
		errs = append(errs, errors.New("node lease period must not be negative (0 disables it)"))
	}
	return errors.Join(errs...)
}

func (c Config) validateRegistration() error {
	var errs []error
	if c.ClusterID == "" {
		errs = append(errs, errors.New("cluster ID is required"))
	}
	if c.VPCID == "" {
		errs = append(errs, errors.New("VPC ID is required"))
	}
	if c.SubnetID == "" {
		errs = append(errs, errors.New("subnet ID is required"))
	}
	if len(c.SecurityGroupIDs) == 0 {
		errs = append(errs, errors.New("at least one security group is required"))
	}
	return errors.Join(errs...)
}
