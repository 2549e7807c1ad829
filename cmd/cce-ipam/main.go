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
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/ipamcore/cni"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/ipclaim"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
	"github.com/cce-ipam/sharded/ipamcore/spread"
	"github.com/cce-ipam/sharded/ipamcore/subnet"
	"github.com/cce-ipam/sharded/ipamcore/webhook"
	"github.com/cce-ipam/sharded/membership"
	"github.com/cce-ipam/sharded/operator"
	"github.com/cce-ipam/sharded/shard"
)

// version is stamped at build time (-ldflags "-X main.version=...").
var version = "dev"

type options struct {
	kubeconfig    string
	grpcListen    string
	metricsListen string
	logLevel      string
	logFormat     string
	showVersion   bool
	profiling     bool
	kubeQPS       float32
	kubeBurst     int
	watchQPS      float32
	watchBurst    int
	cloud         cloud.Config
	ipam          ipam.Config
	cni           cni.Config
	subnet        subnet.Config
	claims        ipclaim.Config
	spread        spread.Config
	members       membership.Config
	leader        membership.LeaderConfig
	shard         shard.Config
	webhook       webhook.Config
	// forwardKey is the forward key read from --memberlist-key-secret.
	forwardKey []byte
}

func (o *options) registerFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster config")
	fs.StringVar(&o.grpcListen, "grpc-listen", ":9997",
		"address of the CNI gRPC service (rpc.CNIBackend), also used by other replicas to forward calls")
	fs.StringVar(&o.metricsListen, "metrics-listen", ":9998", "address of /metrics, /healthz, /readyz and /shard/status")
	fs.BoolVar(&o.profiling, "enable-profiling", false,
		"serve Go's /debug/pprof/ on the metrics address (heap and CPU profiles; do not expose that address outside the cluster)")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", logFormatJSON,
		"log format on stderr: json (one JSON object per line) or text; client-go's logs go through the same handler")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	fs.Float32Var(&o.kubeQPS, "kube-api-qps", 0,
		"client-side ceiling on queries per second to the API server of the CNI path and the pool workers; "+
			"0 or negative: none (the default: the API server's Priority and Fairness protects it, see the chart's "+
			"flowControl values); lease renewals have their own client")
	fs.IntVar(&o.kubeBurst, "kube-api-burst", 100, "burst of queries to the API server, with --kube-api-qps > 0")
	fs.Float32Var(&o.watchQPS, "kube-watch-qps", 0,
		"client-side ceiling on queries per second of the served nodes' pod watches (one per node, started on a "+
			"takeover; a client of their own so that they do not delay CNI calls); 0 or negative: none, "+
			"as --kube-api-qps")
	fs.IntVar(&o.watchBurst, "kube-watch-burst", 200, "burst of the served nodes' watch requests, with --kube-watch-qps > 0")
	o.cloud.RegisterFlags(fs)
	o.ipam.RegisterFlags(fs)
	o.cni.RegisterFlags(fs)
	o.subnet.RegisterFlags(fs)
	o.claims.RegisterFlags(fs)
	o.spread.RegisterFlags(fs)
	o.members.RegisterFlags(fs)
	o.leader.RegisterFlags(fs)
	o.shard.RegisterFlags(fs)
	o.webhook.RegisterFlags(fs)
}

// Validate checks every component's options, once they are complete (the
// advertised addresses are known once the listeners are up).
func (o options) Validate() error {
	return errors.Join(
		o.cloud.Validate(),
		o.ipam.Validate(),
		o.cni.Validate(),
		o.subnet.Validate(),
		o.claims.Validate(),
		o.spread.Validate(),
		o.members.Validate(),
		o.leader.Validate(),
		o.shard.Validate(),
		o.webhook.Validate(),
		o.keysValidate(),
	)
}

func (o options) keysValidate() error {
	if o.members.KeySecret != "" && o.shard.ForwardKeyFile != "" {
		return errors.New("give the forward key by --memberlist-key-secret or --shard-forward-key-file, not both")
	}
	return nil
}

