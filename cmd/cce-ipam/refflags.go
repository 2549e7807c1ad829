package main

// The reference cce-eni-ipam's command line (spec §10) and environment,
// so that its Deployment's args work unchanged: each reference flag is an
// alias of ours (marked DEPRECATED in --help, with what it maps to, and
// logged once when used), or accepted and ignored with a log line where its
// value has no meaning here, or refused with a clear error where accepting
// it would mislead. Flags with the same name and meaning in both (e.g.
// --eni-sync-period, --gc-period, --cni-mode, --cluster-id) are simply ours.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

const refPrefix = "DEPRECATED (reference cce-eni-ipam flag): "

// refFlags are the reference's flags registered on a flag set, and what
// their use leaves to log once the logger exists.
type refFlags struct {
	fs      *pflag.FlagSet
	aliases map[string]string // reference flag → ours
	notes   []refNote
	// Values of the reference flags that are not plain aliases.
	port, debugPort, webhookPort int
	debug, leaderElect           bool
	verbosity                    int
	resourceLock                 string
}

type refNote struct {
	level slog.Level
	msg   string
	attrs []any
}

// refIgnored are reference flags accepted and ignored, with why: their
// value has no meaning here (the reason is in --help and in the log).
var refIgnored = []struct{ name, kind, why string }{
	{"resync-period", "duration", "informers here do not resync periodically; the ENI sync, pool check and GC have periods of their own"},
	{"webhook-certs", "string", "the webhook certificate is kept in the Secret --webhook-secret-name (or by cert-manager)"},
	{"enable-pod-subnet-topology-webhook", "bool", "the PSTS pod webhook is served with --webhook-enabled"},
	{"enable-pod-ip-resources-webhook", "bool", "no pod IP-resources webhook here; --webhook-enabled serves the PSTS ones"},
	{"enable-pod-topology-scheduler-webhook", "bool", "no topology-scheduler webhook here; --webhook-enabled serves the PSTS ones"},
	// klog's flags: one JSON (or text) stream on stderr instead
	// (--log-format, --log-level); -v is mapped, below.
	{"logtostderr", "bool", "logs always go to stderr"},
	{"alsologtostderr", "bool", "logs always go to stderr"},
	{"log-file", "string", "logs go to stderr only (collect them there); no file is written"},
	{"log-file-max-size", "uint", "logs go to stderr only; no file is written"},
	{"log-dir", "string", "logs go to stderr only; no file is written"},
	{"add-dir-header", "bool", "log lines are structured (--log-format)"},
	{"skip-headers", "bool", "log lines are structured (--log-format)"},
	{"skip-log-headers", "bool", "log lines are structured (--log-format)"},
	{"one-output", "bool", "logs go to stderr only"},
	{"stderrthreshold", "string", "every line at or above --log-level goes to stderr"},
	{"vmodule", "string", "use --log-level"},
	{"log-backtrace-at", "string", "use --log-level"},
	{"log-flush-frequency", "duration", "log lines are written at once"},
}

