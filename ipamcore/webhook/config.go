package webhook

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/cce-ipam/sharded/ipamcore/webhook/certs"
)

// Zone formats: how a Subnet's availability zone (BCE's name, "cn-bj-a")
// becomes the value of the node zone label in the pods' affinity.
const (
	// ZoneFormatCCE turns "cn-bj-a" into "zoneA": what CCE writes into its
	// nodes' topology.kubernetes.io/zone label, and what the reference
	// webhook writes into the affinity.
	ZoneFormatCCE = "cce"
	// ZoneFormatRaw keeps BCE's zone name: for clusters whose nodes carry
	// it (self-built clusters, the kubelet simulator).
	ZoneFormatRaw = "raw"
)

// Config configures the webhooks. The default is the flags' (RegisterFlags,
// DefaultConfig).
type Config struct {
	// Enabled serves the webhooks. Defaults to false: the chart turns it on,
	// and processes started without the chart (tests, the demo) need no
	// certificates or webhook permissions.
	Enabled bool
	// Listen is the HTTPS address. Defaults to ":18921", the reference's
	// webhook port.
	Listen string
	// Namespace holds the Secret and the Service. It has no flag of its own:
	// the caller sets it to the replicas' namespace (cce-ipam's --namespace).
	Namespace string
	// ServiceName is the Service in front of the replicas' webhook port; its
	// DNS names are in the serving certificate. Defaults to
	// "cce-ipam-webhook".
	ServiceName string
	// SecretName is the Secret every replica serves the certificate of.
	// Defaults to "cce-ipam-webhook-certs".
	SecretName string
	// MutatingConfigName and ValidatingConfigName are the webhook
	// configurations whose caBundle the replicas keep; empty manages none.
	// Default to "cce-ipam".
	MutatingConfigName   string
	ValidatingConfigName string
	// CertManager: cert-manager writes the Secret and injects the caBundle;
	// the replicas only read and serve it. Defaults to false.
	CertManager bool
	// CAValidity and ServingValidity are the lifetimes of a new CA (default
	// 5 years) and serving certificate (default 1 year). Each is renewed
	// when less than a third of it is left.
	CAValidity      time.Duration
	ServingValidity time.Duration
	// ExtraDNSNames and ExtraIPs are added to the serving certificate's
	// names, e.g. 127.0.0.1 when the API server calls a URL.
	ExtraDNSNames []string
	ExtraIPs      []net.IP
	// ZoneLabel is the node label the pods' affinity selects zones by.
	// Defaults to topology.kubernetes.io/zone, the reference's key.
	ZoneLabel string
	// ZoneFormat is ZoneFormatCCE (default) or ZoneFormatRaw.
	ZoneFormat string
}

// RegisterFlags binds the config to flags and sets the defaults.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&c.Enabled, "webhook-enabled", false,
		"serve the admission webhooks (PSTS pod mutation, PSTS validation) with a self-managed or cert-manager certificate")
	fs.StringVar(&c.Listen, "webhook-listen", ":18921", "HTTPS address of the admission webhooks")
	fs.StringVar(&c.ServiceName, "webhook-service-name", "cce-ipam-webhook",
		"Service (in --namespace) through which the API server calls the webhooks; its DNS names are in the certificate")
	fs.StringVar(&c.SecretName, "webhook-secret-name", "cce-ipam-webhook-certs",
		"Secret (in --namespace) with the webhooks' CA and serving certificate, shared by every replica")
	fs.StringVar(&c.MutatingConfigName, "webhook-mutating-configuration-name", "cce-ipam",
		"MutatingWebhookConfiguration whose caBundle the replicas keep current (empty: none)")
	fs.StringVar(&c.ValidatingConfigName, "webhook-validating-configuration-name", "cce-ipam",
		"ValidatingWebhookConfiguration whose caBundle the replicas keep current (empty: none)")
	fs.BoolVar(&c.CertManager, "webhook-cert-manager", false,
		"cert-manager writes the webhook Secret and injects the caBundle; the replicas only serve the Secret")
	fs.DurationVar(&c.CAValidity, "webhook-ca-validity", 5*365*24*time.Hour,
		"lifetime of a new webhook CA; a successor is added when a third is left")
	fs.DurationVar(&c.ServingValidity, "webhook-cert-validity", 365*24*time.Hour,
		"lifetime of a new webhook serving certificate; it is renewed when a third is left")
	fs.StringSliceVar(&c.ExtraDNSNames, "webhook-cert-dns-names", nil,
		"more DNS names of the serving certificate (the Service's are always in)")
	fs.IPSliceVar(&c.ExtraIPs, "webhook-cert-ip-addresses", nil, "IP addresses of the serving certificate")
	fs.StringVar(&c.ZoneLabel, "webhook-zone-label", "topology.kubernetes.io/zone",
		"node label by which PSTS pods get a required affinity to their subnets' zones")
	fs.StringVar(&c.ZoneFormat, "webhook-zone-format", ZoneFormatCCE,
		"zone label values: cce (BCE zone cn-bj-a is node label zoneA, as CCE labels nodes) or raw (cn-bj-a)")
}

// DefaultConfig is the config of a command line without flags.
func DefaultConfig() Config {
	var c Config
	c.RegisterFlags(pflag.NewFlagSet("webhook", pflag.ContinueOnError))
	return c
}

// Validate reports a config that cannot work. A disabled config is always
// valid.
func (c Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("webhook: --webhook-listen %q: %w", c.Listen, err))
	}
	for what, v := range map[string]string{"the namespace": c.Namespace, "--webhook-service-name": c.ServiceName,
		"--webhook-secret-name": c.SecretName} {
		if msgs := validation.IsDNS1123Subdomain(v); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("webhook: %s %q: %v", what, v, msgs))
		}
	}
	if msgs := validation.IsQualifiedName(c.ZoneLabel); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("webhook: --webhook-zone-label %q: %v", c.ZoneLabel, msgs))
	}
	if c.ZoneFormat != ZoneFormatCCE && c.ZoneFormat != ZoneFormatRaw {
		errs = append(errs, fmt.Errorf("webhook: --webhook-zone-format %q: want %s or %s", c.ZoneFormat, ZoneFormatCCE, ZoneFormatRaw))
	}
	if c.ServingValidity < 3*time.Second || c.CAValidity < c.ServingValidity {
		errs = append(errs, fmt.Errorf("webhook: validities CA %s, serving %s: want serving ≥ 3s and CA ≥ serving",
			c.CAValidity, c.ServingValidity))
	}
	for _, n := range c.ExtraDNSNames {
		if msgs := validation.IsDNS1123Subdomain(n); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("webhook: --webhook-cert-dns-names %q: %v", n, msgs))
		}
	}
	return errors.Join(errs...)
}

// policy is the certificates' policy: the Service's DNS names and the
// extra names.
func (c Config) policy() certs.Policy {
	svc := c.ServiceName + "." + c.Namespace + ".svc"
	return certs.Policy{
		CAValidity:      c.CAValidity,
		ServingValidity: c.ServingValidity,
		DNSNames:        append([]string{svc, svc + ".cluster.local"}, c.ExtraDNSNames...),
		IPs:             c.ExtraIPs,
	}
}
