package fleet

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"k8s.io/client-go/rest"

	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/e2e/cluster"
	"github.com/cce-ipam/sharded/e2e/kubeletsim"
)

// Credentials bce-sim accepts and every replica uses.
const (
	AccessKey = "AKFLEET"
	SecretKey = "SKfleetSecret"
	Region    = "bj"
	Zone      = "cn-bj-a"
)

// Options shape a fleet. Zero values get the documented defaults.
type Options struct {
	// Config and Kubeconfig name an existing control plane (both are
	// needed: the test talks through Config, the replicas read
	// Kubeconfig). When both are empty the fleet starts its own with
	// e2e/cluster (etcd, kube-apiserver, kube-controller-manager), and only
	// then can RestartAPIServer work.
	Config     *rest.Config
	Kubeconfig string
	// SharedCluster is a control plane from e2e/cluster that the fleet
	// shares with other tests (a package's TestMain), given instead of
	// Config and Kubeconfig. The fleet installs the CRDs and fences as on a
	// control plane of its own, but for LeaseNamespace only: the chart's
	// wep fencing policy covers the Leases and the weps of that namespace
	// (so that fleets of other tests are not fenced by it; Close removes
	// it), and the replicas run as the user it fences. Give each fleet a
	// namespace of its own (cluster.Namespace) and create the pods whose
	// weps must be fenced there.
	SharedCluster *cluster.Cluster
	// KeepCRDs installs only the chart's CRDs the control plane lacks and
	// leaves existing ones as they are, as `helm install` does (e.g. where
	// the reference's schema-less CRDs are installed). SharedCluster only.
	KeepCRDs bool
	// BinDir holds cce-ipam and bce-sim (and the control-plane binaries
	// when the fleet starts its own). Defaults to $CCE_IPAM_BIN_DIR, else
	// bin/ at the root of this module.
	BinDir string
	// Dir receives the logs: bce-sim.log and replica-<i>.log. Defaults to a
	// new temporary directory, removed by Close unless KeepDir.
	Dir     string
	KeepDir bool

	// Name prefixes the cluster ID (cce-<name>), VPC, subnet, security
	// group, node names (<name>-NNNNN) and the simulator label, so that
	// several fleets may use one control plane one after the other.
	// Lower-case letters, digits and dashes. Defaults to "fleet".
	Name string
	// Replicas is the number of cce-ipam processes at start. Defaults to 1.
	// More than one needs the sharding flags (--memberlist-*), see
	// Fleet.Sharded.
	Replicas int
	// NoReplicas starts none (Replicas is then ignored): the test adds them
	// with AddReplica once it has built the world they take over.
	NoReplicas bool
	// Nodes is the number of simulated BCC nodes registered at start.
	// Defaults to 3; AddNodes registers more later.
	Nodes int

	// SubnetCIDR is the nodes' subnet. Defaults to 10.20.0.0/16. A small
	// one (e.g. a /27) makes pool exhaustion easy to reach.
	SubnetCIDR string
	// InstanceCPUs and InstanceMemoryGB size every simulated instance
	// (max ENIs = min(cpus,8), IPs per ENI from memory). Default 8 and 64.
	InstanceCPUs, InstanceMemoryGB int
	// AttachDelay is bce-sim's ENI attach time. Defaults to 200ms; a
	// negative value attaches at once.
	AttachDelay time.Duration
	// SimRateLimits override bce-sim's per-operation limits (the defaults
	// are BCE's documented ones); QPS 0 lifts a limit. NoSimRateLimits
	// turns every limit off.
	SimRateLimits   map[bcesim.Op]bcesim.RateLimit
	NoSimRateLimits bool
	// SimArgs are appended to bce-sim's command line.
	SimArgs []string

	// BCERate and BCEBurst are the BCE budget (--bce-rate, --bce-burst):
	// the sharded binary splits them among the live replicas. Default 50
	// and 20.
	BCERate  float64
	BCEBurst int
	// IdleMin and IdleMax are the warm pool bounds. Default 2 and 6.
	IdleMin, IdleMax int
	// LeaseNamespace is where sharded replicas keep their Leases
	// (--namespace). Defaults to kube-system.
	LeaseNamespace string
	// LogLevel of the replicas. Defaults to info.
	LogLevel string
	// ReplicaArgs are appended to every replica's command line, after the
	// fleet's own flags (a later flag wins). ReplicaArgsFunc, when set,
	// adds per-replica flags after those (it sees the replica index).
	ReplicaArgs     []string
	ReplicaArgsFunc func(index int) []string
	// NoJoinSeeds gives the replicas no --memberlist-join addresses of
	// each other: they must find each other another way (a DNS name in
	// ReplicaArgs, or the replica Leases).
	NoJoinSeeds bool
	// ReplicaEnvFunc, when set, adds environment variables ("NAME=value")
	// to the replica with that index, on top of the test binary's own
	// environment: e.g. the product's test-only failpoints, armed for one
	// replica.
	ReplicaEnvFunc func(index int) []string

	// KubeletDebug logs every CNI ADD and DEL of the kubelet simulator (pod,
	// container, node, IP) to kubelet-sim.log.
	KubeletDebug bool

	// NoKubelet starts no kubelet simulator (and registers no nodes).
	NoKubelet bool
	// Kubelet, when set, adjusts the simulator's config: kubeletsim's
	// DefaultConfig with the fleet's 16 workers, CNI timeout 15s, retries
	// 200ms..5s and node heartbeats every 10s. The fleet then fills in the
	// CNI endpoints, names and cloud placement.
	Kubelet func(*kubeletsim.Config)

	// NetNS runs every replica in its own network namespace on a bridge
	// (10.213.X.0/24) instead of on 127.0.0.1, so that Partition can cut one
	// off from its peers. Needs root (ip netns); New fails with a clear
	// message where namespaces cannot be made. The replicas reach
	// kube-apiserver and bce-sim through TCP proxies on the bridge.
	NetNS bool

	// External, when set, runs against IPAM replicas and a bce-sim the
	// fleet did not start (a kind cluster with the Helm chart): no process
	// is started, only the kubelet simulator and its nodes (set
	// Kubelet.NoScheduling when the cluster has a scheduler). Config and
	// Kubeconfig are then required; Replicas is ignored.
	External *External

	// StartTimeout bounds Start. Defaults to 3 minutes (a loaded 2-core
	// machine).
	StartTimeout time.Duration
	// Logger receives the fleet's own progress lines. Defaults to none.
	Logger *slog.Logger
}

