package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	admissionlisters "k8s.io/client-go/listers/admissionregistration/v1"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/cce-ipam/sharded/ipamcore/webhook/certs"
)

// keeper keeps the serving certificate: it serves what the shared Secret
// holds and, unless cert-manager writes the Secret, creates it, renews it
// (one replica wins each renewal by the resourceVersion it read; the others
// reload) and keeps the webhook configurations' caBundle equal to the
// Secret's CAs. One goroutine (run) owns its state; the TLS server reads
// the served certificate through an atomic pointer.
type keeper struct {
	cfg        Config
	policy     certs.Policy
	kube       kubernetes.Interface
	secrets    corelisters.SecretNamespaceLister
	mutating   admissionlisters.MutatingWebhookConfigurationLister   // nil: not managed
	validating admissionlisters.ValidatingWebhookConfigurationLister // nil: not managed
	log        *slog.Logger
	metrics    *metrics

	wake    chan struct{}
	serving atomic.Pointer[tls.Certificate]
	loaded  chan struct{} // closed once a certificate is served
	once    sync.Once

	// Owned by run.
	servedRV string
	backoff  time.Duration
	warned   string            // the resourceVersion whose parse errors were logged
	patched  map[string]string // by kind: the last caBundle patch sent (patchConfig)
}

func newKeeper(cfg Config, kube kubernetes.Interface, log *slog.Logger, m *metrics) *keeper {
	return &keeper{cfg: cfg, policy: cfg.policy(), kube: kube, log: log, metrics: m,
		wake: make(chan struct{}, 1), loaded: make(chan struct{}), patched: map[string]string{}}
}

// notify asks run to look again (an informer event).
func (k *keeper) notify() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// getCertificate is the TLS server's tls.Config.GetCertificate: the
// certificate the Secret holds now.
func (k *keeper) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := k.serving.Load(); c != nil {
		return c, nil
	}
	return nil, errors.New("webhook: no certificate yet")
}

// run keeps the certificate until ctx ends.
func (k *keeper) run(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-k.wake:
		case <-timer.C:
		}
		next := k.sync(ctx)
		timer.Reset(min(max(time.Until(next), 50*time.Millisecond), time.Hour))
	}
}

// sync serves the Secret's certificate and maintains the Secret; it
// returns when to look again if no event comes first.
func (k *keeper) sync(ctx context.Context) time.Time {
	s, err := k.secrets.Get(k.cfg.SecretName)
	switch {
	case apierrors.IsNotFound(err) && k.cfg.CertManager:
		k.log.Info("waiting for cert-manager to write the webhook Secret", "secret", k.cfg.SecretName)
		return time.Now().Add(time.Hour) // the informer wakes us
	case apierrors.IsNotFound(err):
		s, err = k.create(ctx)
	}
	if err != nil {
		return k.failed(ctx, "read or create the webhook Secret", err)
	}
	k.serve(s)
	if k.cfg.CertManager {
		return time.Now().Add(time.Hour)
	}
	return k.maintain(ctx, s)
}

// failed logs err and returns when to try again (backing off to 30s).
func (k *keeper) failed(ctx context.Context, what string, err error) time.Time {
	if ctx.Err() != nil {
		return time.Now() // shutting down
	}
	k.backoff = min(max(2*k.backoff, time.Second), 30*time.Second)
	k.log.Warn("webhook certificates: "+what+" failed", "err", err, "retry", k.backoff)
	return time.Now().Add(k.backoff)
}

// create makes the first CA and serving certificate and creates the Secret.
// The first replica wins; the others read what it wrote.
func (k *keeper) create(ctx context.Context) (*corev1.Secret, error) {
	now := time.Now()
	empty := &certs.Bundle{}
	b, err := certs.Apply(empty, certs.Plan(empty, now, k.policy, trustedEverywhere), now, k.policy)
	if err != nil {
		return nil, err
	}
	client := k.kube.CoreV1().Secrets(k.cfg.Namespace)
	s, err := client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      k.cfg.SecretName,
			Namespace: k.cfg.Namespace,
			Labels:    map[string]string{"app.kubernetes.io/managed-by": "cce-ipam"},
		},
		Type: corev1.SecretTypeTLS,
		Data: b.Data(),
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return client.Get(ctx, k.cfg.SecretName, metav1.GetOptions{})
	}
	if err != nil {
		k.metrics.writes.WithLabelValues("error").Inc()
		return nil, err
	}
	k.metrics.writes.WithLabelValues("created").Inc()
	k.log.Info("webhook Secret created", "secret", k.cfg.SecretName, "ca", b.CAs[0].Cert.SerialNumber.Text(16),
		"serving", b.Serving.Cert.SerialNumber.Text(16))
	return s, nil
}

