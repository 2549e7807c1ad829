// Command kubelet-sim plays the kubelets and the CNI plugin of many simulated
// CCE BCC nodes against a real API server, a bce-sim process and a cce-ipam
// CNI endpoint (see package e2e/kubeletsim).
//
//	kubelet-sim --kubeconfig /tmp/kubeconfig --cni-endpoint 127.0.0.1:9997 \
//	    --bce-endpoint 127.0.0.1:8080 --bce-access-key-id AK --bce-secret-access-key SK \
//	    --cluster-id cce-demo --vpc-id vpc-sim --subnet-id sbn-a --zone cn-bj-a \
//	    --security-group g-sim --nodes 100 --node-prefix sim
//
// It registers the nodes (instances through bce-sim's admin API, ENIs through
// the BCE API), then binds and runs pods until SIGINT/SIGTERM.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/e2e/kubeletsim"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "kubelet-sim:", err)
		os.Exit(2)
	}
}

type options struct {
	kubeconfig, adminURL, nodePrefix, metricsListen, logLevel, logFormat string
	nodes, nodeStart                                                     int
	statsPeriod                                                          time.Duration
	qps                                                                  float32
	burst                                                                int
	sim                                                                  kubeletsim.Config
	cloud                                                                cloud.Config
}

func (o *options) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster; empty means in-cluster config")
	fs.Float32Var(&o.qps, "kube-api-qps", 500, "API server requests per second of all simulated kubelets together")
	fs.IntVar(&o.burst, "kube-api-burst", 1000, "API server request burst")
	fs.StringVar(&o.adminURL, "bce-admin-url", "", "bce-sim admin API base URL for creating instances; default http://<bce-endpoint>")
	fs.IntVar(&o.nodes, "nodes", 10, "number of simulated nodes to register (existing ones are kept)")
	fs.IntVar(&o.nodeStart, "node-start", 0, "index of the first node name, to add nodes to an earlier run")
	fs.StringVar(&o.nodePrefix, "node-prefix", "sim", "node names are <prefix>-NNNNN; instances i-<node>")
	fs.StringVar(&o.metricsListen, "metrics-listen", "", "address of /metrics (e.g. 127.0.0.1:9100); empty disables")
	fs.DurationVar(&o.statsPeriod, "stats-period", 10*time.Second, "how often a stats line is logged; 0 disables")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "json", "json or text")
	o.sim.RegisterFlags(fs)
	// Simulated node agents together call far more than one IPAM replica.
	o.cloud.Rate, o.cloud.Burst = 200, 50
	o.cloud.RegisterFlags(fs)
}

func newLogger(level, format string, w io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want json or text", format)
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	var o options
	fs := pflag.NewFlagSet("kubelet-sim", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	o.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := newLogger(o.logLevel, o.logFormat, stderr)
	if err != nil {
		return err
	}
	if err := o.validate(); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	deps, closeDeps, err := o.deps(log, reg)
	if err != nil {
		return err
	}
	defer closeDeps()
	sim, err := kubeletsim.New(o.sim, deps, log, reg)
	if err != nil {
		return err
	}

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return sim.Run(ctx) })
	if o.metricsListen != "" {
		if err := serveMetrics(ctx, g, o.metricsListen, reg, log); err != nil {
			return err
		}
	}
	if o.nodes > 0 {
		g.Go(func() error {
			start := time.Now()
			infos, err := sim.RegisterNodes(ctx, kubeletsim.NodeNames(o.nodePrefix, o.nodeStart, o.nodes))
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("register nodes: %w", err)
			}
			log.Info("nodes registered", "new", len(infos), "requested", o.nodes, "duration", time.Since(start).String())
			return nil
		})
	}
	if o.statsPeriod > 0 {
		g.Go(func() error {
			t := time.NewTicker(o.statsPeriod)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-t.C:
					logStats(log, sim.Stats())
				}
			}
		})
	}
	err = g.Wait()
	logStats(log, sim.Stats())
	return err
}

// validate reports options that cannot work together.
func (o options) validate() error {
	switch {
	case o.sim.CNIEndpoint == "" && len(o.sim.CNIEndpoints) == 0:
		return errors.New("--cni-endpoint or --cni-endpoints is required")
	case o.nodes < 0 || o.nodeStart < 0:
		return errors.New("--nodes and --node-start must not be negative")
	}
	return o.sim.Validate()
}

// deps connects to the API server and, when nodes are registered, to the
// cloud (instances through bce-sim's admin API, ENIs through the BCE API).
// The returned func closes what was opened.
func (o options) deps(log *slog.Logger, reg prometheus.Registerer) (kubeletsim.Deps, func(), error) {
	none := func() {}
	restCfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: o.kubeconfig}, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return kubeletsim.Deps{}, none, fmt.Errorf("kubeconfig: %w", err)
	}
	restCfg.QPS, restCfg.Burst, restCfg.UserAgent = o.qps, o.burst, "kubelet-sim"
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return kubeletsim.Deps{}, none, err
	}
	cceCS, err := cceclient.NewForConfig(restCfg)
	if err != nil {
		return kubeletsim.Deps{}, none, err
	}
	deps := kubeletsim.Deps{Kube: kube, CCE: cceCS}
	if o.nodes == 0 {
		return deps, none, nil
	}
	if o.cloud.Endpoint == "" {
		return kubeletsim.Deps{}, none, errors.New("--bce-endpoint is required to register nodes")
	}
	client, err := cloud.New(o.cloud, log.With("component", "cloud"), reg)
	if err != nil {
		return kubeletsim.Deps{}, none, err
	}
	admin := o.adminURL
	if admin == "" {
		admin = o.cloud.Endpoint
		if !strings.Contains(admin, "://") {
			admin = "http://" + admin
		}
	}
	deps.Instances, deps.ENIs = kubeletsim.AdminInstances(admin, &http.Client{Timeout: 30 * time.Second}), client
	return deps, client.Close, nil
}

// serveMetrics serves /metrics on addr in g until ctx ends.
func serveMetrics(ctx context.Context, g *errgroup.Group, addr string, reg *prometheus.Registry, log *slog.Logger) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--metrics-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	g.Go(func() error {
		if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		return srv.Close()
	})
	log.Info("serving metrics", "addr", lis.Addr().String())
	return nil
}

func logStats(log *slog.Logger, s kubeletsim.Stats) {
	log.Info("stats", "binds", s.Binds, "bind_errors", s.BindErrors, "allocations", s.Allocations,
		"allocation_errors", s.AllocationErrors, "releases", s.Releases, "release_errors", s.ReleaseErrors,
		"pods_started", s.PodsStarted, "pods_deleted", s.PodsDeleted, "sandboxes", s.Sandboxes,
		"allocate_p50", s.AllocateLatency.P50.String(), "allocate_p99", s.AllocateLatency.P99.String(),
		"startup_p50", s.StartupLatency.P50.String(), "startup_p99", s.StartupLatency.P99.String())
}
