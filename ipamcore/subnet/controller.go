package subnet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/cce-ipam/sharded/cloud"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	ccescheme "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned/scheme"
	cceinformers "github.com/cce-ipam/sharded/ipamcore/generated/informers/externalversions"
	"github.com/cce-ipam/sharded/ipamcore/psts"
)

// Config tunes the controller. The default is the flag's (RegisterFlags,
// DefaultConfig).
type Config struct {
	// SyncPeriod is how often every Subnet is refreshed from the cloud.
	// Defaults to 15s, as the reference.
	SyncPeriod time.Duration
}

// RegisterFlags binds the config to flags and sets the default.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&c.SyncPeriod, "subnet-sync-period", 15*time.Second, "how often Subnet resources are refreshed from the cloud")
}

// DefaultConfig is the config of a command line without flags.
func DefaultConfig() Config {
	var c Config
	c.RegisterFlags(pflag.NewFlagSet("subnet", pflag.ContinueOnError))
	return c
}

// Validate reports a config that cannot work.
func (c Config) Validate() error {
	if c.SyncPeriod <= 0 {
		return fmt.Errorf("subnet: sync period %s must be positive", c.SyncPeriod)
	}
	return nil
}

// Controller keeps Subnet resources current.
type Controller struct {
	cfg       Config
	cce       cceclient.Interface
	kube      kubernetes.Interface // events; nil: none
	cloud     cloud.Provider
	log       *slog.Logger
	available *prometheus.GaugeVec
	writes    prometheus.Counter
	exhausted prometheus.Counter

	// events is set by Run for its term, before its first Sync; nil: no
	// events (Sync called without Run, or no WithEvents).
	events record.EventRecorder
}

// Option is an optional dependency of the controller.
type Option func(*Controller)

// WithEvents has the controller report on the Subnet resources, with
// events written through kube: a Warning when a subnet becomes exhausted,
// a Normal one when it has addresses again.
func WithEvents(kube kubernetes.Interface) Option {
	return func(c *Controller) { c.kube = kube }
}

