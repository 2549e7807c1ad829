package subnet

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/cce-ipam/sharded/cloud"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	cceinformers "github.com/cce-ipam/sharded/ipamcore/generated/informers/externalversions"
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
	cloud     cloud.Provider
	log       *slog.Logger
	available *prometheus.GaugeVec
	writes    prometheus.Counter
}

// NewController builds the controller; Run starts it. The config must pass
// Validate (start from DefaultConfig); NewController panics on one that does
// not, as its sync ticker would.
func NewController(cfg Config, cce cceclient.Interface, provider cloud.Provider, log *slog.Logger,
	reg prometheus.Registerer) *Controller {
	if err := cfg.Validate(); err != nil {
		panic(fmt.Sprintf("subnet.NewController: %v", err))
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := promauto.With(reg)
	return &Controller{
		cfg: cfg, cce: cce, cloud: provider, log: log,
		available: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cce_ipam_subnet_available_ips", Help: "Free IPs of each subnet used by IPPools, as the cloud reports.",
		}, []string{"subnet"}),
		writes: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_subnet_writes_total", Help: "Subnet resources created or updated.",
		}),
	}
}

// Run syncs at once and then every SyncPeriod until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	factory := cceinformers.NewSharedInformerFactory(c.cce, 0)
	pools := factory.Cce().V1alpha1().IPPools().Lister()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("subnet: cache of %v did not sync", typ)
		}
	}
	tick := time.NewTicker(c.cfg.SyncPeriod)
	defer tick.Stop()
	for {
		list, err := pools.List(labels.Everything())
		if err == nil {
			c.Sync(ctx, list)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Sync makes sure every subnet the pools list has a current Subnet.
func (c *Controller) Sync(ctx context.Context, pools []*cce.IPPool) {
	var ids []string
	for _, p := range pools {
		for _, id := range p.Spec.ENI.Subnets {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		if err := c.syncOne(ctx, id); err != nil && ctx.Err() == nil {
			c.log.Warn("subnet sync failed", "subnet", id, "err", err)
		}
	}
}

func (c *Controller) syncOne(ctx context.Context, id string) error {
	sn, err := c.cloud.DescribeSubnet(ctx, id)
	if err != nil {
		return fmt.Errorf("describe: %w", err)
	}
	c.available.WithLabelValues(id).Set(float64(sn.AvailableIP))
	client := c.cce.CceV1alpha1().Subnets(cce.SubnetNamespace)
	cur, err := client.Get(ctx, id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = client.Create(ctx, &cce.Subnet{
			ObjectMeta: metav1.ObjectMeta{
				Name:      id,
				Namespace: cce.SubnetNamespace,
			},
			Spec: cce.SubnetSpec{
				ID:               sn.ID,
				Name:             sn.Name,
				AvailabilityZone: sn.ZoneName,
				CIDR:             sn.CIDR,
			},
			Status: cce.SubnetStatus{
				Enable:         true,
				AvailableIPNum: int32(sn.AvailableIP),
				HasNoMoreIP:    sn.AvailableIP <= 0,
			},
		}, metav1.CreateOptions{})
		if err == nil {
			c.writes.Inc()
		}
		return err
	}
	if err != nil {
		return err
	}
	want := cur.Status
	want.AvailableIPNum = int32(sn.AvailableIP)
	want.HasNoMoreIP = sn.AvailableIP <= 0
	if want == cur.Status {
		return nil
	}
	upd := cur.DeepCopy()
	upd.Status = want // enable never changes after creation
	if _, err := client.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		return err
	}
	c.writes.Inc()
	return nil
}
