// Command cce-ipam is one replica of the sharded ENI IPAM for Baidu Cloud
// CCE. Replicas find each other with memberlist, hash the nodes into
// partitions, and each serves the CNI gRPC service (rpc.CNIBackend) for the
// nodes of the partitions it holds, forwarding other calls to their owner.
// Ownership is fenced by Leases in the API server (see shard/DESIGN.md).
//
//	cce-ipam --kubeconfig ~/.kube/config --cluster-id cce-abc --vpc-id vpc-1 \
//	    --bce-endpoint 127.0.0.1:8080 --bce-region bj --bce-credentials-dir /etc/bce \
//	    --memberlist-join-dns cce-ipam-members.kube-system.svc --memberlist-gossip-key-file /etc/gossip/key
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	"github.com/cce-ipam/sharded/membership"
	"github.com/cce-ipam/sharded/shard"
)

// version is stamped at build time (-ldflags "-X main.version=...").
var version = "dev"

type options struct {
	kubeconfig    string
	grpcListen    string
	metricsListen string
	logLevel      string
	profiling     bool
	kubeQPS       float32
	kubeBurst     int
	watchQPS      float32
	watchBurst    int
	cloud         cloud.Config
	ipam          ipam.Config
	cni           cni.Config
	subnet        subnet.Config
	members       membership.Config
	leader        membership.LeaderConfig
	shard         shard.Config
}

