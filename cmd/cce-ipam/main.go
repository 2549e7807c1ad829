// Command cce-ipam is one replica of the ENI IPAM for Baidu Cloud CCE: it
// serves the CNI gRPC service (rpc.CNIBackend), keeps the warm pools of the
// nodes it serves, and records assignments as WorkloadEndpoints.
//
// Until the shard layer lands, a replica serves every BCC node of the
// cluster and runs the Subnet controller; run one replica.
//
//	cce-ipam --kubeconfig ~/.kube/config --cluster-id cce-abc --vpc-id vpc-1 \
//	    --bce-endpoint 127.0.0.1:8080 --bce-region bj --bce-credentials-dir /etc/bce
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/ipamcore/cni"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
	"github.com/cce-ipam/sharded/ipamcore/subnet"
)

type options struct {
	kubeconfig    string
	grpcListen    string
	metricsListen string
	logLevel      string
	cloud         cloud.Config
	ipam          ipam.Config
	cni           cni.Config
	subnet        subnet.Config
}

func main() {
	var o options
	fs := pflag.NewFlagSet("cce-ipam", pflag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster config")
	fs.StringVar(&o.grpcListen, "grpc-listen", ":9997", "address of the CNI gRPC service (rpc.CNIBackend)")
	fs.StringVar(&o.metricsListen, "metrics-listen", ":9998", "address of /metrics, /healthz and /readyz")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	o.cloud.RegisterFlags(fs)
	o.ipam.RegisterFlags(fs)
	o.cni.RegisterFlags(fs)
	o.subnet.RegisterFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return
		}
		os.Exit(2)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "cce-ipam: --log-level: %v\n", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.Error("cce-ipam stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, log *slog.Logger) error {
	for _, v := range []interface{ Validate() error }{&o.cloud, o.ipam, &o.cni, o.subnet} {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	restCfg, err := kubeConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	provider, err := cloud.New(o.cloud, log.With("component", "cloud"), reg)
	if err != nil {
		return err
	}
	defer provider.Close()
	cceClient := cceclient.NewForConfigOrDie(restCfg)
	core, err := ipam.New(o.ipam, ipam.Deps{
		Kube:  kubernetes.NewForConfigOrDie(restCfg),
		CCE:   cceClient,
		Cloud: provider,
	}, log.With("component", "ipam"), reg)
	if err != nil {
		return err
	}

	grpcLis, err := net.Listen("tcp", o.grpcListen)
	if err != nil {
		return fmt.Errorf("listen for gRPC: %w", err)
	}
	metricsLis, err := net.Listen("tcp", o.metricsListen)
	if err != nil {
		return fmt.Errorf("listen for metrics: %w", err)
	}
	gs := grpc.NewServer()
	rpc.RegisterCNIBackendServer(gs, cni.NewServer(o.cni, core, log.With("component", "cni"), reg))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-core.Ready():
			_, _ = w.Write([]byte("ok"))
		default:
			http.Error(w, "caches not synced", http.StatusServiceUnavailable)
		}
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Info("cce-ipam starting", "grpc", grpcLis.Addr().String(), "metrics", metricsLis.Addr().String())

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return core.Run(ctx) })
	g.Go(func() error { return core.ServeAllNodes(ctx) })
	g.Go(func() error {
		return subnet.NewController(o.subnet, cceClient, provider, log.With("component", "subnet"), reg).Run(ctx)
	})
	g.Go(func() error { return gs.Serve(grpcLis) })
	g.Go(func() error {
		if err := hs.Serve(metricsLis); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		gs.GracefulStop()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return hs.Shutdown(shutdownCtx)
	})
	return g.Wait()
}

func kubeConfig(path string) (*rest.Config, error) {
	if path == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", path)
}
