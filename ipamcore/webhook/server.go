package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/cce-ipam/sharded/cloud"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/cachetrim"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	cceinformers "github.com/cce-ipam/sharded/ipamcore/generated/informers/externalversions"
	ccelisters "github.com/cce-ipam/sharded/ipamcore/generated/listers/cce/v1alpha1"
)

// Paths of the webhooks.
const (
	PathMutatePods   = "/mutate-pods"
	PathValidatePSTS = "/validate-psts"
)

// Deps are the webhooks' clients.
type Deps struct {
	// Kube reads and writes the certificate Secret and patches the webhook
	// configurations.
	Kube kubernetes.Interface
	// CCE reads PSTS, Subnet and IPPool objects and writes Subnets.
	CCE cceclient.Interface
	// Cloud answers DescribeSubnet for the PSTS webhook.
	Cloud cloud.Provider
	// CCEInformers, when set, is a factory the caller shares and starts
	// after New (the PSTS and Subnet informers are taken from it); nil: Run
	// starts and stops a factory of its own.
	CCEInformers cceinformers.SharedInformerFactory
}

// Server serves the admission webhooks of one replica.
type Server struct {
	cfg     Config
	cce     cceclient.Interface
	cloud   cloud.Provider
	log     *slog.Logger
	metrics *metrics
	keeper  *keeper

	pstsLister   ccelisters.PodSubnetTopologySpreadLister
	subnetLister ccelisters.SubnetLister
	// listPools reads every IPPool for a PSTS review. IPPools are not
	// cached: their status lists every ENI and address of the cluster, and a
	// PSTS changes rarely.
	listPools   func(ctx context.Context) ([]*cce.IPPool, error)
	synced      []cache.InformerSynced
	ownCCE      cceinformers.SharedInformerFactory // nil when shared
	kubeFactory []informers.SharedInformerFactory
}

// New builds the webhooks; Run serves them. cfg must be enabled and valid.
// New starts nothing: it registers the informers it needs.
func New(cfg Config, deps Deps, log *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	if !cfg.Enabled {
		return nil, errors.New("webhook: New with a disabled config")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Kube == nil || deps.CCE == nil || deps.Cloud == nil {
		return nil, errors.New("webhook: Kube, CCE and Cloud are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, cce: deps.CCE, cloud: deps.Cloud, log: log, metrics: newMetrics(reg)}
	s.keeper = newKeeper(cfg, deps.Kube, log, s.metrics)
	factory := deps.CCEInformers
	if factory == nil {
		factory = cceinformers.NewSharedInformerFactoryWithOptions(deps.CCE, 0, cceinformers.WithTransform(cachetrim.StripManagedFields))
		s.ownCCE = factory
	}
	v1 := factory.Cce().V1alpha1()
	s.pstsLister, s.subnetLister = v1.PodSubnetTopologySpreads().Lister(), v1.Subnets().Lister()
	s.synced = append(s.synced, v1.PodSubnetTopologySpreads().Informer().HasSynced, v1.Subnets().Informer().HasSynced)
	s.listPools = func(ctx context.Context) ([]*cce.IPPool, error) {
		// From the API server's watch cache: no etcd read, and one
		// response however many pools.
		l, err := deps.CCE.CceV1alpha1().IPPools(cce.IPPoolNamespace).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return nil, err
		}
		out := make([]*cce.IPPool, len(l.Items))
		for i := range l.Items {
			out[i] = &l.Items[i]
		}
		return out, nil
	}

	notify := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.keeper.notify() },
		UpdateFunc: func(any, any) { s.keeper.notify() },
		DeleteFunc: func(any) { s.keeper.notify() },
	}
	secrets := s.namedFactory(deps.Kube, cfg.SecretName, informers.WithNamespace(cfg.Namespace)).Core().V1().Secrets()
	if _, err := secrets.Informer().AddEventHandler(notify); err != nil {
		return nil, err
	}
	s.keeper.secrets = secrets.Lister().Secrets(cfg.Namespace)
	s.synced = append(s.synced, secrets.Informer().HasSynced)
	if cfg.CertManager {
		return s, nil // cert-manager's cainjector keeps the caBundles
	}
	if name := cfg.MutatingConfigName; name != "" {
		inf := s.namedFactory(deps.Kube, name).Admissionregistration().V1().MutatingWebhookConfigurations()
		if _, err := inf.Informer().AddEventHandler(notify); err != nil {
			return nil, err
		}
		s.keeper.mutating = inf.Lister()
		s.synced = append(s.synced, inf.Informer().HasSynced)
	}
	if name := cfg.ValidatingConfigName; name != "" {
		inf := s.namedFactory(deps.Kube, name).Admissionregistration().V1().ValidatingWebhookConfigurations()
		if _, err := inf.Informer().AddEventHandler(notify); err != nil {
			return nil, err
		}
		s.keeper.validating = inf.Lister()
		s.synced = append(s.synced, inf.Informer().HasSynced)
	}
	return s, nil
}

// namedFactory is a factory of informers that see one object, by name: the
// list and watch carry a metadata.name field selector, which lets RBAC limit
// them by resourceNames.
func (s *Server) namedFactory(kube kubernetes.Interface, name string,
	opts ...informers.SharedInformerOption) informers.SharedInformerFactory {
	opts = append(opts, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
	}))
	f := informers.NewSharedInformerFactoryWithOptions(kube, 0, opts...)
	s.kubeFactory = append(s.kubeFactory, f)
	return f
}

// Run serves the webhooks until ctx ends, then shuts the server down
// gracefully (in-flight reviews finish, for at most 5s) and returns nil
// once every goroutine it started has stopped. It serves only once the
// informers synced and a certificate is loaded (created, if this replica is
// the first). It fails when the address cannot be bound.
func (s *Server) Run(ctx context.Context) error {
	if s.ownCCE != nil {
		s.ownCCE.Start(ctx.Done())
		defer s.ownCCE.Shutdown()
	}
	for _, f := range s.kubeFactory {
		f.Start(ctx.Done())
		defer f.Shutdown()
	}
	if !cache.WaitForCacheSync(ctx.Done(), s.synced...) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("webhook: informer caches did not sync")
	}
	lis, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("webhook: listen: %w", err)
	}
	srv := &http.Server{
		Handler:           s.Handler(),
		TLSConfig:         &tls.Config{GetCertificate: s.keeper.getCertificate, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       90 * time.Second,
		// Handshakes fail while a client trusts an older CA, or probes.
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.keeper.run(gctx) })
	g.Go(func() error {
		select {
		case <-s.keeper.loaded:
		case <-gctx.Done():
			return nil
		}
		s.log.Info("serving the admission webhooks", "addr", lis.Addr().String())
		if err := srv.ServeTLS(lis, "", ""); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("webhook: serve: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := srv.Shutdown(sctx)
		_ = lis.Close() // Serve may never have started
		if err != nil {
			s.log.Warn("webhook shutdown cut in-flight reviews short", "err", err)
		}
		return nil
	})
	return g.Wait()
}

// Handler routes the webhook paths; Run serves it over TLS.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(PathMutatePods, s.handler("pods", s.reviewPod))
	mux.Handle(PathValidatePSTS, s.handler("psts", s.reviewPSTS))
	return mux
}
