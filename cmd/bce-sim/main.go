package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/cce-ipam/sharded/cloud/bcesim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "bce-sim:", err)
		os.Exit(2)
	}
}

type options struct {
	listen, vpc, securityGroup, credentialsDir, logLevel, logFormat string
	credentials, subnets, instances, rateOverrides                  []string
	gatewayTokens, gatewayHosts                                     []string
	pageSize, unattachedQuota, bulkInstances, bulkCPU, bulkMemGB    int
	bulkSubnet                                                      string
	attachDelay, detachDelay, replicaLag, latency                   time.Duration
	errorRate                                                       float64
	seed                                                            uint64
	rateLimits                                                      bool
}

func (o *options) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address to serve on; port 0 picks a free port (printed on stdout)")
	fs.StringArrayVar(&o.credentials, "credential", nil, "accepted access key pair AK:SK (repeatable)")
	fs.StringVar(&o.credentialsDir, "credentials-dir", "",
		"directory with files access-key-id and secret-access-key to accept (a mounted Secret)")
	fs.StringArrayVar(&o.gatewayTokens, "gateway-token", nil,
		"also act as the CCE gateway: accept requests carrying this cce-token instead of a signature (repeatable)")
	fs.StringArrayVar(&o.gatewayHosts, "gateway-remote-host", nil,
		"in gateway mode, a cce-remote-host served (repeatable; default: every host)")
	fs.IntVar(&o.pageSize, "page-size", 1000, "largest list page served, below the SDK's maxKeys=1000 to exercise pagination")
	fs.DurationVar(&o.attachDelay, "attach-delay", 2*time.Second, "time an ENI stays attaching before it is inuse (< 50s)")
	fs.DurationVar(&o.detachDelay, "detach-delay", time.Second, "time an ENI stays detaching before it is available")
	fs.Uint64Var(&o.seed, "seed", 1, "seed for IDs, MAC addresses and injected faults")
	fs.IntVar(&o.unattachedQuota, "max-unattached-enis", 500, "unattached ENIs allowed per VPC (QuotaLimitExceeded beyond)")
	fs.BoolVar(&o.rateLimits, "rate-limits", true, "enforce the per-operation BCE rate limits (429 RateLimit)")
	fs.StringArrayVar(&o.rateOverrides, "rate-limit", nil,
		"per-operation limit OP=QPS:BURST, e.g. ListENIs=2:2; QPS 0 lifts it (repeatable)")
	fs.StringVar(&o.vpc, "vpc", "vpc-sim", "VPC of the subnets and instances created by flags")
	fs.StringVar(&o.securityGroup, "security-group", "g-sim", "security group created in the VPC and given to every instance")
	fs.StringArrayVar(&o.subnets, "subnet", nil, "subnet ID,ZONE,CIDR to create (repeatable)")
	fs.StringArrayVar(&o.instances, "instance", nil, "instance ID,SUBNET,CPUS,MEMORY_GB to create (repeatable)")
	fs.IntVar(&o.bulkInstances, "instances", 0, "number of extra instances i-sim-N to create in --instance-subnet")
	fs.StringVar(&o.bulkSubnet, "instance-subnet", "", "subnet of the --instances")
	fs.IntVar(&o.bulkCPU, "instance-cpus", 8, "vCPUs of each of the --instances")
	fs.IntVar(&o.bulkMemGB, "instance-memory-gb", 32, "memory of each of the --instances")
	fs.DurationVar(&o.replicaLag, "replica-lag", 0, "reads show the state of this long ago; releasing a younger address fails as not found")
	fs.DurationVar(&o.latency, "latency", 0, "added to every call (above the client's timeout it times out)")
	fs.Float64Var(&o.errorRate, "error-rate", 0, "fraction of calls answered 500 before they are applied (the SDK retries them)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error (debug logs every request)")
	fs.StringVar(&o.logFormat, "log-format", "text", "text or json")
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o options
	fs := pflag.NewFlagSet("bce-sim", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	o.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger, err := newLogger(o.logLevel, o.logFormat, stderr)
	if err != nil {
		return err
	}
	creds, err := o.credentialMap()
	if err != nil {
		return err
	}
	cfg := bcesim.Config{
		Credentials: creds, PageSize: o.pageSize, Logger: logger,
		Gateway: bcesim.GatewayConfig{Tokens: o.gatewayTokens, RemoteHosts: o.gatewayHosts},
		World: bcesim.WorldConfig{AttachDelay: o.attachDelay, DetachDelay: o.detachDelay, Seed: o.seed,
			MaxUnattachedENIsPerVPC: o.unattachedQuota},
	}
	if o.rateLimits {
		cfg.RateLimits = bcesim.DefaultRateLimits()
	}
	srv, err := bcesim.New(cfg)
	if err != nil {
		return err
	}
	if err := o.applyRateOverrides(srv); err != nil {
		return err
	}
	if err := o.populate(srv); err != nil {
		return err
	}
	faults := bcesim.Faults{ReplicaLagMs: int(o.replicaLag.Milliseconds())}
	if o.latency > 0 {
		faults.LatencyMs = map[bcesim.Op]int{"*": int(o.latency.Milliseconds())}
	}
	if o.errorRate > 0 {
		faults.ErrorRate = map[bcesim.Op]float64{"*": o.errorRate}
	}
	if err := srv.SetFaults(faults); err != nil {
		return err
	}
	addr, err := srv.Start(o.listen)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, addr)
	logger.Info("bce-sim serving", "addr", addr, "accessKeys", len(creds), "gatewayTokens", len(o.gatewayTokens), "pageSize", o.pageSize,
		"rateLimits", o.rateLimits, "subnets", len(o.subnets), "instances", len(o.instances)+o.bulkInstances)
	<-ctx.Done()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	logger.Info("bce-sim shutting down")
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

