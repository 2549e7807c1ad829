package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/e2e/cluster"
	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/kubeletsim"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/shard"
)

// Namespaces of the benchmark's pods and of the floor's bare weps.
const (
	podNamespace   = "bench"
	floorNamespace = "bench-floor"
)

// env is the system under test: a control plane without
// kube-controller-manager (no node lifecycle controller evicting pods of
// nodes without heartbeats), bce-sim, the cce-ipam replicas of a fleet, and
// the benchmark's own clients.
type env struct {
	cfg Config
	log *slog.Logger
	cp  *cluster.Cluster
	f   *fleet.Fleet

	kube kubernetes.Interface
	cce  cceclient.Interface
	drv  *driver
	smp  *sampler

	argsMu    sync.Mutex
	phaseArgs []string
	// chartArgs leaves out the bench's own replica flags (item 8 runs the
	// chart's).
	chartArgs bool
	// replicaBin is the fleet's cce-ipam when item 8 runs: a symlink that
	// item 8 points at another build (see useReplicaBinary).
	replicaBin string
}

// benchBatchAddIPNum is the replicas' --batch-add-ip-num (item 10's floor
// counts its batches).
const benchBatchAddIPNum = 10

// replicaArgs are the flags every replica gets on top of the fleet's; the
// phase's flags come last and win.
func (e *env) replicaArgs(int) []string {
	e.argsMu.Lock()
	defer e.argsMu.Unlock()
	a := []string{"--kube-api-qps", "500", "--kube-api-burst", "1000", "--batch-add-ip-num", fmt.Sprint(benchBatchAddIPNum),
		"--enable-profiling"}
	if e.chartArgs {
		a = nil
	}
	a = append(a, e.phaseArgs...)
	return append(a, e.cfg.ReplicaArgs...)
}

// setChartArgs switches the bench's own replica flags off (on) for
// replicas started from now on.
func (e *env) setChartArgs(on bool) {
	e.argsMu.Lock()
	defer e.argsMu.Unlock()
	e.chartArgs = on
}

// setPhaseArgs changes the flags of replicas started from now on.
func (e *env) setPhaseArgs(a ...string) {
	e.argsMu.Lock()
	defer e.argsMu.Unlock()
	e.phaseArgs = a
}

func startEnv(ctx context.Context, cfg Config) (_ *env, err error) {
	e := &env{
		cfg: cfg,
		log: cfg.Logger,
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.close())
		}
	}()
	e.log.Info("starting control plane")
	if err := os.MkdirAll(filepath.Join(cfg.WorkDir, "control-plane"), 0o755); err != nil {
		return nil, err
	}
	if e.cp, err = cluster.Start(ctx, cluster.Options{BinDir: cfg.BinDir, Dir: filepath.Join(cfg.WorkDir, "control-plane"),
		StartTimeout: 3 * time.Minute, APIServerArgs: cfg.APIServerSeats.args()}); err != nil {
		return nil, err
	}
	if err := e.cp.InstallCRDs(ctx, filepath.Join(cfg.RepoRoot, "charts", "cce-ipam", "crds")); err != nil {
		return nil, err
	}
	rc := rest.CopyConfig(e.cp.Config)
	rc.QPS, rc.Burst = 5000, 10000
	if e.kube, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, err
	}
	if e.cce, err = cceclient.NewForConfig(rc); err != nil {
		return nil, err
	}
	for _, ns := range []string{podNamespace, floorNamespace} {
		if _, err := e.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
			metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, err
		}
	}
	e.log.Info("starting bce-sim and the first replica")
	fleetBin, err := e.fleetBinDir()
	if err != nil {
		return nil, err
	}
	opts := fleet.Options{
		// A shared control plane: the fleet installs the chart's wep fencing
		// policy for the pods' namespace (the replicas keep their Leases
		// there) and runs the replicas as the user it fences, so every wep
		// write of the bench is checked by the API server, as in a cluster.
		SharedCluster:    e.cp,
		LeaseNamespace:   podNamespace,
		BinDir:           fleetBin,
		Dir:              filepath.Join(cfg.WorkDir, "fleet"),
		KeepDir:          true,
		Name:             "bench",
		Replicas:         1,
		NoKubelet:        true,
		SubnetCIDR:       "10.16.0.0/12",
		InstanceCPUs:     8,
		InstanceMemoryGB: 128,
		AttachDelay:      50 * time.Millisecond,
		BCERate:          cfg.Profile.BudgetRate,
		BCEBurst:         cfg.Profile.BudgetBurst,
		IdleMin:          cfg.Profile.IdleMin,
		IdleMax:          cfg.Profile.IdleMax,
		ReplicaArgsFunc:  e.replicaArgs,
		Kubelet:          func(c *kubeletsim.Config) { c.RegisterWorkers = 16 },
		StartTimeout:     5 * time.Minute,
		Logger:           e.log,
	}
	if cfg.NoFencingPolicy {
		opts.SharedCluster, opts.LeaseNamespace = nil, ""
		opts.Config, opts.Kubeconfig = e.cp.Config, e.cp.Kubeconfig
	}
	if e.f, err = fleet.New(ctx, opts); err != nil {
		return nil, err
	}
	e.drv = newDriver(e.kube, e.cce, podNamespace)
	e.smp = newSampler(e.f, 500*time.Millisecond)
	e.smp.start()
	return e, nil
}

