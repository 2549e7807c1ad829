package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// parseRef parses args as main does, with env as the environment.
func parseRef(t *testing.T, env map[string]string, args ...string) (options, *refFlags, error) {
	t.Helper()
	var o options
	fs := pflag.NewFlagSet("cce-ipam", pflag.ContinueOnError)
	fs.SetOutput(&bytes.Buffer{})
	o.registerFlags(fs)
	ref := registerRefFlags(fs, &o)
	if err := fs.Parse(refArgs(args)); err != nil {
		return o, ref, err
	}
	err := ref.apply(&o, func(k string) string { return env[k] })
	return o, ref, err
}

// Every flag of the reference (spec §10) is accepted: with the same name and
// meaning as ours, or listed in --help as DEPRECATED with what it maps to.
func TestRefFlags_HelpListsEveryReferenceFlag(t *testing.T) {
	var o options
	fs := pflag.NewFlagSet("cce-ipam", pflag.ContinueOnError)
	o.registerFlags(fs)
	registerRefFlags(fs, &o)
	help := fs.FlagUsages()
	ours := []string{"kubeconfig", "vpc-id", "cluster-id", "cni-mode", "eni-sync-period", "gc-period",
		"allocate-ip-concurrency-limit", "release-ip-concurrency-limit", "batch-add-ip-num", "idle-ip-pool-max-size",
		"idle-ip-pool-min-size", "subnet-available-index", "webhook-service-name", "webhook-secret-name"}
	for _, name := range ours {
		f := fs.Lookup(name)
		if f == nil || strings.HasPrefix(f.Usage, refPrefix) {
			t.Errorf("--%s: want it as one of our own flags, got %+v", name, f)
		}
	}
	mapped := map[string]string{
		"resync-period": "ignored", "access-key": "use --bce-access-key-id", "secret-access-key": "use --bce-secret-access-key",
		"region": "use --bce-region", "port": "use --grpc-listen", "debug-port": "use --metrics-listen",
		"subnet-selection-policy": "use --eni-subnet-selection", "ip-mutating-rate": "use --bce-rate",
		"ip-mutating-burst": "use --bce-burst", "debug": "use --log-level=debug", "leader-elect": "false is refused",
		"lease-duration": "use --leader-elect-lease-duration", "renew-deadline": "use --leader-elect-renew-deadline",
		"retry-period": "use --leader-elect-retry-period", "leader-elect-resource-lock": "other kinds are refused",
		"leader-elect-resource-name":      "use --leader-elect-lease-name",
		"leader-elect-resource-namespace": "use --leader-elect-lease-namespace",
		"webhook-port":                    "use --webhook-listen", "webhook-certs": "ignored",
		"mutating-webhook-configuration-name":   "use --webhook-mutating-configuration-name",
		"validting-webhook-configuration-name":  "use --webhook-validating-configuration-name",
		"enable-pod-subnet-topology-webhook":    "ignored",
		"enable-pod-ip-resources-webhook":       "ignored",
		"enable-pod-topology-scheduler-webhook": "ignored",
		// klog's
		"v": "use --log-level", "logtostderr": "ignored", "alsologtostderr": "ignored", "log-file": "ignored",
		"log-file-max-size": "ignored", "log-dir": "ignored", "skip-headers": "ignored", "vmodule": "ignored",
		"stderrthreshold": "ignored", "add-dir-header": "ignored", "one-output": "ignored", "skip-log-headers": "ignored",
	}
	for name, want := range mapped {
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("--%s not accepted", name)
			continue
		}
		if f.Hidden || f.Deprecated != "" {
			t.Errorf("--%s is hidden from --help", name)
		}
		if !strings.HasPrefix(f.Usage, refPrefix) || !strings.Contains(f.Usage, want) {
			t.Errorf("--%s usage %q: want %q after %q", name, f.Usage, want, refPrefix)
		}
		if !strings.Contains(help, "--"+name+" ") {
			t.Errorf("--%s missing from --help", name)
		}
	}
}

// The reference chart's container args start a correctly configured replica.
func TestRefFlags_ReferenceChartArgs(t *testing.T) {
	o, ref, err := parseRef(t, nil, "--eni-sync-period=20s", "--gc-period=120s", "--port=9997", "--debug-port=9998",
		"--region=gz", "--vpc-id=vpc-1", "--cluster-id=cce-1", "--cni-mode=vpc-secondary-ip-veth",
		"--ip-mutating-rate=7", "--ip-mutating-burst=3", "--subnet-selection-policy=LeastENI",
		"-lease-duration=20s", "--logtostderr", "--log-file=/var/log/cce/cce-eni-ipam.log", "--log-file-max-size=1800",
		"-v=6", "--leader-elect=true", "--webhook-port=18921")
	if err != nil {
		t.Fatal(err)
	}
	checks := map[string][2]any{
		"grpc":     {o.grpcListen, ":9997"},
		"metrics":  {o.metricsListen, ":9998"},
		"webhook":  {o.webhook.Listen, ":18921"},
		"region":   {o.cloud.Region, "gz"},
		"rate":     {o.cloud.Rate, 7.0},
		"burst":    {o.cloud.Burst, int64(3)},
		"subnets":  {o.ipam.SubnetSelection, "LeastENI"},
		"lease":    {o.leader.LeaseDuration, 20 * time.Second},
		"eniSync":  {o.ipam.ENISyncPeriod, 20 * time.Second},
		"gc":       {o.ipam.GCPeriod, 120 * time.Second},
		"logLevel": {o.logLevel, "debug"},
		"cniMode":  {o.ipam.CNIMode, "vpc-secondary-ip-veth"},
	}
	for name, c := range checks {
		if c[0] != c[1] {
			t.Errorf("%s = %v, want %v", name, c[0], c[1])
		}
	}
	// Each use is logged once: deprecated aliases and ignored flags.
	var buf bytes.Buffer
	ref.logNotes(slog.New(slog.NewJSONHandler(&buf, nil)))
	for _, want := range []string{`"flag":"--port","use":"--grpc-listen=:9997"`, `"flag":"--region","use":"--bce-region"`,
		`"flag":"--log-file","why":"logs go to stderr only`, `"flag":"--lease-duration"`, `"flag":"--v","use":"--log-level=debug"`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, buf.String())
		}
	}
	if n := strings.Count(buf.String(), `"flag":"--port"`); n != 1 {
		t.Errorf("--port logged %d times", n)
	}
}

