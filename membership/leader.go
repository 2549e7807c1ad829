package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaderConfig configures leader election over a coordination.k8s.io Lease.
type LeaderConfig struct {
	// Namespace of the Lease. Required.
	Namespace string
	// Name of the Lease. The flag defaults to "cce-ipam-leader".
	Name string
	// LeaseDuration is how long a Lease holds without renewal; candidates
	// wait this long after the last renewal they saw. The flag defaults to 15s.
	LeaseDuration time.Duration
	// RenewDeadline is how long the leader keeps trying to renew before it
	// stops leading. Must be below LeaseDuration. The flag defaults to 10s.
	RenewDeadline time.Duration
	// RetryPeriod is the wait between acquire or renew attempts.
	// The flag defaults to 2s.
	RetryPeriod time.Duration
}

// RegisterFlags binds the config to command-line flags.
func (c *LeaderConfig) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Namespace, "leader-elect-lease-namespace", "kube-system", "namespace of the leader-election Lease")
	fs.StringVar(&c.Name, "leader-elect-lease-name", "cce-ipam-leader", "name of the leader-election Lease")
	fs.DurationVar(&c.LeaseDuration, "leader-elect-lease-duration", 15*time.Second, "how long a leader Lease holds without renewal")
	fs.DurationVar(&c.RenewDeadline, "leader-elect-renew-deadline", 10*time.Second,
		"how long the leader keeps trying to renew before it stops leading (below the lease duration)")
	fs.DurationVar(&c.RetryPeriod, "leader-elect-retry-period", 2*time.Second, "wait between leader-election attempts")
}

// DefaultLeaderConfig is the leader election the flags default to.
func DefaultLeaderConfig() LeaderConfig {
	var c LeaderConfig
	c.RegisterFlags(pflag.NewFlagSet("defaults", pflag.ContinueOnError))
	return c
}

// Validate reports a config that cannot work, after defaults are applied.
func (c LeaderConfig) Validate() error {
	var errs []error
	if c.Namespace == "" || c.Name == "" {
		errs = append(errs, errors.New("leader election: lease namespace and name are required"))
	}
	if c.LeaseDuration <= c.RenewDeadline {
		errs = append(errs, errors.New("leader election: lease duration must be greater than the renew deadline"))
	}
	if c.RenewDeadline <= time.Duration(leaderelection.JitterFactor*float64(c.RetryPeriod)) {
		errs = append(errs, fmt.Errorf("leader election: renew deadline must be greater than %.1f × retry period",
			leaderelection.JitterFactor))
	}
	if c.RetryPeriod <= 0 {
		errs = append(errs, errors.New("leader election: retry period must be positive"))
	}
	return errors.Join(errs...)
}

// LeaderCallbacks are the leader's duties.
type LeaderCallbacks struct {
	// OnStartedLeading runs while this replica leads; ctx ends when it
	// stops leading (lost Lease, or the Run context ended). It runs on a
	// goroutine owned by Elector.Run. The Lease is released only after it
	// has returned, so a well-behaved duty never overlaps the next leader's.
	OnStartedLeading func(ctx context.Context)
	// OnStoppedLeading is called after OnStartedLeading has returned, once
	// per term. Optional.
	OnStoppedLeading func()
	// OnNewLeader is called when the observed leader changes (including
	// to this replica). Optional; it must not block.
	OnNewLeader func(identity string)
}

// Elector campaigns for a Lease again and again until its context ends.
type Elector struct {
	cfg      LeaderConfig
	client   kubernetes.Interface
	identity string
	cb       LeaderCallbacks
	log      *slog.Logger
	metrics  *leaderMetrics
	leader   atomic.Bool
}