// fleetBinDir is the fleet's bin/: Config.BinDir, or, when item 8 runs
// (it runs replicas of another build), a directory of links to it whose
// cce-ipam can be pointed elsewhere (useReplicaBinary).
func (e *env) fleetBinDir() (string, error) {
	if !e.cfg.runs("apicost") {
		return e.cfg.BinDir, nil
	}
	dir, err := linkBinDir(e.cfg.BinDir, filepath.Join(e.cfg.WorkDir, "fleet-bin"))
	if err != nil {
		return "", err
	}
	e.replicaBin = filepath.Join(dir, "cce-ipam")
	return dir, nil
}

// close stops everything, also after a failed start. Logs stay in WorkDir.
func (e *env) close() error {
	var errs []error
	if e.smp != nil {
		e.smp.stop()
	}
	if e.drv != nil {
		e.drv.close()
	}
	if e.f != nil {
		errs = append(errs, e.f.Close())
	}
	if e.cp != nil {
		errs = append(errs, e.cp.Close())
	}
	return errors.Join(errs...)
}

// simLimits switches bce-sim between the upstream's per-operation limits
// and none (registration and bulk fills, where only the replicas' own
// budget should count).
func (e *env) simLimits(ctx context.Context, upstream bool) error {
	m := bcesim.DefaultRateLimits()
	if !upstream {
		for op := range m {
			m[op] = bcesim.RateLimit{}
		}
	}
	return e.f.SetSimRateLimits(ctx, m)
}

// addNodes registers n nodes with bce-sim's limits lifted.
func (e *env) addNodes(ctx context.Context, n int) ([]string, error) {
	if err := e.simLimits(ctx, false); err != nil {
		return nil, err
	}
	names, err := e.f.AddNodes(ctx, n)
	return names, errors.Join(err, e.simLimits(ctx, true))
}

// running returns the replicas whose process runs.
func (e *env) running() []*fleet.Replica {
	var out []*fleet.Replica
	for _, r := range e.f.Live() {
		if r.Running() {
			out = append(out, r)
		}
	}
	return out
}

// status reads a replica's /shard/status.
func status(ctx context.Context, r *fleet.Replica) (shard.Status, error) {
	var st shard.Status
	return st, getJSON(ctx, "http://"+r.MetricsAddr()+"/shard/status", &st)
}

// holderOf asks r which member holds node.
func holderOf(ctx context.Context, r *fleet.Replica, node string) (string, error) {
	var ns shard.NodeStatus
	err := getJSON(ctx, "http://"+r.MetricsAddr()+"/shard/node?name="+node, &ns)
	return ns.Holder, err
}

func getJSON(ctx context.Context, url string, into any) error {
	return get(ctx, url, 5*time.Second, func(body io.Reader) error { return json.NewDecoder(body).Decode(into) })
}

// get GETs url within timeout and hands a 200's body to read.
func get(ctx context.Context, url string, timeout time.Duration, read func(io.Reader) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return read(resp.Body)
}

// settle waits until every running replica is ready, sees exactly the
// running replicas as live members, no node lacks an owner and the
// replicas' node counts add up to nodes. It returns how long that took.
func (e *env) settle(ctx context.Context, nodes int, within time.Duration) (time.Duration, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var last string
	for {
		ok, why := e.settled(ctx, nodes)
		if ok {
			return time.Since(start), nil
		}
		last = why
		select {
		case <-ctx.Done():
			return time.Since(start), fmt.Errorf("replicas did not settle within %s: %s", within, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (e *env) settled(ctx context.Context, nodes int) (bool, string) {
	run := e.running()
	if len(run) == 0 {
		return false, "no replica runs"
	}
	total := 0
	for _, r := range run {
		if !r.Ready() {
			return false, fmt.Sprintf("replica %d not ready", r.Index())
		}
		st, err := status(ctx, r)
		if err != nil {
			return false, err.Error()
		}
		if st.UnownedNodes != 0 {
			return false, fmt.Sprintf("replica %d: %d nodes unowned", r.Index(), st.UnownedNodes)
		}
		if st.BalancePending {
			return false, fmt.Sprintf("replica %d has node counts to publish", r.Index())
		}
		live := 0
		for _, m := range st.Members {
			if m.Live {
				live++
			}
			if m.Name == st.Self {
				total += m.Nodes
			}
		}
		if live != len(run) {
			return false, fmt.Sprintf("replica %d sees %d live members, want %d", r.Index(), live, len(run))
		}
	}
	if total != nodes {
		return false, fmt.Sprintf("replicas hold %d nodes, want %d", total, nodes)
	}
	return true, ""
}

// randomTarget returns a func picking a running replica's CNI address at
// random ("" when none runs), as a Service would.
func (e *env) randomTarget() func() string {
	var mu sync.Mutex
	rnd := newRand()
	return func() string {
		run := e.running()
		if len(run) == 0 {
			return ""
		}
		mu.Lock()
		defer mu.Unlock()
		return run[rnd.IntN(len(run))].GRPCAddr()
	}
}

// nodesHeldBy maps each of nodes to the member name holding it, as r sees it.
func (e *env) holders(ctx context.Context, r *fleet.Replica, nodes []string) (map[string]string, error) {
	out := map[string]string{}
	for _, n := range nodes {
		h, err := holderOf(ctx, r, n)
		if err != nil {
			return nil, err
		}
		out[n] = h
	}
	return out, nil
}

// self returns a replica's member name.
func self(ctx context.Context, r *fleet.Replica) (string, error) {
	st, err := status(ctx, r)
	return st.Self, err
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
