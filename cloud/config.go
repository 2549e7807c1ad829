package cloud

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Files a mounted Kubernetes Secret provides in Config.CredentialsDir.
const (
	AccessKeyIDFile     = "access-key-id"
	SecretAccessKeyFile = "secret-access-key"
)

// Config configures a Client. The defaults are the flags' (RegisterFlags,
// DefaultConfig); New uses the values as they are, and Validate refuses the
// ones it cannot use.
type Config struct {
	// Endpoint is BCE's BCC endpoint (host:port or a URL) serving /v1/eni,
	// /v1/subnet and /v2/instance. Empty: bcc.<Region>.baidubce.com, the
	// region's public endpoint.
	Endpoint string
	// Region is the BCE region, e.g. "bj" (the flag's default).
	Region string
	// AccessKeyID and SecretAccessKey authenticate; when both are empty they
	// are read from CredentialsDir. Never logged.
	AccessKeyID     string
	SecretAccessKey string
	// CredentialsDir holds the files access-key-id and secret-access-key (a
	// mounted Secret).
	CredentialsDir string
	// With neither AK/SK nor CredentialsDir the client authenticates through
	// the CCE gateway (gateway.go), as the reference does inside CCE:
	// GatewayEndpoint is its host or host:port (empty:
	// cce-gateway.<Region>.baidubce.com:80; the command fills it from
	// CCE_GATEWAY_ENDPOINT); the token is read from the Secret
	// GatewayTokenSecret ("namespace/name", empty: not tried, needs
	// WithSecretGetter), else from the files token and expiredAt in
	// GatewayTokenDir (empty: not tried). ClusterID is sent in cce-cluster
	// (the command copies --cluster-id).
	GatewayEndpoint    string
	GatewayTokenSecret string
	GatewayTokenDir    string
	ClusterID          string
	// Rate and Burst size the client-side token bucket shared by every call.
	// The flags default to 10/s and 5, the upstream's. Change at run time
	// with SetRate.
	Rate  float64
	Burst int64
	// ThrottleRetries is how often a call answered RateLimit is retried by
	// this client (the SDK never retries 429). The flag defaults to 3; zero
	// or negative: none.
	// An Urgent call retries twenty times as often.
	ThrottleRetries int
	// ThrottleBackoff is the base of the jittered wait after RateLimit: the
	// wait is base × [1,6), as upstream. The flag defaults to 200ms.
	ThrottleBackoff time.Duration
	// SDKRetries and SDKRetryBase configure the retries of a call that
	// failed with 5xx or in transport, the classes the SDK used to retry
	// (delay base·2^n, capped at 20 s, jittered). This client retries, not
	// the SDK, so each retry takes its own token and passes the gate.
	// The flags default to 3 and 300ms; zero or negative retries: none.
	SDKRetries   int
	SDKRetryBase time.Duration
	// Timeout bounds one HTTP attempt. The flag defaults to 20s; at least 1s
	// (the SDK counts it in whole seconds).
	Timeout time.Duration
	// PageSize is maxKeys for list calls, 1 to 1000. The flag defaults to
	// 1000.
	PageSize int
	// OpLimits are per-operation token buckets on top of Rate/Burst, keyed
	// by operation name (ListENIs, CreateENI, ...). Nil means none; the
	// --bce-op-limits flag defaults to the upstream's flow-control table
	// (DefaultOpLimits). Like Rate and Burst they are cluster-wide numbers:
	// SetRate scales them to a replica's share.
	OpLimits map[string]OpLimit
}

// OpLimit is one operation's rate and burst.
type OpLimit struct {
	Rate  float64
	Burst int64
}

// Share is the part f of the limit a replica holds (Client.SetOpShare): the
// rate times f, the burst times f but never below one token.
func (l OpLimit) Share(f float64) OpLimit {
	return OpLimit{Rate: l.Rate * f, Burst: max(1, int64(float64(l.Burst)*f))}
}

// DefaultOpLimits is the upstream's client-side flow-control table
// (cce-network-v2 flow_control.go) for the operations this client makes.
// The table names no limit for the cross-subnet add; it gets the batch
// add's, as BCE (and bce-sim) limit it on its own.
func DefaultOpLimits() map[string]OpLimit {
	return map[string]OpLimit{
		"BatchAddPrivateIP":            {5, 10},
		"BatchAddPrivateIPCrossSubnet": {5, 10},
		"BatchDeletePrivateIP":         {5, 10},
		"CreateENI":                    {5, 5},
		"AttachENI":                    {5, 5},
		"DeleteENI":                    {1, 1},
		"ListENIs":                     {1, 1},
		"DescribeSubnet":               {5, 10},
		"ListSubnets":                  {1, 1},
		"GetInstance":                  {5, 10},
	}
}