func TestRefFlags_AliasesSetOurs(t *testing.T) {
	o, _, err := parseRef(t, nil, "--access-key=AK", "--secret-access-key=SK", "--renew-deadline=7s", "--retry-period=1s",
		"--leader-elect-resource-name=cce-ipam", "--leader-elect-resource-namespace=ns1",
		"--mutating-webhook-configuration-name=m", "--validting-webhook-configuration-name=v", "--debug")
	if err != nil {
		t.Fatal(err)
	}
	if o.cloud.AccessKeyID != "AK" || o.cloud.SecretAccessKey != "SK" || o.leader.RenewDeadline != 7*time.Second ||
		o.leader.RetryPeriod != time.Second || o.leader.Name != "cce-ipam" || o.leader.Namespace != "ns1" ||
		o.webhook.MutatingConfigName != "m" || o.webhook.ValidatingConfigName != "v" || o.logLevel != "debug" {
		t.Fatalf("options %+v", o)
	}
	if o.cloud.UsesGateway() {
		t.Fatal("AK/SK given through the reference flags, yet the gateway chosen")
	}
}

func TestRefFlags_Refused(t *testing.T) {
	for name, args := range map[string][]string{
		"leader-elect=false":       {"--leader-elect=false"},
		"resource lock configmaps": {"--leader-elect-resource-lock=configmaps"},
		"port out of range":        {"--port=70000"},
		"port and grpc-listen":     {"--port=1", "--grpc-listen=:2"},
		"region twice":             {"--region=bj", "--bce-region=gz"},
		"bad selection":            {"--subnet-selection-policy=Random"},
		"bad duration":             {"--lease-duration=soon"},
	} {
		o, _, err := parseRef(t, nil, args...)
		if err == nil {
			// Some values are refused by the component's own validation.
			o.ipam.ClusterID, o.ipam.VPCID = "c", "v"
			if verr := o.ipam.Validate(); verr != nil {
				continue
			}
			t.Errorf("%s: accepted", name)
		} else if name == "leader-elect=false" && !strings.Contains(err.Error(), "always elect a leader") {
			t.Errorf("%s: unclear error %v", name, err)
		}
	}
}

func TestRefFlags_Environment(t *testing.T) {
	env := map[string]string{"BCC_ENDPOINT": "bcc.example:8080", "CCE_GATEWAY_ENDPOINT": "gw.example:81",
		"DATASTORE_ADDRESS_COOLING_PERIOD": "30", "BBC_ENDPOINT": "bbc.example"}
	o, ref, err := parseRef(t, env)
	if err != nil {
		t.Fatal(err)
	}
	if o.cloud.Endpoint != "bcc.example:8080" || o.cloud.GatewayEndpoint != "gw.example:81" || o.ipam.Cooldown != 30*time.Second {
		t.Fatalf("from env: endpoint %q gateway %q cooling %v", o.cloud.Endpoint, o.cloud.GatewayEndpoint, o.ipam.Cooldown)
	}
	var buf bytes.Buffer
	ref.logNotes(slog.New(slog.NewJSONHandler(&buf, nil)))
	if !strings.Contains(buf.String(), "BBC_ENDPOINT ignored") {
		t.Errorf("BBC_ENDPOINT not logged: %s", buf.String())
	}
	// Flags win.
	env["DATASTORE_ADDRESS_COOLING_PERIOD"] = "2m"
	o, _, err = parseRef(t, env, "--bce-endpoint=flag:1", "--cce-gateway-endpoint=flaggw", "--ip-cooling-period=7s")
	if err != nil {
		t.Fatal(err)
	}
	if o.cloud.Endpoint != "flag:1" || o.cloud.GatewayEndpoint != "flaggw" || o.ipam.Cooldown != 7*time.Second {
		t.Fatalf("flags lost to env: %q %q %v", o.cloud.Endpoint, o.cloud.GatewayEndpoint, o.ipam.Cooldown)
	}
	for _, bad := range []string{"soon", "-5s", "1.5"} {
		if _, _, err := parseRef(t, map[string]string{"DATASTORE_ADDRESS_COOLING_PERIOD": bad}); err == nil ||
			!strings.Contains(err.Error(), "DATASTORE_ADDRESS_COOLING_PERIOD") {
			t.Errorf("cooling %q: %v", bad, err)
		}
	}
}

func TestRefArgs(t *testing.T) {
	got := strings.Join(refArgs([]string{"-lease-duration=5s", "-v", "4", "-v=2", "--port=1", "-logtostderr", "--", "-x-y"}), " ")
	want := "--lease-duration=5s -v 4 -v=2 --port=1 --logtostderr -- -x-y"
	if got != want {
		t.Fatalf("refArgs = %q, want %q", got, want)
	}
}
