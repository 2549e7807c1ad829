package cni

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/cce-ipam/sharded/ipamcore/podip"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// Config holds the service's limits. The defaults are the flags'
// (RegisterFlags, DefaultConfig).
type Config struct {
	// AllocateConcurrency bounds allocations in flight. Defaults to 20.
	AllocateConcurrency int
	// ReleaseConcurrency bounds releases in flight. Defaults to 30.
	ReleaseConcurrency int
	// SlotWait is how long a call received from a CNI plugin waits for a
	// free slot once the limit is reached, before it is answered "busy".
	// Defaults to 5s; 0 answers at once, as the reference does. A forwarded
	// call never waits (serve says why).
	SlotWait time.Duration
	// RequestTimeout is the hard deadline of one call. Defaults to 30s,
	// below kubelet's own CNI timeout so that our error, not a cancelled
	// sandbox, reaches the pod's events.
	RequestTimeout time.Duration
}

// RegisterFlags binds the config to command-line flags and sets the defaults.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.IntVar(&c.AllocateConcurrency, "allocate-ip-concurrency-limit", 20,
		"maximum AllocateIP calls in flight; more wait up to --cni-slot-wait for a slot, then get a retryable \"busy\" error")
	fs.IntVar(&c.ReleaseConcurrency, "release-ip-concurrency-limit", 30,
		"maximum ReleaseIP calls in flight; more wait up to --cni-slot-wait for a slot, then get a retryable \"busy\" error")
	fs.DurationVar(&c.SlotWait, "cni-slot-wait", 5*time.Second,
		"how long a CNI call waits for a free slot at the concurrency limit before it is answered \"busy\" (0: at once, as the reference)")
	fs.DurationVar(&c.RequestTimeout, "cni-request-timeout", 30*time.Second, "hard deadline of one CNI call")
}

// DefaultConfig is the config of a command line without flags.
func DefaultConfig() Config {
	var c Config
	c.RegisterFlags(pflag.NewFlagSet("cni", pflag.ContinueOnError))
	return c
}

// Validate reports a config that cannot work: a limit of zero would answer
// every call "busy", a zero timeout would cancel every call at once.
func (c Config) Validate() error {
	if c.SlotWait < 0 {
		return fmt.Errorf("cni: slot wait %s must not be negative", c.SlotWait)
	}
	if c.AllocateConcurrency <= 0 || c.ReleaseConcurrency <= 0 || c.RequestTimeout <= 0 {
		return fmt.Errorf("cni: concurrency limits (%d, %d) and request timeout (%s) must be positive",
			c.AllocateConcurrency, c.ReleaseConcurrency, c.RequestTimeout)
	}
	return nil
}

// BusyMessage starts the ErrMsg of a call refused because too many are in
// flight. It keeps the reference's wording, which operators grep for.
const BusyMessage = "QPS exceed limit, wait another try"

// Server implements rpc.CNIBackendServer over a Backend.
type Server struct {
	rpc.UnimplementedCNIBackendServer

	cfg      Config
	backend  podip.Backend
	log      *slog.Logger
	metrics  *metrics
	allocate chan struct{} // semaphore of in-flight allocations
	release  chan struct{} // semaphore of in-flight releases and checks
	// forwarded tells a call another replica forwarded here (WithForwarded).
	forwarded func(context.Context) bool
}

// Option is an optional knob of NewServer.
type Option func(*Server)

// WithForwarded gives the server the test of a forwarded call: one that
// another replica received from a CNI plugin and forwarded to this one (in
// cmd/cce-ipam, shard.Forwarded, which the router's interceptor makes true
// for a verified forward). Its metrics then carry hop="forwarded", so that
// hop="entry" counts each CNI call once however many replicas it passes.
// Without it every call is an entry.
func WithForwarded(forwarded func(context.Context) bool) Option {
	return func(s *Server) { s.forwarded = forwarded }
}