// registerRefFlags adds the reference's flags to fs, beside ours (already
// registered by options.registerFlags).
func registerRefFlags(fs *pflag.FlagSet, o *options) *refFlags {
	r := &refFlags{fs: fs, aliases: map[string]string{}}
	alias := func(ref, ours string) {
		f := fs.Lookup(ours)
		a := fs.VarPF(f.Value, ref, "", refPrefix+"use --"+ours)
		a.NoOptDefVal = f.NoOptDefVal // a bool stays usable as --flag
		a.DefValue = f.DefValue
		r.aliases[ref] = ours
	}
	alias("region", "bce-region")
	alias("access-key", "bce-access-key-id")
	alias("secret-access-key", "bce-secret-access-key")
	alias("ip-mutating-rate", "bce-rate")
	alias("ip-mutating-burst", "bce-burst")
	// Same values (MostFreeIP, LeastENI) as the reference.
	alias("subnet-selection-policy", "eni-subnet-selection")
	alias("lease-duration", "leader-elect-lease-duration")
	alias("renew-deadline", "leader-elect-renew-deadline")
	alias("retry-period", "leader-elect-retry-period")
	alias("leader-elect-resource-name", "leader-elect-lease-name")
	alias("leader-elect-resource-namespace", "leader-elect-lease-namespace")
	alias("mutating-webhook-configuration-name", "webhook-mutating-configuration-name")
	// The reference's spelling.
	alias("validting-webhook-configuration-name", "webhook-validating-configuration-name")

	// Ports become our listen addresses (all interfaces, as the reference).
	fs.IntVar(&r.port, "port", 0, refPrefix+"use --grpc-listen (--port=N is --grpc-listen=:N)")
	fs.IntVar(&r.debugPort, "debug-port", 0, refPrefix+"use --metrics-listen (--debug-port=N is --metrics-listen=:N)")
	fs.IntVar(&r.webhookPort, "webhook-port", 0, refPrefix+"use --webhook-listen (--webhook-port=N is --webhook-listen=:N)")
	fs.BoolVar(&r.debug, "debug", false, refPrefix+"use --log-level=debug (--debug sets it; the reference's per-pod latency gauge "+
		"is not provided)")
	fs.IntVarP(&r.verbosity, "v", "v", 0, refPrefix+"klog verbosity: use --log-level (-v 4 or more sets --log-level=debug, "+
		"lower values are ignored)")
	// --leader-elect=false would say one replica runs without election; here
	// the replicas always elect a leader for the singletons and share the
	// nodes, so it is refused rather than silently not honoured.
	fs.BoolVar(&r.leaderElect, "leader-elect", true, refPrefix+"always on here (replicas elect a leader and share the nodes); "+
		"true is accepted, false is refused")
	fs.StringVar(&r.resourceLock, "leader-elect-resource-lock", "leases", refPrefix+
		"the leader lock is always a Lease (--leader-elect-lease-name); leases is accepted, other kinds are refused")
	for _, ig := range refIgnored {
		usage := refPrefix + "ignored: " + ig.why
		switch ig.kind {
		case "bool":
			fs.Bool(ig.name, false, usage)
		case "duration":
			fs.Duration(ig.name, 0, usage)
		case "uint":
			fs.Uint64(ig.name, 0, usage)
		default:
			fs.String(ig.name, "", usage)
		}
	}
	return r
}

// refArgs rewrites the single-dash long flags of Go's flag package, which
// the reference (klog, -lease-duration) accepts, to pflag's double dash;
// single letters (-v 4) are pflag shorthands already. Everything after "--"
// is left alone.
func refArgs(args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		if len(a) > 2 && a[0] == '-' && a[1] != '-' {
			name, _, _ := strings.Cut(a[1:], "=")
			if len(name) > 1 {
				a = "-" + a
			}
		}
		out = append(out, a)
	}
	return out
}

// apply runs after parsing: it maps the reference flags that are not plain
// aliases, refuses the misleading values, applies the reference's
// environment variables (a flag given on the command line wins), and notes
// what to log.
func (r *refFlags) apply(o *options, getenv func(string) string) error {
	fs := r.fs
	var errs []error
	for ref, ours := range r.aliases {
		if fs.Changed(ref) {
			if fs.Changed(ours) {
				errs = append(errs, fmt.Errorf("--%s and --%s are the same setting: give one", ref, ours))
			}
			fs.Lookup(ours).Changed = true // later defaults see it as given
			r.deprecated(ref, "--"+ours)
		}
	}
	portTo := func(ref, ours string, port int, dst *string) {
		if !fs.Changed(ref) {
			return
		}
		if port < 1 || port > 65535 {
			errs = append(errs, fmt.Errorf("--%s=%d: want a port in 1-65535", ref, port))
			return
		}
		if fs.Changed(ours) {
			errs = append(errs, fmt.Errorf("--%s and --%s are the same setting: give one", ref, ours))
			return
		}
		*dst = net.JoinHostPort("", strconv.Itoa(port))
		fs.Lookup(ours).Changed = true
		r.deprecated(ref, "--"+ours+"="+*dst)
	}
	portTo("port", "grpc-listen", r.port, &o.grpcListen)
	portTo("debug-port", "metrics-listen", r.debugPort, &o.metricsListen)
	portTo("webhook-port", "webhook-listen", r.webhookPort, &o.webhook.Listen)
	if fs.Changed("debug") && r.debug {
		r.debugLevel(o, "debug")
	}
	if fs.Changed("v") {
		if r.verbosity >= 4 {
			r.debugLevel(o, "v")
		} else {
			r.ignored("v", "below 4 it changes nothing; use --log-level")
		}
	}
	if fs.Changed("leader-elect") {
		if !r.leaderElect {
			errs = append(errs, errors.New("--leader-elect=false is refused: cce-ipam replicas always elect a leader for the "+
				"cluster-wide duties and share the nodes among themselves (fenced by Leases); running several replicas "+
				"without election has no safe meaning here. Remove the flag (one replica: set replicas to 1)"))
		} else {
			r.ignored("leader-elect", "leader election is always on")
		}
	}
	if fs.Changed("leader-elect-resource-lock") {
		if r.resourceLock != "leases" {
			errs = append(errs, fmt.Errorf("--leader-elect-resource-lock=%s is refused: the leader lock is always a "+
				"coordination.k8s.io Lease (leases)", r.resourceLock))
		} else {
			r.ignored("leader-elect-resource-lock", "the lock is always a Lease")
		}
	}
	for _, ig := range refIgnored {
		if fs.Changed(ig.name) {
			r.ignored(ig.name, ig.why)
		}
	}
	errs = append(errs, r.applyEnv(o, getenv))
	sort.SliceStable(r.notes, func(i, j int) bool { return r.notes[i].msg < r.notes[j].msg })
	return errors.Join(errs...)
}