// NewController builds the controller; Run starts it. The config must pass
// Validate (start from DefaultConfig); NewController panics on one that does
// not, as its sync ticker would.
func NewController(cfg Config, cce cceclient.Interface, provider cloud.Provider, log *slog.Logger,
	reg prometheus.Registerer, opts ...Option) *Controller {
	if err := cfg.Validate(); err != nil {
		panic(fmt.Sprintf("subnet.NewController: %v", err))
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := promauto.With(reg)
	c := &Controller{
		cfg: cfg, cce: cce, cloud: provider, log: log,
		available: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cce_ipam_subnet_available_ips",
			Help: "Free IPs of each subnet used by IPPools or PodSubnetTopologySpreads, as the cloud reports.",
		}, []string{"subnet"}),
		writes: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_subnet_writes_total", Help: "Subnet resources created or updated.",
		}),
		exhausted: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_subnet_exhausted_total", Help: "Times a subnet was found exhausted (hasNoMoreIP set by this controller).",
		}),
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Run syncs every Subnet resource and every subnet the IPPools and
// PodSubnetTopologySpreads list at once, then every SyncPeriod and soon
// after a Subnet, an IPPool or a PodSubnetTopologySpread is added or
// changed, until ctx ends. Sync must
// not be called while Run runs.
func (c *Controller) Run(ctx context.Context) error {
	if c.kube != nil {
		broadcaster := record.NewBroadcaster(record.WithContext(context.WithoutCancel(ctx))) // stopped below, after the last Sync
		broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.kube.CoreV1().Events("")})
		defer broadcaster.Shutdown()
		c.events = broadcaster.NewRecorder(ccescheme.Scheme, corev1.EventSource{Component: "cce-ipam-subnet"})
		defer func() { c.events = nil }()
	}
	factory := cceinformers.NewSharedInformerFactory(c.cce, 0)
	pools := factory.Cce().V1alpha1().IPPools()
	spreads := factory.Cce().V1alpha1().PodSubnetTopologySpreads()
	// Every Subnet resource is refreshed, not only those the pools and
	// PSTS list: a subnet created by hand, by the reference, or left by a
	// pool since deleted would otherwise keep stale numbers for ever.
	subnets := factory.Cce().V1alpha1().Subnets()
	// A new pool or PSTS, or a changed subnet list, is synced at once, not
	// up to a period later: one pending kick is enough. Status writes do
	// not kick (the IPAM writes pool statuses, the spread controller PSTS
	// statuses, often).
	kick := make(chan struct{}, 1)
	if err := errors.Join(
		onSubnetsChange(pools.Informer(), kick, func(old, obj any) bool {
			o, ok1 := old.(*cce.IPPool)
			n, ok2 := obj.(*cce.IPPool)
			return !ok1 || !ok2 || !slices.Equal(o.Spec.ENI.Subnets, n.Spec.ENI.Subnets)
		}),
		onSubnetsChange(spreads.Informer(), kick, func(old, obj any) bool {
			o, ok1 := old.(*cce.PodSubnetTopologySpread)
			n, ok2 := obj.(*cce.PodSubnetTopologySpread)
			return !ok1 || !ok2 || o.Generation != n.Generation // a spec change
		}),
		// Only a new Subnet kicks: this controller's own status writes
		// are updates.
		onSubnetsChange(subnets.Informer(), kick, func(any, any) bool { return false }),
	); err != nil {
		return fmt.Errorf("subnet: event handler: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("subnet: cache of %v did not sync", typ)
		}
	}
	tick := time.NewTicker(c.cfg.SyncPeriod)
	defer tick.Stop()
	// A kick syncs only the subnets not synced yet in this Run: a burst of
	// new nodes' pools costs no DescribeSubnet of the subnets known already.
	synced := map[string]bool{}
	all := true
	for {
		poolList, err1 := pools.Lister().List(labels.Everything())
		spreadList, err2 := spreads.Lister().List(labels.Everything())
		subnetList, err3 := subnets.Lister().List(labels.Everything())
		if err1 == nil && err2 == nil && err3 == nil {
			want := wanted(poolList, spreadList)
			for _, sn := range subnetList {
				if _, listed := want[sn.Name]; !listed && sn.Namespace == cce.SubnetNamespace {
					want[sn.Name] = sn.Spec.Exclusive // it exists: never created, the flag is unused
				}
			}
			if !all {
				maps.DeleteFunc(want, func(id string, _ bool) bool { return synced[id] })
			}
			c.sync(ctx, want)
			for id := range want {
				synced[id] = true
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			all = true
		case <-kick:
			all = false
		}
	}
}

// onSubnetsChange kicks on every add, and on the updates changed reports.
func onSubnetsChange(inf cache.SharedIndexInformer, kick chan<- struct{}, changed func(old, obj any) bool) error {
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { poke(kick) },
		UpdateFunc: func(old, obj any) {
			if changed(old, obj) {
				poke(kick)
			}
		},
	})
	return err
}

func poke(kick chan<- struct{}) {
	select {
	case kick <- struct{}{}:
	default:
	}
}

// Sync makes sure every subnet the pools and the PodSubnetTopologySpreads
// list has a current Subnet. A missing one is created from the cloud; it is
// exclusive when a PSTS lists it with a strategy that picks addresses
// itself (psts.NeedsExclusive) and no pool lists it. The PSTS validating
// webhook normally creates those; this covers a PSTS admitted while it was
// down.
func (c *Controller) Sync(ctx context.Context, pools []*cce.IPPool, spreads []*cce.PodSubnetTopologySpread) {
	c.sync(ctx, wanted(pools, spreads))
}

// wanted are the subnets the pools and PSTS objects list: subnet ID →
// whether a Subnet created for it is exclusive. A subnet a pool lists is
// not (the PSTS status says why such a PSTS cannot use it); IDs no Subnet
// can be named by are left out (the PSTS status says so too).
func wanted(pools []*cce.IPPool, spreads []*cce.PodSubnetTopologySpread) map[string]bool {
	want := map[string]bool{}
	inPool := map[string]bool{}
	for _, p := range pools {
		for _, id := range p.Spec.ENI.Subnets {
			want[id] = false
			inPool[id] = true
		}
	}
	for _, p := range spreads {
		for id := range p.Spec.Subnets {
			if len(validation.IsDNS1123Subdomain(id)) > 0 {
				continue
			}
			want[id] = want[id] || (!inPool[id] && psts.NeedsExclusive(psts.Resolve(p, id).Type))
		}
	}
	return want
}