func main() {
	var o options
	fs := pflag.NewFlagSet("cce-ipam", pflag.ContinueOnError)
	o.registerFlags(fs)
	ref := registerRefFlags(fs, &o)
	if err := fs.Parse(refArgs(os.Args[1:])); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return
		}
		os.Exit(2)
	}
	if err := ref.apply(&o, os.Getenv); err != nil {
		fmt.Fprintf(os.Stderr, "cce-ipam: %v\n", err)
		os.Exit(2)
	}
	o.cloud.ClusterID = o.ipam.ClusterID // the CCE gateway's cce-cluster header
	if !fs.Changed("leader-elect-lease-namespace") {
		o.leader.Namespace = o.shard.Namespace // the leader Lease follows --namespace
	}
	o.webhook.Namespace = o.shard.Namespace // the webhook Secret and Service live there too
	if !fs.Changed("memberlist-name-prefix") && os.Getenv("POD_NAME") != "" {
		o.members.NamePrefix = os.Getenv("POD_NAME")
	}
	if !fs.Changed("memberlist-advertise-addr") && os.Getenv("POD_IP") != "" {
		o.members.AdvertiseAddr = os.Getenv("POD_IP")
	}
	o.members.NamePrefix = strings.ToLower(o.members.NamePrefix)
	o.members.Version = version
	if o.showVersion {
		fmt.Println(currentBuild())
		return
	}
	log, err := newLogger(os.Stderr, o.logFormat, o.logLevel)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cce-ipam: %v\n", err)
		os.Exit(2)
	}
	ref.logNotes(log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	r, err := newReplica(o, log)
	if err == nil {
		err = r.Run(ctx)
	}
	if err != nil {
		log.Error("cce-ipam stopped", "err", err)
		os.Exit(1)
	}
}

// replica is one cce-ipam process: its components, built by newReplica in
// the order they depend on each other, run by Run.
type replica struct {
	log        *slog.Logger
	grpcLis    net.Listener
	metricsLis net.Listener
	provider   *cloud.Client
	members    *membership.Membership
	elector    *membership.Elector
	core       *ipam.IPAM
	psts       *pstsParts
	webhook    *webhook.Server // nil unless --webhook-enabled
	coord      *shard.Coordinator
	forwarder  *shard.Forwarder
	auth       *shard.Authenticator // the forward key's: forwarded calls and operator calls
	router     *shard.Router
	grpc       *grpc.Server
	health     *health.Server // grpc.health.v1, following readiness
	http       *http.Server
}

// kubeClients are the API server clients, each with a connection and a
// rate limit of its own where one kind of traffic must not delay another.
type kubeClients struct {
	kube kubernetes.Interface // the IPAM's and the leader election's
	cce  cceclient.Interface
	// lease renews the replica Lease and claims partitions: a busy IPAM
	// cannot starve the fence of its renewals.
	lease kubernetes.Interface
	// probe makes a claim's dry-run fencing probes (shard.Deps.FenceProbe):
	// a cold start's hundreds must not queue behind, or delay, CNI calls.
	probe cceclient.Interface
	// watch runs the served nodes' pod watches.
	watch kubernetes.Interface
	// meta reads object metadata only: the leader's PSTS status controller
	// watches pods through it (their annotations, not their specs), on a
	// connection of its own so that it does not spend the IPAM's rate.
	meta metadata.Interface
}