// applyEnv honours the reference's environment variables; a flag given on
// the command line wins.
func (r *refFlags) applyEnv(o *options, getenv func(string) string) error {
	fs := r.fs
	if v := getenv("BCC_ENDPOINT"); v != "" {
		if fs.Changed("bce-endpoint") {
			r.note(slog.LevelInfo, "BCC_ENDPOINT ignored: --bce-endpoint is given", "env", v)
		} else {
			o.cloud.Endpoint = v
			r.note(slog.LevelInfo, "BCE endpoint from BCC_ENDPOINT", "endpoint", v)
		}
	}
	if v := getenv("BBC_ENDPOINT"); v != "" {
		// BBC instances are served through the BCC API here; the BBC API is not called.
		r.note(slog.LevelWarn, "BBC_ENDPOINT ignored: cce-ipam does not call the BBC API", "env", v)
	}
	if v := getenv("CCE_GATEWAY_ENDPOINT"); v != "" {
		if fs.Changed("cce-gateway-endpoint") {
			r.note(slog.LevelInfo, "CCE_GATEWAY_ENDPOINT ignored: --cce-gateway-endpoint is given", "env", v)
		} else {
			o.cloud.GatewayEndpoint = v
			if !o.cloud.UsesGateway() {
				r.note(slog.LevelInfo, "CCE_GATEWAY_ENDPOINT set but AK/SK are given: the gateway is not used", "env", v)
			}
		}
	}
	if v := getenv("DATASTORE_ADDRESS_COOLING_PERIOD"); v != "" {
		d, err := parseEnvDuration(v)
		if err != nil {
			return fmt.Errorf("DATASTORE_ADDRESS_COOLING_PERIOD=%q: %w", v, err)
		}
		if fs.Changed("ip-cooling-period") {
			r.note(slog.LevelInfo, "DATASTORE_ADDRESS_COOLING_PERIOD ignored: --ip-cooling-period is given", "env", v)
		} else {
			o.ipam.Cooldown = d
			r.note(slog.LevelInfo, "IP cooling period from DATASTORE_ADDRESS_COOLING_PERIOD", "period", d.String())
		}
	}
	return nil
}

// parseEnvDuration reads a duration ("30s") or whole seconds ("30").
func parseEnvDuration(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	d, err := time.ParseDuration(v)
	if err != nil {
		n, nerr := strconv.ParseInt(v, 10, 64)
		if nerr != nil || n > int64(time.Duration(1<<63-1)/time.Second) {
			return 0, errors.New("want a duration such as 5s, or whole seconds")
		}
		d = time.Duration(n) * time.Second
	}
	if d < 0 {
		return 0, errors.New("must not be negative")
	}
	return d, nil
}

func (r *refFlags) debugLevel(o *options, ref string) {
	if r.fs.Changed("log-level") {
		r.ignored(ref, "--log-level is given")
		return
	}
	o.logLevel = "debug"
	r.deprecated(ref, "--log-level=debug")
}

func (r *refFlags) deprecated(ref, ours string) {
	r.note(slog.LevelWarn, "deprecated reference flag used", "flag", "--"+ref, "use", ours)
}

func (r *refFlags) ignored(ref, why string) {
	r.note(slog.LevelWarn, "reference flag accepted and ignored", "flag", "--"+ref, "why", why)
}

func (r *refFlags) note(level slog.Level, msg string, attrs ...any) {
	r.notes = append(r.notes, refNote{level: level, msg: msg, attrs: attrs})
}

// logNotes logs, once, what the reference flags and environment did.
func (r *refFlags) logNotes(log *slog.Logger) {
	for _, n := range r.notes {
		log.Log(context.Background(), n.level, n.msg, n.attrs...)
	}
}
