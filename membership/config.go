package membership

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// DefaultPort is memberlist's usual gossip port (TCP and UDP).
const DefaultPort = 7946

// Config configures one replica's gossip membership. Every replica of a
// cluster uses the same gossip key and timings.
type Config struct {
	// BindAddr is the IP address gossip listens on. The flag defaults to
	// 0.0.0.0.
	BindAddr string
	// BindPort is the TCP and UDP port gossip listens on; 0 picks a free
	// port (tests), readable from LocalAddr once Run has started.
	// The flag defaults to 7946.
	BindPort int
	// AdvertiseAddr is the IP address other replicas reach this one at
	// (the pod IP). Defaults to the bind address, or a private address of
	// this host when binding to 0.0.0.0.
	AdvertiseAddr string
	// AdvertisePort is the port other replicas reach this one at.
	// Defaults to the bound port.
	AdvertisePort int
	// NamePrefix starts this replica's member name (the pod name); a random
	// suffix is appended so that every process has a unique name, even a
	// restarted StatefulSet pod with a new IP. The flag defaults to the host
	// name.
	NamePrefix string
	// JoinSeeds are host:port addresses of replicas to join. Host names are
	// resolved on every attempt.
	JoinSeeds []string
	// JoinDNS is a DNS name (host or host:port; the headless Service) whose
	// addresses are joined; it is resolved on every attempt, so replicas
	// that appear later are found. The port defaults to the advertised port.
	JoinDNS string
	// JoinInterval is how often the replica tries again to join every seed
	// and DNS address that is not yet a live member. The flag defaults to 10s.
	JoinInterval time.Duration
	// GossipKeyFile holds the base64 encoding of a 16, 24 or 32 byte AES key
	// that encrypts all gossip. Empty means unencrypted (logged as a warning).
	GossipKeyFile string
	// KeySecret names a Secret of the replicas' namespace that holds the
	// gossip key and the forward key; the replicas create it when it is
	// absent (EnsureKeySecret). The program reads it and sets GossipKey.
	// Exclusive with GossipKeyFile.
	KeySecret string
	// GossipKey is the gossip key itself (from KeySecret; not a flag). It
	// takes the place of GossipKeyFile.
	GossipKey []byte
	// ClusterLabel is put on every gossip packet; replicas with another
	// label ignore each other (a second cluster on the same network).
	// The flag defaults to "cce-ipam"; empty puts no label on packets.
	ClusterLabel string
	// LeaveTimeout bounds the graceful leave on shutdown. The flag defaults
	// to 5s.
	LeaveTimeout time.Duration

	// Failure detection; the flags default to memberlist's LAN profile
	// (probe 1s, probe timeout 500ms, suspicion multiplier 4, gossip 200ms,
	// push/pull 30s, TCP timeout 10s). The WAN profile is never used.
	ProbeInterval    time.Duration
	ProbeTimeout     time.Duration
	SuspicionMult    int
	GossipInterval   time.Duration
	PushPullInterval time.Duration
	TCPTimeout       time.Duration
	// DeadNodeReclaimTime lets a name whose member died be taken by a new
	// address after this long (zero: at once). The flag defaults to 30s.
	DeadNodeReclaimTime time.Duration

	// GRPCAddr is the host:port this replica's gRPC service is reached at by
	// other replicas (advertised in the member meta). Required.
	GRPCAddr string
	// Version is this replica's build version (advertised in the meta).
	Version string
}

// RegisterFlags binds the config to command-line flags.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.BindAddr, "memberlist-bind-addr", "0.0.0.0", "IP address the gossip (memberlist) listener binds to")
	fs.IntVar(&c.BindPort, "memberlist-bind-port", DefaultPort, "TCP and UDP port of the gossip listener (0 picks a free port)")
	fs.StringVar(&c.AdvertiseAddr, "memberlist-advertise-addr", "",
		"IP address other replicas use to reach this one (usually the pod IP; default: a private address of this host)")
	fs.IntVar(&c.AdvertisePort, "memberlist-advertise-port", 0,
		"gossip port other replicas use to reach this one (default: the bound port)")
	fs.StringVar(&c.NamePrefix, "memberlist-name-prefix", hostName(),
		"member name prefix, usually the pod name; a random suffix makes the name unique per process")
	fs.StringSliceVar(&c.JoinSeeds, "memberlist-join", nil,
		"host:port of replicas to join (repeatable or comma-separated); host names are resolved on every attempt")
	fs.StringVar(&c.JoinDNS, "memberlist-join-dns", "",
		"DNS name (host or host:port) of the headless Service listing the replicas; resolved on every join attempt")
	fs.DurationVar(&c.JoinInterval, "memberlist-rejoin-interval", 10*time.Second,
		"how often to join again every seed and DNS address that is not yet a live member")
	fs.StringVar(&c.GossipKeyFile, "memberlist-gossip-key-file", "",
		"file with a base64 16, 24 or 32 byte AES key encrypting gossip (empty: unencrypted, not recommended)")
	fs.StringVar(&c.KeySecret, "memberlist-key-secret", "",
		"name of a Secret in --namespace holding the gossip and forward keys (gossip-key, forward-key); the first replica "+
			"creates it with random keys when absent, the others read it (exclusive with the key file flags)")
	fs.StringVar(&c.ClusterLabel, "memberlist-cluster-label", "cce-ipam",
		"label on every gossip packet; replicas with a different label ignore each other")
	fs.DurationVar(&c.LeaveTimeout, "memberlist-leave-timeout", 5*time.Second,
		"how long shutdown waits for the leave message to reach the other replicas")
	fs.DurationVar(&c.ProbeInterval, "memberlist-probe-interval", time.Second,
		"failure-detector probe interval (memberlist LAN default 1s)")
	fs.DurationVar(&c.ProbeTimeout, "memberlist-probe-timeout", 500*time.Millisecond,
		"failure-detector probe timeout (memberlist LAN default 500ms)")
	fs.IntVar(&c.SuspicionMult, "memberlist-suspicion-mult", 4,
		"suspicion timeout multiplier before a member is declared dead (memberlist LAN default 4)")
	fs.DurationVar(&c.GossipInterval, "memberlist-gossip-interval", 200*time.Millisecond, "gossip interval (memberlist LAN default 200ms)")
	fs.DurationVar(&c.PushPullInterval, "memberlist-push-pull-interval", 30*time.Second,
		"full state sync interval (memberlist LAN default 30s)")
	fs.DurationVar(&c.TCPTimeout, "memberlist-tcp-timeout", 10*time.Second, "timeout of one TCP exchange (join, push/pull, TCP ping)")
	fs.DurationVar(&c.DeadNodeReclaimTime, "memberlist-dead-node-reclaim-time", 30*time.Second,
		"after this long a dead member's name may reappear at another address")
	fs.StringVar(&c.GRPCAddr, "memberlist-grpc-advertise-addr", "",
		"host:port of this replica's gRPC service as other replicas reach it (advertised in gossip meta; required)")
}

