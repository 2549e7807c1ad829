package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/e2e/supervisor"
)

// startSim runs bce-sim with the fleet's world: one VPC, subnet and
// security group.
func (f *Fleet) startSim(ctx context.Context) error {
	o := f.opts
	args := []string{"--listen", "127.0.0.1:0", "--credential", AccessKey + ":" + SecretKey,
		"--vpc", f.VPCID, "--subnet", f.SubnetID + "," + Zone + "," + o.SubnetCIDR,
		"--security-group", f.SecurityGroup, "--attach-delay", max(o.AttachDelay, 0).String(), "--log-level", "warn"}
	if o.NoSimRateLimits {
		args = append(args, "--rate-limits=false")
	}
	ops := make([]string, 0, len(o.SimRateLimits))
	for op := range o.SimRateLimits {
		ops = append(ops, string(op))
	}
	sort.Strings(ops)
	for _, op := range ops {
		rl := o.SimRateLimits[bcesim.Op(op)]
		args = append(args, "--rate-limit", fmt.Sprintf("%s=%g:%d", op, rl.QPS, rl.Burst))
	}
	args = append(args, o.SimArgs...)
	p, err := supervisor.Start(supervisor.Spec{
		Name:    "bce-sim",
		Bin:     filepath.Join(o.BinDir, "bce-sim"),
		Args:    args,
		LogPath: filepath.Join(f.Dir, "bce-sim.log"),
	})
	if err != nil {
		return err
	}
	f.sim = p
	select {
	case line := <-p.FirstLine():
		f.simURL = strings.TrimSpace(line)
	case <-p.Exited():
		return fmt.Errorf("fleet: %w", p.ExitError())
	case <-ctx.Done():
		return fmt.Errorf("fleet: bce-sim printed no address: %w", ctx.Err())
	}
	if !strings.Contains(f.simURL, "://") {
		f.simURL = "http://" + f.simURL
	}
	if _, _, err := net.SplitHostPort(strings.TrimPrefix(f.simURL, "http://")); err != nil {
		return fmt.Errorf("fleet: bce-sim printed %q, not its address", f.simURL)
	}
	f.opts.Logger.Info("bce-sim serving", "url", f.simURL)
	return nil
}

// SimURL is bce-sim's base URL (BCE OpenAPI and /admin/).
func (f *Fleet) SimURL() string { return f.simURL }

// SimStats reads bce-sim's per-operation call counters (with the calls of
// each of the last seconds) from GET /admin/stats.
func (f *Fleet) SimStats(ctx context.Context) (bcesim.Stats, error) {
	var st bcesim.Stats
	return st, f.simAdmin(ctx, http.MethodGet, "/admin/stats", nil, &st)
}

// SimWorld returns bce-sim's whole world (subnets, instances, ENIs).
func (f *Fleet) SimWorld(ctx context.Context) (bcesim.WorldDump, error) {
	var w bcesim.WorldDump
	return w, f.simAdmin(ctx, http.MethodGet, "/admin/world", nil, &w)
}

// SetFaults replaces bce-sim's injected faults (latency, 5xx, replica lag,
// failures after a mutation); the zero Faults clears them.
func (f *Fleet) SetFaults(ctx context.Context, faults bcesim.Faults) error {
	return f.simAdmin(ctx, http.MethodPut, "/admin/faults", faults, nil)
}

// SetSimRateLimits merges per-operation rate limits into bce-sim's (QPS 0
// lifts one): lowering them is how a test provokes 429 RateLimit answers.
func (f *Fleet) SetSimRateLimits(ctx context.Context, limits map[bcesim.Op]bcesim.RateLimit) error {
	return f.simAdmin(ctx, http.MethodPut, "/admin/ratelimits", limits, nil)
}

// SimRateLimits returns bce-sim's current per-operation limits.
func (f *Fleet) SimRateLimits(ctx context.Context) (map[bcesim.Op]bcesim.RateLimit, error) {
	var m map[bcesim.Op]bcesim.RateLimit
	return m, f.simAdmin(ctx, http.MethodGet, "/admin/ratelimits", nil, &m)
}

// AddSubnet creates one more subnet in the fleet's VPC and zone.
func (f *Fleet) AddSubnet(ctx context.Context, id, cidr string) error {
	return f.simAdmin(ctx, http.MethodPost, "/admin/subnets",
		bcesim.SubnetSpec{
			ID:       id,
			ZoneName: Zone,
			CIDR:     cidr,
			VPCID:    f.VPCID,
		}, nil)
}

// SimCheck asks bce-sim to verify its world's own invariants.
func (f *Fleet) SimCheck(ctx context.Context) error {
	return f.simAdmin(ctx, http.MethodGet, "/admin/check", nil, nil)
}

func (f *Fleet) simAdmin(ctx context.Context, method, path string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, f.simURL+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("bce-sim admin %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("bce-sim admin %s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(data))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}