func newKubeClients(o options, log *slog.Logger, throttled *throttleCounter, retries *admissionRetries) (kubeClients, error) {
	restCfg, err := kubeConfig(o.kubeconfig)
	if err != nil {
		return kubeClients{}, err
	}
	restCfg.WarningHandler = &warnOnce{log: log}
	restCfg.QPS, restCfg.Burst = clientQPS(o.kubeQPS), o.kubeBurst
	restCfg.UserAgent = "cce-ipam/" + version
	leaseCfg := ownConnection(restCfg)
	leaseCfg.QPS, leaseCfg.Burst = 100, 300
	probeCfg := ownConnection(restCfg)
	probeCfg.QPS, probeCfg.Burst = 100, 300
	watchCfg := ownConnection(restCfg)
	watchCfg.QPS, watchCfg.Burst = clientQPS(o.watchQPS), o.watchBurst
	// Pods travel as protobuf (smaller and cheaper to decode).
	watchCfg.ContentType = "application/vnd.kubernetes.protobuf"
	watchCfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	// No gzip: every per-node pod watch would hold a decompressor for a
	// trickle of events (shard/DESIGN.md, "Process wiring").
	watchCfg.DisableCompression = true
	metaCfg := ownConnection(restCfg)
	metaCfg.QPS, metaCfg.Burst = clientQPS(o.watchQPS), o.watchBurst
	// Wrapped after the copies, so that each counts under its own name.
	throttled.wrap(restCfg, "main")
	throttled.wrap(leaseCfg, "lease")
	throttled.wrap(probeCfg, "probe")
	throttled.wrap(watchCfg, "watch")
	throttled.wrap(metaCfg, "metadata")
	// The wep writes (the fencing policy's) go through the main client. The
	// fence probes keep the API server's first answer: they read it.
	retries.wrap(restCfg, "main")
	return kubeClients{
		meta:  metadata.NewForConfigOrDie(metaCfg),
		kube:  kubernetes.NewForConfigOrDie(restCfg),
		cce:   cceclient.NewForConfigOrDie(restCfg),
		lease: kubernetes.NewForConfigOrDie(leaseCfg),
		probe: cceclient.NewForConfigOrDie(probeCfg),
		watch: kubernetes.NewForConfigOrDie(watchCfg),
	}, nil
}

// clientQPS maps a --kube-*-qps value to client-go's: a negative QPS builds
// no client-side limiter at all (rest.RESTClientForConfigAndClient), while 0
// would mean client-go's default of 5/s, so 0 means "none" here too.
func clientQPS(qps float32) float32 {
	if qps <= 0 {
		return -1
	}
	return qps
}