// NewServer builds the service. A nil registerer disables metrics. The
// config must pass Validate (start from DefaultConfig); NewServer panics on
// one that does not, as a server that refused every call would.
func NewServer(cfg Config, backend podip.Backend, log *slog.Logger, reg prometheus.Registerer, opts ...Option) *Server {
	if err := cfg.Validate(); err != nil {
		panic(fmt.Sprintf("cni.NewServer: %v", err))
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:      cfg,
		backend:  backend,
		log:      log,
		metrics:  newMetrics(reg),
		allocate: make(chan struct{}, cfg.AllocateConcurrency),
		release:  make(chan struct{}, cfg.ReleaseConcurrency),
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// AllocateIP implements rpc.CNIBackendServer.
func (s *Server) AllocateIP(ctx context.Context, req *rpc.AllocateIPRequest) (*rpc.AllocateIPReply, error) {
	reply := &rpc.AllocateIPReply{IPType: rpc.IPType_BCCMultiENIMultiIPType}
	ep, _, err := s.serve(ctx, methodAllocate, s.allocate, req, checkIPType(req.GetIPType()),
		func(ctx context.Context, pod podip.PodRef) (podip.Endpoint, bool, error) {
			ep, err := s.backend.Allocate(ctx, pod)
			return ep, err == nil, err
		})
	if err != nil {
		reply.ErrMsg = err.Error()
		return reply, nil
	}
	reply.IsSuccess = true
	reply.NetworkInfo = &rpc.AllocateIPReply_ENIMultiIP{ENIMultiIP: toWire(ep)}
	return reply, nil
}

// ReleaseIP implements rpc.CNIBackendServer. Every IP type is released as
// BCC: for another IPAM's type (BBC, cross-VPC, RoCE, ERI) we normally hold
// nothing and the DEL succeeds with no address, so that the pod's teardown
// is not blocked; if we do hold something for the pod (say it was ADDed as
// BCC by an older plugin), it is freed.
func (s *Server) ReleaseIP(ctx context.Context, req *rpc.ReleaseIPRequest) (*rpc.ReleaseIPReply, error) {
	reply := &rpc.ReleaseIPReply{IPType: rpc.IPType_BCCMultiENIMultiIPType}
	if _, foreign := foreignIPTypes[req.GetIPType()]; foreign {
		reply.IPType = req.GetIPType() // nothing of ours released: answer in the caller's type
	}
	ep, ok, err := s.serve(ctx, methodRelease, s.release, req, nil, s.backend.Release)
	if err != nil {
		reply.ErrMsg = err.Error()
		return reply, nil
	}
	reply.IsSuccess = true
	if ok {
		reply.IPType = rpc.IPType_BCCMultiENIMultiIPType
		reply.NetworkInfo = &rpc.ReleaseIPReply_ENIMultiIP{ENIMultiIP: toWire(ep)}
	}
	return reply, nil
}

// CheckIP implements rpc.CNIBackendServer. It answers truthfully: success with
// the current assignment, or IsSuccess=false when the pod holds no IP.
func (s *Server) CheckIP(ctx context.Context, req *rpc.CheckIPRequest) (*rpc.CheckIPReply, error) {
	reply := &rpc.CheckIPReply{IPType: rpc.IPType_BCCMultiENIMultiIPType}
	ep, ok, err := s.serve(ctx, methodCheck, s.release, req, nil, s.backend.Check)
	switch {
	case err != nil:
		reply.ErrMsg = err.Error()
	case !ok:
		reply.ErrMsg = "pod holds no IP"
	default:
		reply.IsSuccess = true
		reply.NetworkInfo = &rpc.CheckIPReply_ENIMultiIP{ENIMultiIP: toWire(ep)}
	}
	return reply, nil
}

type call func(ctx context.Context, pod podip.PodRef) (podip.Endpoint, bool, error)

// serve is the shared path of every method: validate, take a slot or refuse,
// run the backend under the deadline, record the outcome. A non-nil refusal
// (the method's own check of the request) fails the call before the backend.
func (s *Server) serve(ctx context.Context, method string, slots chan struct{}, req podRequest, refusal error,
	fn call) (podip.Endpoint, bool, error) {
	start := time.Now()
	hop := s.hop(ctx)
	pod, err := decode(req)
	if err == nil {
		err = refusal
	}
	if err != nil {
		s.metrics.observe(method, resultInvalid, hop, start)
		s.log.Warn("rejected CNI request", "method", method, "err", err)
		return podip.Endpoint{}, false, err
	}
	if !s.takeSlot(ctx, slots, hop) {
		s.metrics.observe(method, resultBusy, hop, start)
		return podip.Endpoint{}, false, fmt.Errorf("%s: %d %s calls in flight", BusyMessage, cap(slots), method)
	}
	defer func() { <-slots }()
	inflight := s.metrics.inflight.WithLabelValues(method, hop)
	inflight.Inc()
	defer inflight.Dec()

	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	ep, ok, err := fn(ctx, pod)
	if err != nil {
		setRefusalTrailer(ctx, err)
		s.metrics.observe(method, resultError, hop, start)
		s.log.Warn("CNI call failed", "method", method, "pod", pod.String(), "err", err, "duration", time.Since(start))
		return podip.Endpoint{}, false, fmt.Errorf("%s %s: %w", method, pod, err)
	}
	s.metrics.observe(method, resultOK, hop, start)
	s.log.Debug("CNI call served", "method", method, "pod", pod.String(), "ip", ep.IP, "duration", time.Since(start))
	return ep, ok, nil
}

// takeSlot takes a slot of the limit, waiting for one up to SlotWait (and
// the caller's deadline) when the call came from a CNI plugin. Refusing at
// once made every call beyond the limit in a burst a kubelet retry seconds
// later; a short wait lets it start as soon as a call ends. A forwarded call
// does not wait: its entry replica holds a slot while it waits here, and two
// replicas whose entry calls forward to each other could then hold each
// other's slots until the wait ran out. The entry waits holding nothing.
func (s *Server) takeSlot(ctx context.Context, slots chan struct{}, hop string) bool {
	select {
	case slots <- struct{}{}:
		return true
	default:
	}
	if hop == HopForwarded || s.cfg.SlotWait <= 0 {
		return false
	}
	wait := time.NewTimer(s.cfg.SlotWait)
	defer wait.Stop()
	s.metrics.waiting.Inc()
	defer s.metrics.waiting.Dec()
	select {
	case slots <- struct{}{}:
		return true
	case <-wait.C:
		return false
	case <-ctx.Done():
		return false
	}
}

func toWire(ep podip.Endpoint) *rpc.ENIMultiIPReply {
	return &rpc.ENIMultiIPReply{
		IP:                ep.IP,
		Type:              ep.Type,
		Mac:               ep.MAC,
		Gw:                ep.Gateway,
		ENIID:             ep.ENIID,
		Node:              ep.Node,
		SubnetID:          ep.SubnetID,
		EnableFixIP:       ep.EnableFixIP,
		FixIPDeletePolicy: ep.FixIPDeletePolicy,
	}
}
