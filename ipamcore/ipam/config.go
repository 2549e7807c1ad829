package ipam

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/cce-ipam/sharded/ipamcore/pool"
	"github.com/cce-ipam/sharded/ipamcore/psts"
)

// Config tunes the IPAM. Every replica of a cluster uses the same values.
// The defaults are the flags' (RegisterFlags, DefaultConfig); New takes the
// config as it is and rejects one that Validate rejects.
type Config struct {
	// ClusterID names the cluster; ENIs of this cluster are named
	// "<ClusterID>/...". Required.
	ClusterID string
	// VPCID is the cluster's VPC. Required.
	VPCID string
	// CNIMode is the cluster's CNI mode (the reference's --cni-mode): one of
	// the vpc-secondary-ip modes, or a BBC mode whose BCC nodes are served
	// alike. Defaults to vpc-secondary-ip-veth.
	CNIMode string
	// IdleMin is the number of idle IPs each node keeps ready (at least 1).
	// Defaults to 2.
	IdleMin int
	// IdleMax is the most idle IPs a node keeps; a release above it returns
	// the IP to the cloud, and the pool worker trims to it. Defaults to 6.
	IdleMax int
	// BatchAdd is the number of IPs asked for in one cloud call (≤ 10).
	// Defaults to 4.
	BatchAdd int
	// PoolCheckPeriod is how often each node's pool is checked against
	// IdleMin / IdleMax. Defaults to 30s.
	PoolCheckPeriod time.Duration
	// AllocateWait bounds how long an allocation waits for the pool to be
	// refilled before failing with a retryable error. Defaults to 10s.
	AllocateWait time.Duration
	// Cooldown keeps a released IP out of the pool for this long, so the old
	// pod's datapath state drains first. Defaults to 5s.
	Cooldown time.Duration
	// ReadLag bounds how far BCE's reads may lag its writes (the reference's
	// 5 s minimum IP lifetime exists for the same lag). A taken-over node's
	// unclaimed addresses are held until a read this long after the
	// takeover confirms them, and the periodic sync drops or adopts an
	// address only when two reads this far apart agree. Defaults to 5s.
	ReadLag time.Duration
	// ENISyncPeriod is how often the cluster's ENIs are listed (VPC-wide)
	// to adopt new ENIs, drop vanished ones, keep IPPool status current and
	// delete leaked ENIs. Defaults to 20s.
	ENISyncPeriod time.Duration
	// LeakedENIAge: an ENI of the cluster left unattached this long after
	// its creation is deleted by the ENI sync. Defaults to 3m.
	LeakedENIAge time.Duration
	// ENICreateWithIPs: a new ENI created for allocations that wait beyond
	// the attached ENIs' room holds their addresses from its creation
	// (CreateENI's privateIpSet) instead of getting them by batch adds
	// after its attach. Defaults to true.
	ENICreateWithIPs bool
	// SubnetSelection chooses the subnet of a new ENI among its IPPool's:
	// MostFreeIP (default) or LeastENI.
	SubnetSelection string
	// GCPeriod is how often garbage is collected. Defaults to 120s.
	GCPeriod time.Duration
	// LeakGrace is how long an assigned IP without a WorkloadEndpoint is
	// left alone before it is reclaimed (an ADD between the datastore and
	// the wep commit is not a leak). Defaults to 10m, as the reference.
	LeakGrace time.Duration
	// SubnetAvailableIndex: the first this many addresses of a subnet are
	// never given to a PSTS pod of an exclusive subnet (network, gateway),
	// nor is the last. Defaults to 2, as the reference.
	SubnetAvailableIndex int
}