// newReplica builds the components in dependency order: gossip (which names
// the replica) first, then the fence, the cloud client (gated by it), the
// leader election (and the Subnet controller it runs), the IPAM (fenced by
// it), the coordinator (which publishes the fence and drives the IPAM), the
// router, the servers.
func newReplica(o options, log *slog.Logger) (_ *replica, err error) {
	start := time.Now()
	r := &replica{log: log}
	defer func() {
		if err != nil {
			r.closeEarly()
		}
	}()
	addrs, err := r.listen(&o)
	if err != nil {
		return nil, err
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	kubeAPI, hooked := processKubeAPIMetrics()
	reg.MustRegister(kubeAPI.collectors()...)
	if !hooked {
		log.Warn("client-go's metrics hooks were set elsewhere in the process; cce_ipam_kube_api_* stay empty")
	}
	clients, err := newKubeClients(o, log, newThrottleCounter(reg), newAdmissionRetries(reg, log))
	if err != nil {
		return nil, err
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerBuildInfo(reg, currentBuild())
	if o.members.KeySecret != "" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		keys, err := membership.EnsureKeySecret(ctx, clients.kube.CoreV1().Secrets(o.shard.Namespace), o.members.KeySecret)
		cancel()
		if err != nil {
			return nil, err
		}
		o.members.GossipKey, o.forwardKey = keys.Gossip, keys.Forward
	}
	if r.members, err = membership.New(o.members, start, log.With("component", "membership"), reg); err != nil {
		return nil, err
	}
	self := r.members.Name()
	r.log = log.With("member", self)
	// The fence first: the cloud client asks its gate before every attempt.
	fence := shard.NewFence(o.shard, self, clock.RealClock{})
	if r.provider, err = cloud.New(o.cloud, log.With("component", "cloud"), reg, cloud.WithGate(fence.Gate),
		cloud.WithSecretGetter(secretGetter(clients.kube))); err != nil {
		return nil, err
	}
	if r.psts, err = newPSTSParts(o, clients, r.log, reg); err != nil {
		return nil, err
	}
	if r.webhook, err = newWebhook(o, clients, r.provider, r.log, reg); err != nil {
		return nil, err
	}
	leaderName, err := r.newElector(o, clients, self, reg)
	if err != nil {
		return nil, err
	}
	if err := r.newShard(o, clients, self, addrs, fence, reg); err != nil {
		return nil, err
	}
	r.newServers(o, clients, leaderName, reg)
	r.log.Info("cce-ipam starting", "version", version, "grpc", r.grpcLis.Addr().String(),
		"metrics", r.metricsLis.Addr().String(), "advertise", addrs, "namespace", o.shard.Namespace)
	return r, nil
}

// listen opens the gRPC and metrics listeners and completes the addresses
// other replicas reach this one at.
func (r *replica) listen(o *options) (shard.Addresses, error) {
	var err error
	if r.grpcLis, err = net.Listen("tcp", o.grpcListen); err != nil {
		return shard.Addresses{}, fmt.Errorf("listen for gRPC: %w", err)
	}
	if r.metricsLis, err = net.Listen("tcp", o.metricsListen); err != nil {
		return shard.Addresses{}, fmt.Errorf("listen for metrics: %w", err)
	}
	addrs := shard.Addresses{
		GRPC: advertised(r.grpcLis.Addr(), o.members.AdvertiseAddr),
		HTTP: advertised(r.metricsLis.Addr(), o.members.AdvertiseAddr),
	}
	if o.members.GRPCAddr == "" {
		o.members.GRPCAddr = addrs.GRPC
	} else {
		addrs.GRPC = o.members.GRPCAddr
	}
	return addrs, nil
}

// newElector builds the leader election, which runs the singletons: the
// Subnet controller, the PSTS and PSTT controllers, the IPClaim keeper (and,
// through IsLeader, the IPAM's sweep of the IPPools of deleted nodes). It
// returns the current leader's name as it changes.
func (r *replica) newElector(o options, clients kubeClients, self string, reg prometheus.Registerer) (*atomic.Value, error) {
	leaderName := &atomic.Value{} // string
	leaderName.Store("")
	subnets := subnet.NewController(o.subnet, clients.cce, r.provider, r.log.With("component", "subnet"), reg,
		subnet.WithEvents(clients.kube))
	spreads, err := spread.New(o.spread, spread.Deps{Kube: clients.kube, CCE: clients.cce, Metadata: clients.meta},
		r.log.With("component", "spread"), reg)
	if err != nil {
		return nil, err
	}
	r.elector, err = membership.NewElector(o.leader, clients.kube, self, membership.LeaderCallbacks{
		OnStartedLeading: func(ctx context.Context) {
			var wg sync.WaitGroup
			wg.Go(func() { r.psts.lead(ctx, r.log) })
			wg.Go(func() {
				if err := spreads.Run(ctx); err != nil && ctx.Err() == nil {
					r.log.Error("PSTS controllers stopped", "err", err)
				}
			})
			if err := subnets.Run(ctx); err != nil && ctx.Err() == nil {
				r.log.Error("subnet controller stopped", "err", err)
			}
			wg.Wait()
		},
		OnNewLeader: func(id string) { leaderName.Store(id) },
	}, r.log.With("component", "leader"), reg)
	return leaderName, err
}

// newShard builds, in dependency order, the forwarder that reaches other
// replicas through the fence's routing table, the IPAM the fence fences
// (it moves fixed IPs through the forwarder), the coordinator that publishes
// the fence, and the router in front of the IPAM.
func (r *replica) newShard(o options, clients kubeClients, self string, addrs shard.Addresses, fence *shard.Fence,
	reg prometheus.Registerer) error {
	key, err := forwardKey(o, r.log)
	if err != nil {
		return err
	}
	r.auth = shard.NewAuthenticator(key)
	r.forwarder = shard.NewForwarder(shard.ForwarderDeps{
		Self:      self,
		Routes:    fence,
		Auth:      r.auth,
		OwnerWait: o.shard.OwnerWait,
	}, r.log.With("component", "router"), reg)
	r.core, err = ipam.New(o.ipam, ipam.Deps{
		Kube:         clients.kube,
		CCE:          clients.cce,
		Cloud:        r.provider,
		Fence:        fence,
		FixedIPMover: r.forwarder,
		Claims:       r.psts.ledger,
		IsLeader:     r.elector.IsLeader,
		WatchKube:    clients.watch,
	}, r.log.With("component", "ipam"), reg)
	if err != nil {
		return err
	}
	members := r.members
	r.coord, err = shard.New(o.shard, self, addrs, shard.Deps{
		Kube:         clients.lease,
		Nodes:        r.core,
		NodeInformer: r.core.NodeInformer(),
		Fence:        fence,
		Clock:        clock.RealClock{},
		Budget:       r.provider,
		GlobalRate:   o.cloud.Rate,
		GlobalBurst:  o.cloud.Burst,
		Gossip: func() []string {
			var names []string
			for _, m := range members.Members() {
				names = append(names, m.Name)
			}
			return names
		},
		GossipAddr: members.LocalAddr, // "" until memberlist listens
		FenceProbe: func(ctx context.Context, tok ipam.FenceToken) (bool, error) {
			return ipam.ProbeFence(ctx, clients.probe, time.Now(), o.shard.Namespace, "cce-ipam-fence-probe", tok)
		},
	}, r.log.With("component", "shard"), reg)
	if err != nil {
		return err
	}
	members.SetSeedSource(fence.GossipSeeds) // join through the replica Leases too
	r.router = shard.NewRouter(shard.RouterDeps{
		Forwarder: r.forwarder,
		Local:     r.core,
		Locator:   r.core,
	}, r.log.With("component", "router"))
	return nil
}

// secretGetter reads the CCE gateway's token Secret for the cloud client.
func secretGetter(kube kubernetes.Interface) cloud.SecretGetter {
	return func(ctx context.Context, namespace, name string) (map[string][]byte, error) {
		s, err := kube.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w: %w", cloud.ErrSecretNotFound, err)
		}
		if err != nil {
			return nil, err
		}
		return s.Data, nil
	}
}