// hostName is the default member name prefix: the host (pod) name, or
// "cce-ipam" where the host has none.
func hostName() string {
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	return "cce-ipam"
}

// DefaultConfig is the configuration the flags default to.
func DefaultConfig() Config {
	var c Config
	c.RegisterFlags(pflag.NewFlagSet("defaults", pflag.ContinueOnError))
	return c
}

// Validate reports a config that cannot work. It does not read the gossip
// key file; New does, and fails on a bad key.
func (c Config) Validate() error {
	var errs []error
	if net.ParseIP(c.BindAddr) == nil {
		errs = append(errs, fmt.Errorf("bind address %q is not an IP address", c.BindAddr))
	}
	if c.AdvertiseAddr != "" && net.ParseIP(c.AdvertiseAddr) == nil {
		errs = append(errs, fmt.Errorf("advertise address %q is not an IP address", c.AdvertiseAddr))
	}
	if c.BindPort < 0 || c.BindPort > 65535 || c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		errs = append(errs, errors.New("ports must be within 0..65535"))
	}
	if c.KeySecret != "" && c.GossipKeyFile != "" {
		errs = append(errs, errors.New("give the gossip key by a Secret or by a file, not both"))
	}
	for _, s := range c.JoinSeeds {
		if _, _, err := splitHostPort(s, 0); err != nil {
			errs = append(errs, fmt.Errorf("join seed %q: %w", s, err))
		}
	}
	if c.JoinDNS != "" {
		if _, _, err := splitHostPort(c.JoinDNS, 1); err != nil {
			errs = append(errs, fmt.Errorf("join DNS name %q: %w", c.JoinDNS, err))
		}
	}
	if c.JoinInterval <= 0 || c.LeaveTimeout <= 0 || c.ProbeInterval <= 0 || c.ProbeTimeout <= 0 ||
		c.GossipInterval <= 0 || c.PushPullInterval <= 0 || c.TCPTimeout <= 0 || c.SuspicionMult <= 0 {
		errs = append(errs, errors.New("intervals, timeouts and multipliers must be positive"))
	}
	if c.DeadNodeReclaimTime < 0 {
		errs = append(errs, errors.New("the dead-node reclaim time must not be negative"))
	}
	if c.NamePrefix == "" {
		errs = append(errs, errors.New("member name prefix is required"))
	}
	if c.ProbeTimeout > c.ProbeInterval {
		errs = append(errs, errors.New("probe timeout must not exceed the probe interval"))
	}
	if len(c.ClusterLabel) > 255 {
		errs = append(errs, errors.New("cluster label is longer than 255 bytes"))
	}
	if c.GRPCAddr == "" {
		errs = append(errs, errors.New("gRPC advertise address is required"))
	} else if _, err := EncodeMeta(Meta{GRPCAddr: c.GRPCAddr, Version: c.Version, StartTime: time.Unix(0, 1)}); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// splitHostPort splits "host:port" or, when defPort > 0, a bare "host".
func splitHostPort(s string, defPort int) (string, int, error) {
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		if defPort > 0 && !strings.Contains(strings.Trim(s, "[]"), ":") && s != "" {
			return s, defPort, nil
		}
		if defPort > 0 && strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
			return strings.Trim(s, "[]"), defPort, nil
		}
		return "", 0, err
	}
	if host == "" {
		return "", 0, errors.New("empty host")
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", portStr)
	}
	return host, port, nil
}

// ErrBadGossipKey is returned (wrapped) when the gossip key file does not
// hold a base64 AES key of 16, 24 or 32 bytes.
var ErrBadGossipKey = errors.New("malformed gossip key")

// LoadGossipKey reads a gossip key file (ParseGossipKey's format).
func LoadGossipKey(path string) ([]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read gossip key file: %w", err)
	}
	key, err := ParseGossipKey(raw)
	if err != nil {
		return nil, fmt.Errorf("gossip key file %s: %w", path, err)
	}
	return key, nil
}