func newLogger(level, format string, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

func (o *options) credentialMap() (map[string]string, error) {
	m := map[string]string{}
	for _, c := range o.credentials {
		ak, sk, ok := strings.Cut(c, ":")
		if !ok || ak == "" || sk == "" {
			return nil, fmt.Errorf("--credential must be AK:SK with both parts non-empty")
		}
		m[ak] = sk
	}
	if o.credentialsDir != "" {
		read := func(name string) (string, error) {
			b, err := os.ReadFile(filepath.Join(o.credentialsDir, name))
			return strings.TrimSpace(string(b)), err
		}
		ak, err := read("access-key-id")
		if err != nil {
			return nil, err
		}
		sk, err := read("secret-access-key")
		if err != nil {
			return nil, err
		}
		m[ak] = sk
	}
	if len(m) == 0 && len(o.gatewayTokens) == 0 {
		return nil, errors.New("no credentials: give --credential AK:SK, --credentials-dir or --gateway-token")
	}
	return m, nil
}

func (o *options) applyRateOverrides(srv *bcesim.Server) error {
	m := map[bcesim.Op]bcesim.RateLimit{}
	for _, s := range o.rateOverrides {
		op, spec, ok1 := strings.Cut(s, "=")
		qps, burst, ok2 := strings.Cut(spec, ":")
		q, err1 := strconv.ParseFloat(qps, 64)
		b, err2 := strconv.ParseInt(burst, 10, 64)
		if !ok1 || !ok2 || err1 != nil || err2 != nil {
			return fmt.Errorf("--rate-limit %q: want OP=QPS:BURST", s)
		}
		m[bcesim.Op(op)] = bcesim.RateLimit{QPS: q, Burst: b}
	}
	return srv.SetRateLimits(m)
}

func (o *options) populate(srv *bcesim.Server) error {
	if _, err := srv.AddSecurityGroup(bcesim.SecurityGroupSpec{ID: o.securityGroup, Name: o.securityGroup, VPCID: o.vpc}); err != nil {
		return fmt.Errorf("security group: %w", err)
	}
	for _, s := range o.subnets {
		f := strings.Split(s, ",")
		if len(f) != 3 {
			return fmt.Errorf("--subnet %q: want ID,ZONE,CIDR", s)
		}
		if _, err := srv.AddSubnet(bcesim.SubnetSpec{ID: f[0], ZoneName: f[1], CIDR: f[2], VPCID: o.vpc}); err != nil {
			return fmt.Errorf("--subnet %q: %w", s, err)
		}
	}
	add := func(id, subnet string, cpu, mem int) error {
		_, err := srv.AddInstance(bcesim.InstanceSpec{ID: id, SubnetID: subnet, CPUCount: cpu, MemoryGB: mem,
			SecurityGroupIDs: []string{o.securityGroup}})
		return err
	}
	for _, s := range o.instances {
		f := strings.Split(s, ",")
		if len(f) != 4 {
			return fmt.Errorf("--instance %q: want ID,SUBNET,CPUS,MEMORY_GB", s)
		}
		cpu, err1 := strconv.Atoi(f[2])
		mem, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil {
			return fmt.Errorf("--instance %q: CPUS and MEMORY_GB must be integers", s)
		}
		if err := add(f[0], f[1], cpu, mem); err != nil {
			return fmt.Errorf("--instance %q: %w", s, err)
		}
	}
	for i := range o.bulkInstances {
		if err := add(fmt.Sprintf("i-sim-%d", i), o.bulkSubnet, o.bulkCPU, o.bulkMemGB); err != nil {
			return fmt.Errorf("--instances: instance %d: %w", i, err)
		}
	}
	return nil
}