// forwardKey loads the key that authenticates forwarded calls: the forward
// key file. Without one, for deployments from before the separate key (a
// gossip-key Secret of one's own without a forward key, a hand-run fleet),
// it falls back to a key derived from the gossip key, with a warning: not
// the gossip key's bytes themselves (the AES key never doubles as an HMAC
// key), but whoever holds the gossip key can derive it. With neither, none.
func forwardKey(o options, log *slog.Logger) ([]byte, error) {
	if o.forwardKey != nil {
		return o.forwardKey, nil // from --memberlist-key-secret
	}
	if o.shard.ForwardKeyFile != "" {
		key, err := membership.LoadGossipKey(o.shard.ForwardKeyFile)
		if err != nil {
			return nil, fmt.Errorf("forward key: %w", err)
		}
		return key, nil
	}
	if o.members.GossipKeyFile == "" {
		log.Warn("no forward key (--shard-forward-key-file or --memberlist-gossip-key-file): " +
			"calls forwarded between replicas are NOT authenticated")
		return nil, nil
	}
	gossip, err := membership.LoadGossipKey(o.members.GossipKeyFile)
	if err != nil {
		return nil, fmt.Errorf("forward key from the gossip key: %w", err)
	}
	log.Warn("no --shard-forward-key-file: forwarded calls are signed with a key derived from the gossip key; " +
		"give the forward key its own file (the chart's Secret key forward-key)")
	return shard.ForwardKeyFromGossipKey(gossip), nil
}

// newServers builds the CNI gRPC server (behind the router) and the HTTP
// server of /metrics, the probes, /shard/ and the operator calls /admin/
// (which call the same CNI service in-process).
func (r *replica) newServers(o options, clients kubeClients, leaderName *atomic.Value, reg *prometheus.Registry) {
	r.grpc = grpc.NewServer(grpc.UnaryInterceptor(r.router.UnaryInterceptor))
	cniServer := cni.NewServer(o.cni, r.router, r.log.With("component", "cni"), reg, cni.WithForwarded(shard.Forwarded))
	rpc.RegisterCNIBackendServer(r.grpc, cniServer)
	r.health = health.NewServer()
	for _, svc := range healthServices {
		r.health.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING) // until runHealth finds it ready
	}
	healthpb.RegisterHealthServer(r.grpc, r.health)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", r.readyz)
	if o.profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	leader := func() (string, bool) { return leaderName.Load().(string), r.elector.IsLeader() }
	mux.Handle("/shard/", r.coord.StatusHandler(leader, func(node string) (any, error) { return r.core.Stats(node) }))
	mux.Handle("/admin/", operator.NewHandler(operator.Deps{
		Auth: r.auth,
		CNI:  cniServer,
		Kube: clients.kube,
		CCE:  clients.cce,
		Self: r.members.Name(),
	}, r.log.With("component", "operator")))
	r.http = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
	}
}