// NewElector checks cfg. identity is the Lease holder name: use the member
// name (Membership.Name), unique per process. Nothing starts until Run.
func NewElector(cfg LeaderConfig, client kubernetes.Interface, identity string, cb LeaderCallbacks, log *slog.Logger,
	reg prometheus.Registerer) (*Elector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if identity == "" {
		return nil, errors.New("leader election: identity is required")
	}
	if client == nil {
		return nil, errors.New("leader election: a Kubernetes client is required")
	}
	if cb.OnStartedLeading == nil {
		return nil, errors.New("leader election: OnStartedLeading is required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Elector{cfg: cfg, client: client, identity: identity, cb: cb, log: log, metrics: newLeaderMetrics(reg)}, nil
}

// IsLeader reports whether this replica currently leads. It turns false
// before OnStartedLeading's context is cancelled.
func (e *Elector) IsLeader() bool { return e.leader.Load() }

// Identity is the Lease holder identity of this replica.
func (e *Elector) Identity() string { return e.identity }

// Run campaigns until ctx ends: acquire the Lease, lead until it is lost,
// campaign again. When ctx ends while leading, the duty is stopped first
// and then the Lease is released (ReleaseOnCancel), so that another replica
// takes over within about one retry period. Run returns after every
// goroutine it started has exited.
func (e *Elector) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		if err := e.term(ctx); err != nil {
			return err
		}
		t := time.NewTimer(e.cfg.RetryPeriod)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	return nil
}

// term runs one client-go elector until it has led and lost, or ctx ended.
func (e *Elector) term(ctx context.Context) error {
	started := make(chan context.Context, 1)
	le, closeReports, err := e.newElector(started)
	if err != nil {
		return err
	}
	defer closeReports()

	// client-go's context is cancelled only after our duty has stopped, so
	// the Lease is released after, never before, the duty ends.
	leCtx, leCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer leCancel()
	leDone := make(chan struct{})
	go func() { defer close(leDone); le.Run(leCtx) }()

	var lctx context.Context
	select {
	case <-ctx.Done():
		leCancel()
		<-leDone
		return nil
	case <-leDone:
		return nil
	case lctx = <-started:
	}
	e.lead(ctx, lctx)
	leCancel()
	<-leDone
	return nil
}

// newElector builds one term's client-go elector over the Lease; started
// receives the term's context when it leads. closeReports drops the new-leader
// reports client-go still sends from its own goroutines once the term is over.
func (e *Elector) newElector(started chan<- context.Context) (le *leaderelection.LeaderElector, closeReports func(), err error) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metaObject(e.cfg.Namespace, e.cfg.Name),
		Client:     e.client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.identity},
	}
	var reportMu sync.Mutex
	reportOpen := true
	closeReports = func() { reportMu.Lock(); reportOpen = false; reportMu.Unlock() }
	le, err = leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   e.cfg.LeaseDuration,
		RenewDeadline:   e.cfg.RenewDeadline,
		RetryPeriod:     e.cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            e.cfg.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			// client-go calls this on a goroutine of its own; hand the
			// term's context over and return at once.
			OnStartedLeading: func(lctx context.Context) { started <- lctx },
			OnStoppedLeading: func() {},
			OnNewLeader: func(id string) {
				reportMu.Lock()
				defer reportMu.Unlock()
				if !reportOpen {
					return
				}
				e.log.Info("leader observed", "leader", id, "self", id == e.identity)
				if e.cb.OnNewLeader != nil {
					e.cb.OnNewLeader(id)
				}
			},
		},
	})
	if err != nil {
		return nil, func() {}, fmt.Errorf("leader election: %w", err)
	}
	return le, closeReports, nil
}

// lead runs the duty from winning the Lease (lctx) until ctx ends or the
// Lease is lost, and returns once the duty has stopped.
func (e *Elector) lead(ctx, lctx context.Context) {
	e.leader.Store(true)
	e.metrics.isLeader.Set(1)
	e.metrics.transitions.Inc()
	e.log.Info("started leading", "lease", e.cfg.Namespace+"/"+e.cfg.Name, "identity", e.identity)
	// The duty's context is cancelled by us, after IsLeader has turned
	// false, not directly by client-go.
	dutyCtx, dutyCancel := context.WithCancel(context.WithoutCancel(lctx))
	defer dutyCancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); e.cb.OnStartedLeading(dutyCtx) }()

	select {
	case <-ctx.Done():
	case <-lctx.Done(): // lost the Lease
	}
	e.leader.Store(false)
	e.metrics.isLeader.Set(0)
	dutyCancel()
	wg.Wait()
	if e.cb.OnStoppedLeading != nil {
		e.cb.OnStoppedLeading()
	}
	e.log.Info("stopped leading", "lease", e.cfg.Namespace+"/"+e.cfg.Name, "identity", e.identity, "released", ctx.Err() != nil)
}

func metaObject(namespace, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: namespace, Name: name}
}
