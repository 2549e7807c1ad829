package shard

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/spf13/pflag"
)

// Config configures a replica's Coordinator. Every replica of a cluster must
// use the same Partitions and lease timings. RegisterFlags sets the
// defaults; DefaultConfig returns them.
type Config struct {
	// Namespace holds the replica, partition-claim and budget Leases.
	// Default $POD_NAMESPACE, else kube-system (--namespace).
	Namespace string
	// Ring shapes the consistent-hash ring.
	Ring RingConfig
	// LeaseDuration is how long others wait, from the last renewal they saw,
	// before they take over a replica's partitions. Default 6s.
	LeaseDuration time.Duration
	// RenewDeadline is how long after its last successful renewal a replica
	// keeps serving by its own clock. It must be well below LeaseDuration:
	// the gap absorbs clock-rate differences and the delay of the watch that
	// shows others the renewal. Default 4s.
	RenewDeadline time.Duration
	// RenewPeriod is how often the replica renews its Lease. Default 1s.
	RenewPeriod time.Duration
	// OwnerWait bounds how long a CNI call waits for its node to have an
	// owner (during a hand-over) before it fails with a retryable error.
	// Default 20s; 0: no wait.
	OwnerWait time.Duration
	// ForwardKeyFile holds the base64 key that authenticates calls forwarded
	// between replicas (HMAC-SHA256). Empty: a key derived from the gossip
	// key (ForwardKeyFromGossipKey), with a warning; with neither, forwards
	// are unauthenticated (a warning is logged).
	ForwardKeyFile string
	// LeaveTimeout bounds the graceful hand-over on shutdown. Default 20s;
	// 0: no hand-over (the partitions move when the lease expires).
	LeaveTimeout time.Duration
	// ColdStartSettle holds back the first claims of a cold start (no live
	// replica holds any partition) until the live set and the fresh replica
	// Leases have not changed for this long, so that replicas started
	// together split the nodes once instead of one taking them all and
	// handing two thirds over again. Default 2s; 0: claim at once. Joins
	// into a running cluster never wait.
	ColdStartSettle time.Duration
	// BudgetFollowDemand lets idle replicas lend their share of the cloud
	// rate to busy ones (never the per-operation limits, which stay split
	// evenly). Default off: an even split.
	BudgetFollowDemand bool
	// FencingPolicy is the name prefix of the ValidatingAdmissionPolicies
	// (<name>-g<group>, <name>-token) and bindings (<name>-<partition>,
	// <name>-token) that make the API server refuse wep writes under a stale
	// claim. A replica checks that they exist, reports it (metric, /shard/status),
	// and after a takeover waits until the policy refuses the old holder's
	// token. Default cce-ipam-wep-fencing; empty: not checked, no such wait.
	FencingPolicy string
	// RequireFencingPolicy holds back every claim (and readiness) while the
	// fencing policy is missing. Default off: the replica serves, fenced by
	// its own clock only, and says so loudly.
	RequireFencingPolicy bool
}

// defaultNamespace is the namespace of the pod (the downward API's
// POD_NAMESPACE), else kube-system.
func defaultNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return "kube-system"
}

// RegisterFlags binds the config to --shard-* flags (and --namespace), with
// the defaults.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Namespace, "namespace", defaultNamespace(),
		"namespace of the coordination Leases (replica leases, partition claims, budget); default $POD_NAMESPACE, else kube-system")
	c.Ring.RegisterFlags(fs)
	fs.DurationVar(&c.LeaseDuration, "shard-lease-duration", 6*time.Second,
		"how long other replicas wait after a replica's last lease renewal before taking over its nodes")
	fs.DurationVar(&c.RenewDeadline, "shard-renew-deadline", 4*time.Second,
		"a replica stops serving when its lease was not renewed for this long (must be below --shard-lease-duration)")
	fs.DurationVar(&c.RenewPeriod, "shard-renew-period", time.Second, "how often a replica renews its lease")
	fs.DurationVar(&c.OwnerWait, "shard-owner-wait", 20*time.Second,
		"how long a CNI call waits for its node to get an owner before failing with a retryable error")
	fs.StringVar(&c.ForwardKeyFile, "shard-forward-key-file", "",
		"file with the base64 key authenticating calls forwarded between replicas "+
			"(default: a key derived from the gossip key, with a warning)")
	fs.DurationVar(&c.LeaveTimeout, "shard-leave-timeout", 20*time.Second, "how long a graceful shutdown waits to hand its nodes over")
	fs.DurationVar(&c.ColdStartSettle, "shard-cold-start-settle", 2*time.Second,
		"at a cold start (no live replica holds any nodes), wait until the set of replicas has been stable for this long "+
			"before claiming, so replicas started together split the nodes once (0: claim at once)")
	fs.StringVar(&c.FencingPolicy, "shard-fencing-policy", "cce-ipam-wep-fencing",
		"name prefix of the ValidatingAdmissionPolicies and bindings that fence wep writes in the API server "+
			"(<name>-g<group>, <name>-<partition>, <name>-token; \"\": do not check)")
	fs.BoolVar(&c.RequireFencingPolicy, "shard-require-fencing-policy", false,
		"claim no partition while the fencing policy is missing (default: serve, fenced by this replica's clock only, and report it)")
	fs.BoolVar(&c.BudgetFollowDemand, "shard-budget-follow-demand", false,
		"let idle replicas lend their share of --bce-rate to busy ones (experimental; default: an even split)")
}

// DefaultConfig is the config of a cce-ipam started without flags.
func DefaultConfig() Config {
	var c Config
	c.RegisterFlags(pflag.NewFlagSet("shard", pflag.ContinueOnError))
	return c
}

// Validate reports a config that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.Namespace == "" {
		errs = append(errs, errors.New("shard: the namespace must not be empty"))
	}
	if err := c.Ring.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.LeaseDuration <= 0 || c.RenewDeadline <= 0 || c.RenewPeriod <= 0 {
		errs = append(errs, errors.New("shard: the lease duration, renew deadline and renew period must be positive"))
	}
	if c.OwnerWait < 0 || c.LeaveTimeout < 0 || c.ColdStartSettle < 0 {
		errs = append(errs, errors.New("shard: the owner wait, leave timeout and cold-start settle must not be negative"))
	}
	// The fence: a replica stops by RenewDeadline on its clock; others take
	// over after LeaseDuration on theirs. A quarter of the duration is the
	// least margin we accept for clock-rate drift and watch delay.
	if c.RenewDeadline > c.LeaseDuration*3/4 {
		errs = append(errs, fmt.Errorf("shard: renew deadline %s must be at most 3/4 of the lease duration %s", c.RenewDeadline,
			c.LeaseDuration))
	}
	if c.RenewPeriod*2 > c.RenewDeadline {
		errs = append(errs, fmt.Errorf("shard: renew period %s must allow two renewals within the renew deadline %s",
			c.RenewPeriod, c.RenewDeadline))
	}
	return errors.Join(errs...)
}

// PartitionOf is the partition a node hashes into: the same value
// Ring.Partition gives, without a ring (it depends on the count only).
func PartitionOf(partitions int, node string) int {
	return int(xxhash.Sum64String(node) % uint64(partitions))
}