// RegisterFlags binds the config to command-line flags with the reference's
// names where it has them, and sets the defaults.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.ClusterID, "cluster-id", "",
		"CCE cluster ID; ENIs of the cluster are named <cluster-id>/... (required)")
	fs.StringVar(&c.VPCID, "vpc-id", "", "VPC of the cluster (required)")
	fs.StringVar(&c.CNIMode, "cni-mode", CNIModeSecondaryIPVeth, cniModeHelp)
	fs.IntVar(&c.IdleMin, "idle-ip-pool-min-size", 2, "idle IPs kept ready on each node")
	fs.IntVar(&c.IdleMax, "idle-ip-pool-max-size", 6, "most idle IPs kept on a node; more are returned to the cloud")
	fs.IntVar(&c.BatchAdd, "batch-add-ip-num", 4, "IPs requested per cloud call when the pool grows (at most 10)")
	fs.DurationVar(&c.PoolCheckPeriod, "pool-check-period", 30*time.Second,
		"how often each node's pool is checked against its bounds")
	fs.DurationVar(&c.AllocateWait, "allocate-wait", 10*time.Second, "how long an allocation waits for the pool to refill")
	fs.DurationVar(&c.Cooldown, "ip-cooling-period", 5*time.Second,
		"how long a released IP rests before it is handed out again")
	fs.DurationVar(&c.ReadLag, "cloud-read-lag", 5*time.Second,
		"how far BCE reads may lag writes: a taken-over node's unclaimed IPs are handed out only after a read "+
			"this long after the takeover confirms them")
	fs.DurationVar(&c.ENISyncPeriod, "eni-sync-period", 20*time.Second,
		"how often the cluster's ENIs are listed to adopt, drop and clean up ENIs and to update IPPool status")
	fs.DurationVar(&c.LeakedENIAge, "leaked-eni-age", 3*time.Minute,
		"an unattached ENI of the cluster older than this is deleted by the ENI sync")
	fs.BoolVar(&c.ENICreateWithIPs, "eni-create-with-ips", true,
		"create a new ENI holding the addresses of the allocations waiting for it (CreateENI's privateIpSet), "+
			"so a burst that outgrew the node's ENIs needs no batch adds on it; false: the primary only, as the reference")
	fs.StringVar(&c.SubnetSelection, "eni-subnet-selection", SubnetMostFreeIP,
		"subnet of a new ENI among its IPPool's: MostFreeIP or LeastENI")
	fs.DurationVar(&c.GCPeriod, "gc-period", 120*time.Second,
		"how often weps of deleted pods, fixed IPs of deleted or scaled-down StatefulSets and leaked IPs are collected")
	fs.DurationVar(&c.LeakGrace, "leaked-ip-grace", 10*time.Minute,
		"how long an assigned IP without a WorkloadEndpoint waits before it is reclaimed")
	fs.IntVar(&c.SubnetAvailableIndex, "subnet-available-index", psts.DefaultAvailableIndex,
		"PSTS exclusive subnets: the first this many addresses of a subnet (and its last) are never given to a pod")
}

// DefaultConfig is the config of a command line without flags (ClusterID and
// VPCID, which have no default, are empty), for tests and library users.
func DefaultConfig() Config {
	var c Config
	c.RegisterFlags(pflag.NewFlagSet("ipam", pflag.ContinueOnError))
	return c
}

// poolConfig is the warm-pool planner's view of the config.
func (c Config) poolConfig() pool.Config {
	pc := pool.DefaultConfig()
	pc.MinIdle, pc.MaxIdle, pc.Batch = c.IdleMin, c.IdleMax, c.BatchAdd
	return pc
}

// Validate reports a config that cannot work. Every period must be positive:
// a zero ticker period panics, and a zero wait, cooling, lag, age or grace
// would turn a safety margin off without saying so.
func (c Config) Validate() error {
	var errs []error
	if c.ClusterID == "" {
		errs = append(errs, errors.New("cluster ID is required"))
	}
	if c.VPCID == "" {
		errs = append(errs, errors.New("VPC ID is required"))
	}
	if err := validateCNIMode(c.CNIMode); err != nil {
		errs = append(errs, err)
	}
	if c.SubnetSelection != SubnetMostFreeIP && c.SubnetSelection != SubnetLeastENI {
		errs = append(errs, fmt.Errorf("subnet selection %q: want %s or %s", c.SubnetSelection, SubnetMostFreeIP, SubnetLeastENI))
	}
	if err := c.poolConfig().Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.SubnetAvailableIndex < 0 {
		errs = append(errs, fmt.Errorf("subnet available index %d: must not be negative", c.SubnetAvailableIndex))
	}
	for _, p := range []struct {
		name string
		d    time.Duration
	}{
		{"pool check period", c.PoolCheckPeriod},
		{"allocate wait", c.AllocateWait},
		{"cooling period", c.Cooldown},
		{"cloud read lag", c.ReadLag},
		{"ENI sync period", c.ENISyncPeriod},
		{"leaked ENI age", c.LeakedENIAge},
		{"GC period", c.GCPeriod},
		{"leaked IP grace", c.LeakGrace},
	} {
		if p.d <= 0 {
			errs = append(errs, fmt.Errorf("%s %s: must be positive", p.name, p.d))
		}
	}
	return errors.Join(errs...)
}