// trustedEverywhere is certs.Plan's publication check for a first CA: there
// is no older one to overlap with.
func trustedEverywhere(*x509.Certificate) bool { return true }

// serve makes s's certificate the served one, once per resourceVersion. A
// certificate that does not parse leaves the previous one served.
func (k *keeper) serve(s *corev1.Secret) {
	if s.ResourceVersion == k.servedRV {
		return
	}
	sv, err := certs.ParseServing(s.Data)
	if err != nil {
		k.log.Warn("the webhook Secret holds no usable serving certificate", "secret", s.Name, "err", err)
		return
	}
	k.servedRV = s.ResourceVersion
	cert := sv.TLS
	k.serving.Store(&cert)
	k.metrics.notAfter.WithLabelValues("serving").Set(float64(sv.Cert.NotAfter.Unix()))
	k.once.Do(func() { close(k.loaded) })
	k.log.Debug("serving webhook certificate", "serial", sv.Cert.SerialNumber.Text(16), "notAfter", sv.Cert.NotAfter)
}

// maintain patches the caBundles and makes the changes certs.Plan asks
// for, writing the Secret with the resourceVersion it read: when another
// replica wrote first, it reloads and plans again.
func (k *keeper) maintain(ctx context.Context, s *corev1.Secret) time.Time {
	client := k.kube.CoreV1().Secrets(k.cfg.Namespace)
	for range 5 {
		b, err := certs.Parse(s.Data)
		if err != nil && k.warned != s.ResourceVersion {
			k.warned = s.ResourceVersion
			k.log.Warn("parts of the webhook Secret do not parse; they will be replaced", "secret", s.Name, "err", err)
		}
		if len(b.CAs) > 0 {
			k.metrics.notAfter.WithLabelValues("ca").Set(float64(b.CAs[len(b.CAs)-1].Cert.NotAfter.Unix()))
		}
		patchErr := k.patchCABundles(ctx, b)
		now := time.Now()
		d := certs.Plan(b, now, k.policy, k.published)
		if d.Empty() {
			wake := d.Wake
			if wake.IsZero() {
				wake = now.Add(time.Hour)
			}
			if patchErr != nil {
				return earliest(wake, k.failed(ctx, "patch the caBundle", patchErr))
			}
			k.backoff = 0
			return wake
		}
		nb, err := certs.Apply(b, d, now, k.policy)
		if err != nil {
			return k.failed(ctx, "renew", err)
		}
		upd := s.DeepCopy()
		if upd.Data == nil {
			upd.Data = map[string][]byte{}
		}
		maps.Copy(upd.Data, nb.Data())
		got, err := client.Update(ctx, upd, metav1.UpdateOptions{})
		switch {
		case err == nil:
			k.metrics.writes.WithLabelValues("rotated").Inc()
			k.log.Info("webhook certificates renewed", "changes", d.String())
			s = got
		case apierrors.IsConflict(err):
			k.metrics.writes.WithLabelValues("conflict").Inc()
			k.log.Debug("another replica renewed the webhook certificates first; reloading")
			if s, err = client.Get(ctx, k.cfg.SecretName, metav1.GetOptions{}); err != nil {
				return k.failed(ctx, "reload the webhook Secret", err)
			}
		default:
			k.metrics.writes.WithLabelValues("error").Inc()
			return k.failed(ctx, "renew", err)
		}
		k.serve(s)
	}
	return time.Now() // still changing: look again at once
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// published reports whether every webhook of the managed configurations
// trusts ca (configurations that do not exist count as trusting it).
func (k *keeper) published(ca *x509.Certificate) bool {
	for _, bundle := range k.caBundles() {
		if !certs.Contains(bundle, ca) {
			return false
		}
	}
	return true
}

func (k *keeper) caBundles() [][]byte {
	var out [][]byte
	if k.mutating != nil {
		if c, err := k.mutating.Get(k.cfg.MutatingConfigName); err == nil {
			for _, w := range c.Webhooks {
				out = append(out, w.ClientConfig.CABundle)
			}
		}
	}
	if k.validating != nil {
		if c, err := k.validating.Get(k.cfg.ValidatingConfigName); err == nil {
			for _, w := range c.Webhooks {
				out = append(out, w.ClientConfig.CABundle)
			}
		}
	}
	return out
}