// External describes an IPAM the fleet did not start.
type External struct {
	// CNIAddrs are the CNI gRPC addresses the kubelet simulator calls
	// (e.g. port-forwards to every replica pod, or one Service).
	CNIAddrs []string
	// SimURL is bce-sim's base URL (BCE OpenAPI and /admin/).
	SimURL string
	// The world bce-sim was started with and the replicas are configured
	// for: cluster ID, VPC, the nodes' subnet and security group.
	ClusterID, VPCID, SubnetID, SecurityGroup string
}

var namePattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)

func (o *Options) defaults() error {
	if c := o.SharedCluster; c != nil {
		if o.Config != nil || o.Kubeconfig != "" || o.External != nil {
			return errors.New("fleet: SharedCluster replaces Config and Kubeconfig, and is no External IPAM")
		}
		o.Config, o.Kubeconfig = c.Config, c.Kubeconfig
	}
	if (o.Config == nil) != (o.Kubeconfig == "") {
		return errors.New("fleet: give both Config and Kubeconfig, or neither")
	}
	if o.External != nil {
		e := o.External
		if o.Config == nil || len(e.CNIAddrs) == 0 || e.SimURL == "" || e.ClusterID == "" || e.VPCID == "" ||
			e.SubnetID == "" || e.SecurityGroup == "" {
			return errors.New("fleet: External needs Config, Kubeconfig, CNI addresses, the bce-sim URL, " +
				"cluster ID, VPC, subnet and security group")
		}
		o.Replicas = 0
	}
	if o.BinDir == "" {
		o.BinDir = os.Getenv("CCE_IPAM_BIN_DIR")
	}
	if o.BinDir == "" {
		root, err := moduleRoot()
		if err != nil {
			return fmt.Errorf("fleet: find bin/ (set CCE_IPAM_BIN_DIR or Options.BinDir): %w", err)
		}
		o.BinDir = filepath.Join(root, "bin")
	}
	setDefault(&o.Name, "fleet")
	if !namePattern.MatchString(o.Name) {
		return fmt.Errorf("fleet: name %q: want lower-case letters, digits and dashes", o.Name)
	}
	switch {
	case o.NoReplicas:
		o.Replicas = 0
	case o.External == nil:
		setDefault(&o.Replicas, 1)
	}
	setDefault(&o.Nodes, 3)
	setDefault(&o.SubnetCIDR, "10.20.0.0/16")
	setDefault(&o.InstanceCPUs, 8)
	setDefault(&o.InstanceMemoryGB, 64)
	setDefault(&o.AttachDelay, 200*time.Millisecond)
	setDefault(&o.BCERate, 50)
	setDefault(&o.BCEBurst, 20)
	setDefault(&o.IdleMin, 2)
	setDefault(&o.IdleMax, 6)
	setDefault(&o.LeaseNamespace, "kube-system")
	setDefault(&o.LogLevel, "info")
	setDefault(&o.StartTimeout, 3*time.Minute)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Replicas < 0 || o.Nodes < 0 {
		return errors.New("fleet: replicas and nodes must not be negative")
	}
	return nil
}

func setDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// moduleRoot walks up from the working directory to this module's go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			regexp.MustCompile(`(?m)^module\s+github\.com/cce-ipam/sharded\s*$`).Match(data) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod of github.com/cce-ipam/sharded above the working directory")
		}
		dir = parent
	}
}