// opLimitsFlag parses "Op=rate:burst,Op=rate:burst".
type opLimitsFlag struct{ m *map[string]OpLimit }

func (f opLimitsFlag) String() string {
	if f.m == nil || *f.m == nil {
		return ""
	}
	var parts []string
	for op, l := range *f.m {
		parts = append(parts, fmt.Sprintf("%s=%g:%d", op, l.Rate, l.Burst))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func (f opLimitsFlag) Set(v string) error {
	out := map[string]OpLimit{}
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		op, rb, ok := strings.Cut(part, "=")
		r, b, ok2 := strings.Cut(rb, ":")
		if !ok || !ok2 || op == "" {
			return fmt.Errorf("want Op=rate:burst, got %q", part)
		}
		rate, err := strconv.ParseFloat(r, 64)
		if err != nil {
			return fmt.Errorf("%s: rate %q: %w", op, r, err)
		}
		burst, err := strconv.ParseInt(b, 10, 64)
		if err != nil {
			return fmt.Errorf("%s: burst %q: %w", op, b, err)
		}
		if err := checkRate(rate, burst); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		out[op] = OpLimit{Rate: rate, Burst: burst}
	}
	*f.m = out
	return nil
}

func (opLimitsFlag) Type() string { return "limits" }

// RegisterFlags binds the config to flags named --bce-*.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Endpoint, "bce-endpoint", "",
		"BCE BCC endpoint (host:port or URL) serving the ENI, VPC and BCC APIs; default bcc.<region>.baidubce.com")
	fs.StringVar(&c.Region, "bce-region", "bj", "BCE region, e.g. bj")
	fs.StringVar(&c.AccessKeyID, "bce-access-key-id", "", "BCE access key ID (prefer --bce-credentials-dir)")
	fs.StringVar(&c.SecretAccessKey, "bce-secret-access-key", "", "BCE secret access key (prefer --bce-credentials-dir)")
	fs.StringVar(&c.CredentialsDir, "bce-credentials-dir", "",
		"directory with files access-key-id and secret-access-key (a mounted Secret)")
	fs.StringVar(&c.GatewayEndpoint, "cce-gateway-endpoint", "",
		"CCE gateway host or host:port, used when no AK/SK or credentials directory is given; "+
			"default $CCE_GATEWAY_ENDPOINT, else cce-gateway.<region>.baidubce.com:80")
	fs.StringVar(&c.GatewayTokenSecret, "cce-gateway-token-secret", DefaultGatewayTokenSecret,
		"Secret namespace/name with keys token and expiredAt for the CCE gateway (tried first; empty: not used)")
	fs.StringVar(&c.GatewayTokenDir, "cce-gateway-token-dir", DefaultGatewayTokenDir,
		"directory with files token and expiredAt for the CCE gateway (tried when the Secret cannot be read; empty: not used)")
	fs.Float64Var(&c.Rate, "bce-rate", 10, "client-side BCE API calls per second")
	fs.Int64Var(&c.Burst, "bce-burst", 5, "client-side BCE API burst")
	fs.IntVar(&c.ThrottleRetries, "bce-throttle-retries", 3,
		"retries of a call BCE answered with RateLimit, twenty times as many for a takeover's ENI list (negative disables)")
	fs.DurationVar(&c.ThrottleBackoff, "bce-throttle-backoff", 200*time.Millisecond,
		"base of the jittered backoff after RateLimit (never shorter than the operation's interval under --bce-op-limits, e.g. 1 s for "+
			"ListENIs)")
	fs.IntVar(&c.SDKRetries, "bce-sdk-retries", 3,
		"retries of a call that failed with 5xx or a transport error, each taking its own token (negative disables)")
	fs.DurationVar(&c.SDKRetryBase, "bce-sdk-retry-base", 300*time.Millisecond,
		"base delay of the exponential, jittered retry after 5xx or a transport error")
	fs.DurationVar(&c.Timeout, "bce-timeout", 20*time.Second, "timeout of one BCE HTTP attempt")
	fs.IntVar(&c.PageSize, "bce-page-size", 1000, "maxKeys of BCE list calls")
	c.OpLimits = DefaultOpLimits()
	fs.Var(opLimitsFlag{&c.OpLimits}, "bce-op-limits",
		"cluster-wide per-operation limits, Op=rate:burst,... (replaces the whole default table, the upstream's flow-control limits)")
}

