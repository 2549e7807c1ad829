package ipam

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/cce-ipam/sharded/ipamcore/pool"
)

// Config tunes the IPAM. Every replica of a cluster uses the same values.
type Config struct {
	// ClusterID names the cluster; ENIs of this cluster are named
	// "<ClusterID>/...". Required.
	ClusterID string
	// VPCID is the cluster's VPC. Required.
	VPCID string
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
	// SubnetSelection chooses the subnet of a new ENI among its IPPool's:
	// MostFreeIP (default) or LeastENI.
	SubnetSelection string
	// GCPeriod is how often garbage is collected. Defaults to 120s.
	GCPeriod time.Duration
	// LeakGrace is how long an assigned IP without a WorkloadEndpoint is
	// left alone before it is reclaimed (an ADD between the datastore and
	// the wep commit is not a leak). Defaults to 10m, as the reference.
	LeakGrace time.Duration
}

// RegisterFlags binds the config to command-line flags with the reference's
// names where it has them.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.ClusterID, "cluster-id", "", "CCE cluster ID; ENIs of the cluster are named <cluster-id>/... (required)")
	fs.StringVar(&c.VPCID, "vpc-id", "", "VPC of the cluster (required)")
	fs.IntVar(&c.IdleMin, "idle-ip-pool-min-size", 2, "idle IPs kept ready on each node")
	fs.IntVar(&c.IdleMax, "idle-ip-pool-max-size", 6, "most idle IPs kept on a node; more are returned to the cloud")
	fs.IntVar(&c.BatchAdd, "batch-add-ip-num", 4, "IPs requested per cloud call when the pool grows (at most 10)")
	fs.DurationVar(&c.PoolCheckPeriod, "pool-check-period", 30*time.Second, "how often each node's pool is checked against its bounds")
	fs.DurationVar(&c.AllocateWait, "allocate-wait", 10*time.Second, "how long an allocation waits for the pool to refill")
	fs.DurationVar(&c.Cooldown, "ip-cooling-period", 5*time.Second, "how long a released IP rests before it is handed out again")
	fs.DurationVar(&c.ReadLag, "cloud-read-lag", 5*time.Second, "how far BCE reads may lag writes: a taken-over node's unclaimed IPs are handed out only after a read this long after the takeover confirms them")
	fs.DurationVar(&c.ENISyncPeriod, "eni-sync-period", 20*time.Second, "how often the cluster's ENIs are listed to adopt, drop and clean up ENIs and to update IPPool status")
	fs.DurationVar(&c.LeakedENIAge, "leaked-eni-age", 3*time.Minute, "an unattached ENI of the cluster older than this is deleted by the ENI sync")
	fs.StringVar(&c.SubnetSelection, "eni-subnet-selection", SubnetMostFreeIP, "subnet of a new ENI among its IPPool's: MostFreeIP or LeastENI")
	fs.DurationVar(&c.GCPeriod, "gc-period", 120*time.Second, "how often weps of deleted pods, fixed IPs of deleted or scaled-down StatefulSets and leaked IPs are collected")
	fs.DurationVar(&c.LeakGrace, "leaked-ip-grace", 10*time.Minute, "how long an assigned IP without a WorkloadEndpoint waits before it is reclaimed")
}

func (c *Config) defaults() {
	if c.IdleMin == 0 {
		c.IdleMin = 2
	}
	if c.IdleMax == 0 {
		c.IdleMax = 6
	}
	if c.BatchAdd == 0 {
		c.BatchAdd = 4
	}
	if c.PoolCheckPeriod == 0 {
		c.PoolCheckPeriod = 30 * time.Second
	}
	if c.AllocateWait == 0 {
		c.AllocateWait = 10 * time.Second
	}
	if c.Cooldown == 0 {
		c.Cooldown = 5 * time.Second
	}
	if c.ReadLag == 0 {
		c.ReadLag = 5 * time.Second
	}
	if c.ENISyncPeriod == 0 {
		c.ENISyncPeriod = 20 * time.Second
	}
	if c.LeakedENIAge == 0 {
		c.LeakedENIAge = 3 * time.Minute
	}
	if c.SubnetSelection == "" {
		c.SubnetSelection = SubnetMostFreeIP
	}
	if c.GCPeriod == 0 {
		c.GCPeriod = 120 * time.Second
	}
	if c.LeakGrace == 0 {
		c.LeakGrace = 10 * time.Minute
	}
}

// poolConfig is the warm-pool planner's view of the config.
func (c Config) poolConfig() pool.Config {
	pc := pool.DefaultConfig()
	pc.MinIdle, pc.MaxIdle, pc.Batch = c.IdleMin, c.IdleMax, c.BatchAdd
	return pc
}

// Validate reports a config that cannot work, after defaults are applied.
func (c Config) Validate() error {
	c.defaults()
	var errs []error
	if c.ClusterID == "" {
		errs = append(errs, errors.New("cluster ID is required"))
	}
	if c.VPCID == "" {
		errs = append(errs, errors.New("VPC ID is required"))
	}
	if c.SubnetSelection != SubnetMostFreeIP && c.SubnetSelection != SubnetLeastENI {
		errs = append(errs, fmt.Errorf("subnet selection %q: want %s or %s", c.SubnetSelection, SubnetMostFreeIP, SubnetLeastENI))
	}
	if err := c.poolConfig().Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.PoolCheckPeriod < 0 || c.AllocateWait < 0 || c.Cooldown < 0 || c.GCPeriod < 0 || c.LeakGrace < 0 || c.ENISyncPeriod < 0 || c.LeakedENIAge < 0 ||
		c.ReadLag < 0 {
		errs = append(errs, errors.New("periods must not be negative"))
	}
	return errors.Join(errs...)
}