func main() {
	var o options
	fs := pflag.NewFlagSet("cce-ipam", pflag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster config")
	fs.StringVar(&o.grpcListen, "grpc-listen", ":9997", "address of the CNI gRPC service (rpc.CNIBackend), also used by other replicas to forward calls")
	fs.StringVar(&o.metricsListen, "metrics-listen", ":9998", "address of /metrics, /healthz, /readyz and /shard/status")
	fs.BoolVar(&o.profiling, "enable-profiling", false, "serve Go's /debug/pprof/ on the metrics address (heap and CPU profiles; do not expose that address outside the cluster)")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.Float32Var(&o.kubeQPS, "kube-api-qps", 50, "queries per second to the API server (client-side limit; lease renewals have their own)")
	fs.IntVar(&o.kubeBurst, "kube-api-burst", 100, "burst of queries to the API server")
	fs.Float32Var(&o.watchQPS, "kube-watch-qps", 100, "queries per second for the served nodes' pod watches (one per node, started on a takeover; a client of their own so that they do not delay CNI calls)")
	fs.IntVar(&o.watchBurst, "kube-watch-burst", 200, "burst of the served nodes' watch requests")
	o.cloud.RegisterFlags(fs)
	o.ipam.RegisterFlags(fs)
	o.cni.RegisterFlags(fs)
	o.subnet.RegisterFlags(fs)
	o.members.RegisterFlags(fs)
	o.leader.RegisterFlags(fs)
	o.shard.RegisterFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return
		}
		os.Exit(2)
	}
	if !fs.Changed("leader-elect-lease-namespace") {
		o.leader.Namespace = "" // follow --namespace
	}
	if !fs.Changed("memberlist-name-prefix") && os.Getenv("POD_NAME") != "" {
		o.members.NamePrefix = os.Getenv("POD_NAME")
	}
	if !fs.Changed("memberlist-advertise-addr") && os.Getenv("POD_IP") != "" {
		o.members.AdvertiseAddr = os.Getenv("POD_IP")
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

func run(sigCtx context.Context, o options, log *slog.Logger) error {
	start := time.Now()
	for _, v := range []interface{ Validate() error }{&o.cloud, o.ipam, &o.cni, o.subnet, o.shard} {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	o.shard = o.shard.WithDefaults() // the leader Lease follows its namespace
	if o.leader.Namespace == "" {
		o.leader.Namespace = o.shard.Namespace
	}
	restCfg, err := kubeConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	restCfg.WarningHandler = &warnOnce{log: log}
	grpcLis, err := net.Listen("tcp", o.grpcListen)
	if err != nil {
		return fmt.Errorf("listen for gRPC: %w", err)
	}
	metricsLis, err := net.Listen("tcp", o.metricsListen)
	if err != nil {
		return fmt.Errorf("listen for metrics: %w", err)
	}
	addrs := shard.Addresses{
		GRPC: advertised(grpcLis.Addr(), o.members.AdvertiseAddr),
		HTTP: advertised(metricsLis.Addr(), o.members.AdvertiseAddr),
	}
	if o.members.GRPCAddr == "" {
		o.members.GRPCAddr = addrs.GRPC
	} else {
		addrs.GRPC = o.members.GRPCAddr
	}
	o.members.NamePrefix = strings.ToLower(o.members.NamePrefix)
	o.members.Version = version

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	provider, err := cloud.New(o.cloud, log.With("component", "cloud"), reg)
	if err != nil {
		return err
	}
	defer provider.Close()
	members, err := membership.New(o.members, start, log.With("component", "membership"), reg)
	if err != nil {
		return err
	}
	self := members.Name()
	log = log.With("member", self)
	restCfg.QPS, restCfg.Burst = o.kubeQPS, o.kubeBurst
	restCfg.UserAgent = "cce-ipam/" + version
	kube := kubernetes.NewForConfigOrDie(restCfg)
	cceClient := cceclient.NewForConfigOrDie(restCfg)
	// Lease renewals and claims get a client (rate limit and connection) of
	// their own, so that a busy IPAM cannot starve the fence of its renewals.
	leaseCfg := ownConnection(restCfg)
	leaseCfg.QPS, leaseCfg.Burst = 100, 300
	leaseKube := kubernetes.NewForConfigOrDie(leaseCfg)
	// A claim's dry-run fencing probes (shard.Deps.FenceProbe) as well: a
	// cold start's 271 must not queue behind, or delay, CNI calls.
	probeCfg := ownConnection(restCfg)
	probeCfg.QPS, probeCfg.Burst = 100, 300
	probeCCE := cceclient.NewForConfigOrDie(probeCfg)
	watchCfg := ownConnection(restCfg)
	watchCfg.QPS, watchCfg.Burst = o.watchQPS, o.watchBurst
	// Pods travel as protobuf (smaller and cheaper to decode).
	watchCfg.ContentType = "application/vnd.kubernetes.protobuf"
	watchCfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	// No gzip: every per-node pod watch would hold a decompressor (~30 KiB)
	// for a trickle of events. Measured at 300 nodes, 1 replica: Go heap in
	// use 87 → 64 MiB, peak RSS 151 → 132 MiB (bench, scale item).
	watchCfg.DisableCompression = true

	var elector *membership.Elector
	leader := func() bool { return elector != nil && elector.IsLeader() }
	core, err := ipam.New(o.ipam, ipam.Deps{Kube: kube, CCE: cceClient, Cloud: provider, IsLeader: leader,
		WatchKube: kubernetes.NewForConfigOrDie(watchCfg)},
		log.With("component", "ipam"), reg)
	if err != nil {
		return err
	}
	coord, err := shard.New(o.shard, self, addrs, shard.Deps{
		Kube: leaseKube, Nodes: core, NodeInformer: core.NodeInformer(),
		Budget: provider, GlobalRate: o.cloud.Rate, GlobalBurst: o.cloud.Burst,
		Gossip: func() []string {
			var names []string
			for _, m := range members.Members() {
				names = append(names, m.Name)
			}
			return names
		},
		FenceProbe: func(ctx context.Context, tok ipam.FenceToken) (bool, error) {
			return ipam.ProbeFence(ctx, probeCCE, time.Now(), o.shard.Namespace, "cce-ipam-fence-probe", tok)
		},
	}, log.With("component", "shard"), reg)
	if err != nil {
		return err
	}
	defer coord.Close() // after the gRPC server has drained (deferred last-in, first-out)
	core.SetFence(coord)
	provider.SetGate(coord.Gate)

	var leaderName atomic.Value // string
	leaderName.Store("")
	subnets := subnet.NewController(o.subnet, cceClient, provider, log.With("component", "subnet"), reg)
	elector, err = membership.NewElector(o.leader, kube, self, membership.LeaderCallbacks{
		// The singletons: the Subnet controller (and, through IsLeader,
		// the sweep of IPPools of deleted nodes).
		OnStartedLeading: func(ctx context.Context) {
			if err := subnets.Run(ctx); err != nil && ctx.Err() == nil {
				log.Error("subnet controller stopped", "err", err)
			}
		},
		OnNewLeader: func(id string) { leaderName.Store(id) },
	}, log.With("component", "leader"), reg)
	if err != nil {
		return err
	}

	keyFile := o.shard.ForwardKeyFile
	if keyFile == "" {
		keyFile = o.members.GossipKeyFile
	}
	var key []byte
	if keyFile != "" {
		if key, err = membership.LoadGossipKey(keyFile); err != nil {
			return fmt.Errorf("forward key: %w", err)
		}
	} else {
		log.Warn("no forward key (--shard-forward-key-file or --memberlist-gossip-key-file): calls forwarded between replicas are NOT authenticated")
	}
	router := shard.NewRouter(shard.RouterDeps{
		Self:      self,
		Routes:    coord.Fence(),
		Local:     core,
		Locator:   core,
		Auth:      shard.NewAuthenticator(key),
		OwnerWait: o.shard.OwnerWait,
	}, log.With("component", "router"), reg)
	core.SetFixedIPMover(router)
	defer router.Close()

	gs := grpc.NewServer(grpc.UnaryInterceptor(router.UnaryInterceptor))
	rpc.RegisterCNIBackendServer(gs, cni.NewServer(o.cni, router, log.With("component", "cni"), reg))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(core, members, coord); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if detail := coord.FencingPolicy(); detail != "" {
			// Ready, but fenced by this replica's clock only.
			_, _ = w.Write([]byte("ok; WARNING: " + detail))
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	if o.profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("/shard/", coord.StatusHandler(func() (string, bool) { return leaderName.Load().(string), elector.IsLeader() },
		func(node string) (any, error) { return core.Stats(node) }))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Info("cce-ipam starting", "version", version, "grpc", grpcLis.Addr().String(), "metrics", metricsLis.Addr().String(),
		"advertise", addrs, "namespace", o.shard.Namespace)

	// Everything but the coordinator runs until the coordinator has handed
	// its nodes over: a leaving replica keeps forwarding CNI calls meanwhile.
	baseCtx, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	g, gctx := errgroup.WithContext(baseCtx)
	coordCtx, cancelCoord := context.WithCancel(sigCtx)
	defer cancelCoord()
	stopCoord := context.AfterFunc(gctx, cancelCoord)
	defer stopCoord()

	g.Go(func() error { return core.Run(gctx) })
	g.Go(func() error { return members.Run(gctx) })
	g.Go(func() error {
		for ev := range members.Events() {
			log.Debug("membership event", "event", ev.Type.String(), "member", ev.Member.Name)
			coord.Kick()
		}
		return nil
	})
	g.Go(func() error { return elector.Run(gctx) })
	g.Go(func() error {
		err := coord.Run(coordCtx)
		cancelBase()
		return err
	})
	g.Go(func() error { return gs.Serve(grpcLis) })
	g.Go(func() error {
		if err := hs.Serve(metricsLis); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		gs.GracefulStop()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return hs.Shutdown(shutdownCtx)
	})
	return g.Wait()
}

// ready: caches synced, gossip up, lease held and every owned node built.
func ready(core *ipam.IPAM, members *membership.Membership, coord *shard.Coordinator) error {
	select {
	case <-core.Ready():
	default:
		return errors.New("caches not synced")
	}
	select {
	case <-members.Started():
	default:
		return errors.New("gossip not started")
	}
	return coord.Ready()
}

// advertised is the address peers reach a listener at: the listener's host
// unless it is unspecified, then the advertise IP (the pod IP), else the
// first private address of this host.
func advertised(a net.Addr, advertiseIP string) string {
	tcp := a.(*net.TCPAddr)
	host := tcp.IP.String()
	if tcp.IP.IsUnspecified() {
		host = advertiseIP
		if host == "" {
			host = firstPrivateIP()
		}
	}
	return net.JoinHostPort(host, strconv.Itoa(tcp.Port))
}

func firstPrivateIP() string {
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.IsPrivate() {
				return ipn.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

// ownConnection returns a copy of cfg whose clients dial a connection of
// their own. client-go shares one transport, so one HTTP/2 connection, among
// all configs with the same TLS settings: without this, lease renewals would
// queue behind bulk LISTs and hundreds of watch streams on one connection.
func ownConnection(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	return c
}

// warnOnce logs each distinct API server warning once, in the JSON log: the
// server repeats a warning on every request it applies to (the upstream's
// finalizer name on every WorkloadEndpoint create), which client-go's
// default handler writes to klog each time.
type warnOnce struct {
	log  *slog.Logger
	mu   sync.Mutex
	seen map[string]bool
}

// warnOnceMax bounds the distinct warnings remembered; past it each is
// logged every time rather than the memory growing.
const warnOnceMax = 256

func (w *warnOnce) HandleWarningHeader(code int, agent, text string) {
	if code != 299 || text == "" {
		return
	}
	w.mu.Lock()
	if w.seen == nil {
		w.seen = map[string]bool{}
	}
	dup := w.seen[text]
	if !dup && len(w.seen) < warnOnceMax {
		w.seen[text] = true
	}
	w.mu.Unlock()
	if !dup {
		w.log.Warn("kube-apiserver warning (logged once)", "warning", text, "agent", agent)
	}
}

func kubeConfig(path string) (*rest.Config, error) {
	if path == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", path)
}