// DefaultConfig is the configuration the flags default to.
func DefaultConfig() Config {
	var c Config
	c.RegisterFlags(pflag.NewFlagSet("defaults", pflag.ContinueOnError))
	return c
}

// endpoint is Endpoint, or the region's public endpoint when it is empty.
func (c Config) endpoint() string {
	if c.Endpoint == "" {
		return "bcc." + c.Region + ".baidubce.com"
	}
	return c.Endpoint
}

// Validate checks the config; it does not read credentials.
func (c Config) Validate() error {
	d := c
	var errs []error
	if d.Region == "" {
		errs = append(errs, errors.New("region is required"))
	}
	if err := checkRate(d.Rate, d.Burst); err != nil {
		errs = append(errs, err)
	}
	if d.PageSize < 1 || d.PageSize > 1000 {
		errs = append(errs, fmt.Errorf("page size %d outside [1,1000]", d.PageSize))
	}
	if d.Timeout < time.Second {
		errs = append(errs, fmt.Errorf("timeout %v below 1s", d.Timeout))
	}
	if d.ThrottleBackoff < 0 || d.SDKRetryBase < 0 {
		errs = append(errs, errors.New("backoffs must not be negative"))
	}
	if (d.AccessKeyID == "") != (d.SecretAccessKey == "") {
		errs = append(errs, errors.New("give both access key ID and secret access key, or neither"))
	}
	if d.UsesGateway() {
		if d.ClusterID == "" {
			errs = append(errs, errors.New("no AK/SK or credentials directory given, so the CCE gateway is used, "+
				"and it needs the cluster ID"))
		}
		if d.GatewayTokenSecret == "" && d.GatewayTokenDir == "" {
			errs = append(errs, errors.New("CCE gateway: no token source (give a token Secret or a token directory)"))
		}
		if d.GatewayTokenSecret != "" {
			if ns, name, ok := strings.Cut(d.GatewayTokenSecret, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
				errs = append(errs, fmt.Errorf("CCE gateway token Secret %q: want namespace/name", d.GatewayTokenSecret))
			}
		}
		if _, err := gatewayHostPort(d.GatewayEndpoint, d.Region); err != nil {
			errs = append(errs, err)
		}
	}
	if strings.ContainsAny(d.Endpoint, " \t\n") {
		errs = append(errs, fmt.Errorf("endpoint %q contains whitespace", d.Endpoint))
	}
	return errors.Join(errs...)
}

// UsesGateway reports whether the client authenticates through the CCE
// gateway: no AK/SK and no credentials directory were given (the
// reference's rule).
func (c Config) UsesGateway() bool {
	return c.AccessKeyID == "" && c.SecretAccessKey == "" && c.CredentialsDir == ""
}

// credentials returns the AK/SK from the config or the credentials
// directory. Errors name files, never their contents.
func (c *Config) credentials() (ak, sk string, err error) {
	if c.AccessKeyID != "" {
		return c.AccessKeyID, c.SecretAccessKey, nil
	}
	read := func(name string) (string, error) {
		p := filepath.Join(c.CredentialsDir, name)
		b, err := os.ReadFile(p)
		if err != nil {
			return "", fmt.Errorf("read credentials file %s: %w", p, err)
		}
		v := strings.TrimSpace(string(b))
		if v == "" || strings.ContainsAny(v, " \t\r\n/") {
			return "", fmt.Errorf("credentials file %s: empty or malformed", p)
		}
		return v, nil
	}
	if ak, err = read(AccessKeyIDFile); err != nil {
		return "", "", err
	}
	if sk, err = read(SecretAccessKeyFile); err != nil {
		return "", "", err
	}
	return ak, sk, nil
}

// LogValue keeps credentials out of structured logs.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("endpoint", c.endpoint()), slog.String("region", c.Region),
		slog.Bool("accessKeySet", c.AccessKeyID != ""), slog.String("credentialsDir", c.CredentialsDir),
		slog.Bool("cceGateway", c.UsesGateway()),
		slog.Float64("rate", c.Rate), slog.Int64("burst", c.Burst), slog.Int("pageSize", c.PageSize))
}

// String keeps credentials out of %v.
func (c Config) String() string { return c.LogValue().String() }
