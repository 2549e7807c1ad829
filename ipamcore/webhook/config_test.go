package webhook

import (
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestConfig_DefaultsAreTheFlags(t *testing.T) {
	var flagged Config
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	flagged.RegisterFlags(fs)
	want := Config{
		Listen: ":18921", ServiceName: "cce-ipam-webhook", SecretName: "cce-ipam-webhook-certs",
		MutatingConfigName: "cce-ipam", ValidatingConfigName: "cce-ipam",
		CAValidity: 5 * 365 * 24 * time.Hour, ServingValidity: 365 * 24 * time.Hour,
		ZoneLabel: "topology.kubernetes.io/zone", ZoneFormat: ZoneFormatCCE,
	}
	if !reflect.DeepEqual(flagged, want) || !reflect.DeepEqual(DefaultConfig(), want) {
		t.Fatalf("flag defaults %+v\nDefaultConfig %+v\nwant %+v", flagged, DefaultConfig(), want)
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("the (disabled) default rejected: %v", err)
	}
	on := DefaultConfig()
	on.Enabled, on.Namespace = true, "kube-system"
	if err := on.Validate(); err != nil {
		t.Fatalf("the default, enabled in a namespace, rejected: %v", err)
	}
	if err := fs.Parse([]string{"--webhook-cert-ip-addresses=127.0.0.1,::1", "--webhook-cert-dns-names=a.example,b.example"}); err != nil {
		t.Fatal(err)
	}
	if len(flagged.ExtraIPs) != 2 || len(flagged.ExtraDNSNames) != 2 {
		t.Fatalf("lists not parsed: %v %v", flagged.ExtraIPs, flagged.ExtraDNSNames)
	}
}

func TestConfig_Validate_Rejects(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(*Config)
		want string
	}{
		"no namespace":      {func(c *Config) { c.Namespace = "" }, "namespace"},
		"bad listen":        {func(c *Config) { c.Listen = "18921" }, "--webhook-listen"},
		"bad secret":        {func(c *Config) { c.SecretName = "Certs!" }, "--webhook-secret-name"},
		"bad zone label":    {func(c *Config) { c.ZoneLabel = "a b" }, "--webhook-zone-label"},
		"bad zone format":   {func(c *Config) { c.ZoneFormat = "short" }, "--webhook-zone-format"},
		"CA below serving":  {func(c *Config) { c.CAValidity = time.Hour }, "validities"},
		"serving too short": {func(c *Config) { c.ServingValidity = time.Second }, "validities"},
		"bad extra name":    {func(c *Config) { c.ExtraDNSNames = []string{"-x-"} }, "--webhook-cert-dns-names"},
	} {
		c := DefaultConfig()
		c.Enabled, c.Namespace = true, "kube-system"
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error about %s", name, err, tc.want)
		}
	}
}

func TestConfig_PolicyNamesTheService(t *testing.T) {
	c := DefaultConfig()
	c.Namespace, c.ExtraIPs = "kube-system", []net.IP{net.ParseIP("127.0.0.1")}
	p := c.policy()
	want := []string{"cce-ipam-webhook.kube-system.svc", "cce-ipam-webhook.kube-system.svc.cluster.local"}
	if !reflect.DeepEqual(p.DNSNames, want) || len(p.IPs) != 1 {
		t.Fatalf("names %v %v, want %v and the IP", p.DNSNames, p.IPs, want)
	}
}

func TestNew_RefusesADisabledOrIncompleteConfig(t *testing.T) {
	if _, err := New(DefaultConfig(), Deps{}, nil, nil); err == nil {
		t.Error("New accepted a disabled config")
	}
	c := DefaultConfig()
	c.Enabled, c.Namespace = true, "kube-system"
	if _, err := New(c, Deps{}, nil, nil); err == nil {
		t.Error("New accepted no clients")
	}
}