func (c *Controller) sync(ctx context.Context, want map[string]bool) {
	for _, id := range slices.Sorted(maps.Keys(want)) {
		if err := c.syncOne(ctx, id, want[id]); err != nil && ctx.Err() == nil {
			c.log.Warn("subnet sync failed", "subnet", id, "err", err)
		}
	}
}

// reasonExhausted is the status reason this controller writes with
// hasNoMoreIP.
const reasonExhausted = "the cloud reports no available IP"

// Event reasons on Subnet resources.
const (
	ReasonSubnetExhausted = "SubnetExhausted"
	ReasonSubnetAvailable = "SubnetHasAvailableIP"
)

func (c *Controller) syncOne(ctx context.Context, id string, exclusive bool) error {
	sn, err := c.cloud.DescribeSubnet(ctx, id)
	if err != nil {
		return fmt.Errorf("describe: %w", err)
	}
	c.available.WithLabelValues(id).Set(float64(sn.AvailableIP))
	client := c.cce.CceV1alpha1().Subnets(cce.SubnetNamespace)
	cur, err := client.Get(ctx, id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		created := &cce.Subnet{
			ObjectMeta: metav1.ObjectMeta{
				Name:      id,
				Namespace: cce.SubnetNamespace,
			},
			Spec: cce.SubnetSpec{
				ID:               sn.ID,
				Name:             sn.Name,
				AvailabilityZone: sn.ZoneName,
				CIDR:             sn.CIDR,
				Exclusive:        exclusive,
			},
			Status: cce.SubnetStatus{
				Enable:         true,
				AvailableIPNum: int32(sn.AvailableIP),
				HasNoMoreIP:    sn.AvailableIP <= 0,
			},
		}
		if created.Status.HasNoMoreIP {
			created.Status.Reason = reasonExhausted
		}
		created, err = client.Create(ctx, created, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		c.writes.Inc()
		c.log.Info("subnet resource created", "subnet", id, "exclusive", exclusive, "available", sn.AvailableIP)
		if created.Status.HasNoMoreIP {
			c.reportExhausted(created)
		}
		return nil
	}
	if err != nil {
		return err
	}
	want := cur.Status
	want.AvailableIPNum = int32(sn.AvailableIP)
	want.HasNoMoreIP = sn.AvailableIP <= 0
	switch {
	case want.HasNoMoreIP && !cur.Status.HasNoMoreIP:
		want.Reason = reasonExhausted
	case !want.HasNoMoreIP:
		want.Reason = "" // the reason was for hasNoMoreIP (ours or the IPAM's)
	}
	if want == cur.Status {
		return nil
	}
	upd := cur.DeepCopy()
	upd.Status = want // enable never changes after creation
	upd, err = client.Update(ctx, upd, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	c.writes.Inc()
	switch {
	case want.HasNoMoreIP && !cur.Status.HasNoMoreIP:
		c.reportExhausted(upd)
	case !want.HasNoMoreIP && cur.Status.HasNoMoreIP:
		c.log.Info("subnet has available IPs again", "subnet", id, "available", sn.AvailableIP)
		if c.events != nil {
			c.events.Eventf(upd, corev1.EventTypeNormal, ReasonSubnetAvailable,
				"the cloud reports %d available IPs: hasNoMoreIP cleared", sn.AvailableIP)
		}
	}
	return nil
}

func (c *Controller) reportExhausted(sn *cce.Subnet) {
	c.exhausted.Inc()
	c.log.Warn("subnet exhausted", "subnet", sn.Name)
	if c.events != nil {
		c.events.Event(sn, corev1.EventTypeWarning, ReasonSubnetExhausted,
			"the cloud reports no available IP in subnet "+sn.Name+": new ENIs and PodSubnetTopologySpread pods skip it")
	}
}