// newWebhook builds the admission webhooks every replica serves, or nil
// when they are off. They read their own informers (PSTS, Subnets, the
// certificate Secret, the two webhook configurations), started by Run.
func newWebhook(o options, clients kubeClients, provider cloud.Provider, log *slog.Logger,
	reg prometheus.Registerer) (*webhook.Server, error) {
	if !o.webhook.Enabled {
		return nil, nil
	}
	return webhook.New(o.webhook, webhook.Deps{Kube: clients.kube, CCE: clients.cce, Cloud: provider},
		log.With("component", "webhook"), reg)
}

// closeEarly releases what a failed newReplica had already opened.
func (r *replica) closeEarly() {
	for _, l := range []net.Listener{r.grpcLis, r.metricsLis} {
		if l != nil {
			_ = l.Close()
		}
	}
	if r.provider != nil {
		r.provider.Close()
	}
}

// Run serves until ctx ends, then shuts the replica down in this order:
//  1. the coordinator leaves: it hands its partitions over while everything
//     else keeps running (a leaving replica keeps forwarding CNI calls);
//  2. once it has left, or as soon as any component fails, the rest stops:
//     the IPAM, gossip and the leader election end, the gRPC server finishes
//     the calls in flight, the HTTP server shuts down (5 s at most);
//  3. once every one of those has returned: the forwarder's connections to the
//     other replicas close, then the coordinator's Lease informers (routing
//     needed them until the last forwarded call), then the cloud client.
func (r *replica) Run(ctx context.Context) error {
	err := r.serve(ctx)
	for _, closeStep := range []func(){
		r.forwarder.Close,
		r.coord.Close,
		r.provider.Close,
	} {
		closeStep()
	}
	return err
}

// serve runs every component until step 2 of Run's shutdown is done.
func (r *replica) serve(ctx context.Context) error {
	baseCtx, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	g, gctx := errgroup.WithContext(baseCtx)
	coordCtx, cancelCoord := context.WithCancel(ctx)
	defer cancelCoord()
	stopCoord := context.AfterFunc(gctx, cancelCoord) // a failing component ends the coordinator too
	defer stopCoord()

	g.Go(func() error { return r.core.Run(gctx) })
	g.Go(func() error { return r.psts.run(gctx) })
	if r.webhook != nil {
		g.Go(func() error { return r.webhook.Run(gctx) })
	}
	g.Go(func() error { return r.members.Run(gctx) })
	g.Go(func() error {
		for ev := range r.members.Events() {
			r.log.Debug("membership event", "event", ev.Type.String(), "member", ev.Member.Name)
			r.coord.Kick()
		}
		return nil
	})
	g.Go(func() error { return r.elector.Run(gctx) })
	g.Go(func() error {
		err := r.coord.Run(coordCtx)
		cancelBase() // step 2: the rest stops once the coordinator has left
		return err
	})
	g.Go(func() error { r.runHealth(gctx, r.health); return nil })
	g.Go(func() error { return r.grpc.Serve(r.grpcLis) })
	g.Go(func() error {
		if err := r.http.Serve(r.metricsLis); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		r.grpc.GracefulStop()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return r.http.Shutdown(shutdownCtx)
	})
	return g.Wait()
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
	dialer := &net.Dialer{
		Timeout:   30 * time.Second,
		KeepAlive: 30 * time.Second,
	}
	c.Dial = dialer.DialContext
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
