package fleet

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cce-ipam/sharded/e2e/freeport"
	"github.com/cce-ipam/sharded/e2e/supervisor"
)

// Replica is one cce-ipam process of the fleet. Its ports stay the same
// across restarts, so peers and the kubelet simulator find it again.
type Replica struct {
	f           *Fleet
	index       int
	grpcAddr    string
	metricsAddr string
	gossipHost  string
	gossipPort  int
	netns       string // the network namespace it runs in (Options.NetNS)
	logPath     string

	mu       sync.Mutex
	p        *supervisor.Process
	removed  bool
	starts   int
	lastArgs []string
}

// AddReplica starts one more replica and waits until it is ready. The
// kubelet simulator keeps its endpoint list: call RestartKubelet to spread
// calls over the new replica too.
func (f *Fleet) AddReplica(ctx context.Context) (*Replica, error) {
	f.mu.Lock()
	r := &Replica{
		f:     f,
		index: f.nextIndex,
	}
	f.nextIndex++
	f.mu.Unlock()
	r.logPath = filepath.Join(f.Dir, fmt.Sprintf("replica-%d.log", r.index))
	if n := f.netns; n != nil {
		// A namespace of its own: fixed ports on its own address.
		if err := n.ensureSpace(r.index); err != nil {
			return nil, err
		}
		host := n.addr(r.index)
		r.grpcAddr, r.metricsAddr, r.gossipHost, r.gossipPort = host+":9997", host+":9998", host, 7946
		r.netns = n.space(r.index)
	} else {
		ports, err := freeport.Get(3)
		if err != nil {
			return nil, err
		}
		r.grpcAddr = "127.0.0.1:" + strconv.Itoa(ports[0])
		r.metricsAddr = "127.0.0.1:" + strconv.Itoa(ports[1])
		r.gossipHost, r.gossipPort = "127.0.0.1", ports[2]
	}
	f.mu.Lock()
	f.replicas = append(f.replicas, r)
	f.mu.Unlock()
	if err := r.Start(ctx); err != nil {
		return r, err
	}
	return r, nil
}

// Index is the replica's number in the fleet (never reused).
func (r *Replica) Index() int { return r.index }

// GRPCAddr is the host:port of its CNI gRPC service.
func (r *Replica) GRPCAddr() string { return r.grpcAddr }

// MetricsAddr is the host:port of /metrics, /healthz and /readyz.
func (r *Replica) MetricsAddr() string { return r.metricsAddr }

// MetricsURL is its /metrics URL.
func (r *Replica) MetricsURL() string { return "http://" + r.metricsAddr + "/metrics" }

// GossipAddr is its memberlist host:port.
func (r *Replica) GossipAddr() string {
	return net.JoinHostPort(r.gossipHost, strconv.Itoa(r.gossipPort))
}

// NetNS is the network namespace it runs in ("" unless Options.NetNS).
func (r *Replica) NetNS() string { return r.netns }

// LogPath is its log file; every start appends to it.
func (r *Replica) LogPath() string { return r.logPath }

// Logs returns the last n lines of its log.
func (r *Replica) Logs(n int) string { return supervisor.LogTail(r.logPath, n) }

// Args returns the command line of its latest start.
func (r *Replica) Args() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lastArgs...)
}

// PID is the process ID of its latest start (0 before the first).
func (r *Replica) PID() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.p == nil {
		return 0
	}
	return r.p.PID()
}

// Running reports whether its process is alive (a SIGSTOPped process is).
func (r *Replica) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.p != nil && r.p.Running()
}

// Removed reports whether Remove was called.
func (r *Replica) Removed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.removed
}

// Starts counts its starts.
func (r *Replica) Starts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts
}

func (r *Replica) args() []string {
	f, o := r.f, r.f.opts
	kubeconfig, simURL := f.Kubeconfig, f.simURL
	if f.replicaKubeconfig != "" {
		kubeconfig = f.replicaKubeconfig
	}
	if n := f.netns; n != nil {
		kubeconfig, simURL = n.kubecfg, "http://"+n.simAddr
	}
	a := []string{"--kubeconfig", kubeconfig, "--cluster-id", f.ClusterID, "--vpc-id", f.VPCID,
		"--bce-endpoint", simURL, "--bce-region", Region,
		"--bce-access-key-id", AccessKey, "--bce-secret-access-key", SecretKey,
		"--bce-rate", strconv.FormatFloat(o.BCERate, 'g', -1, 64), "--bce-burst", strconv.Itoa(o.BCEBurst),
		"--grpc-listen", r.grpcAddr, "--metrics-listen", r.metricsAddr,
		"--idle-ip-pool-min-size", strconv.Itoa(o.IdleMin), "--idle-ip-pool-max-size", strconv.Itoa(o.IdleMax),
		"--pool-check-period", "1s", "--eni-sync-period", "5s", "--gc-period", "5s", "--subnet-sync-period", "5s",
		"--ip-cooling-period", "1s", "--log-level", o.LogLevel}
	a = append(a, "--memberlist-bind-addr", r.gossipHost, "--memberlist-bind-port", strconv.Itoa(r.gossipPort),
		"--memberlist-advertise-addr", r.gossipHost,
		"--memberlist-gossip-key-file", f.gossipKey,
		"--memberlist-name-prefix", fmt.Sprintf("%s-r%d", o.Name, r.index),
		"--memberlist-grpc-advertise-addr", r.grpcAddr,
		"--namespace", o.LeaseNamespace,
		"--shard-forward-key-file", f.forwardKey)
	if f.fencingPolicy != "" {
		a = append(a, "--shard-fencing-policy", f.fencingPolicy)
	}
	for _, peer := range f.Replicas() {
		if peer != r && !peer.Removed() {
			a = append(a, "--memberlist-join", peer.GossipAddr())
		}
	}
	a = append(a, o.ReplicaArgs...)
	if o.ReplicaArgsFunc != nil {
		a = append(a, o.ReplicaArgsFunc(r.index)...)
	}
	return a
}

// Start starts the replica's process if it is not running and waits until
// /readyz answers 200. It keeps its ports; it joins the other live
// replicas.
func (r *Replica) Start(ctx context.Context) error {
	r.mu.Lock()
	if r.p != nil && r.p.Running() {
		r.mu.Unlock()
		return fmt.Errorf("replica %d is running", r.index)
	}
	r.removed = false
	r.mu.Unlock()
	args := r.args() // locks the peers, never r
	r.mu.Lock()
	if r.p != nil && r.p.Running() {
		r.mu.Unlock()
		return fmt.Errorf("replica %d is running", r.index)
	}
	bin := filepath.Join(r.f.opts.BinDir, "cce-ipam")
	cmd := append([]string{}, args...)
	if r.netns != "" {
		// ip execs the binary in place: the PID, process group and
		// parent-death signal are the replica's.
		cmd = append([]string{"netns", "exec", r.netns, bin}, args...)
		bin = "ip"
		if path, err := exec.LookPath("ip"); err == nil {
			bin = path
		}
	}
	p, err := supervisor.Start(supervisor.Spec{
		Name:    fmt.Sprintf("replica-%d", r.index),
		Bin:     bin,
		Args:    cmd,
		LogPath: r.logPath,
	})
	if err != nil {
		r.mu.Unlock()
		return err
	}
	r.p, r.lastArgs = p, args
	r.starts++
	r.mu.Unlock()
	r.f.opts.Logger.Info("replica started", "replica", r.index, "pid", p.PID(), "grpc", r.grpcAddr, "metrics", r.metricsAddr)
	return r.WaitReady(ctx)
}

// WaitReady polls /readyz until it answers 200, the process exits, or ctx
// ends.
func (r *Replica) WaitReady(ctx context.Context) error {
	r.mu.Lock()
	p := r.p
	r.mu.Unlock()
	if p == nil {
		return fmt.Errorf("replica %d was never started", r.index)
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for !r.Ready() {
		select {
		case <-p.Exited():
			return fmt.Errorf("replica %d, before it was ready: %w", r.index, p.ExitError())
		case <-ctx.Done():
			return fmt.Errorf("replica %d not ready: %w:\n%s", r.index, ctx.Err(), r.Logs(30))
		case <-t.C:
		}
	}
	return nil
}

// Ready reports whether /readyz answers 200 right now.
func (r *Replica) Ready() bool {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + r.metricsAddr + "/readyz")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (r *Replica) current() (*supervisor.Process, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.p == nil || !r.p.Running() {
		return nil, fmt.Errorf("replica %d is not running", r.index)
	}
	return r.p, nil
}

// Kill sends SIGKILL and waits until the process is gone.
func (r *Replica) Kill() error {
	p, err := r.current()
	if err != nil {
		return err
	}
	return p.Kill()
}

// Stop freezes the process (SIGSTOP): it keeps its sockets but answers
// nothing, like a replica stuck in a long GC pause or on a frozen VM.
func (r *Replica) Stop() error {
	p, err := r.current()
	if err != nil {
		return err
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	// kill(2) returns before the process has stopped: a goroutine already on
	// a CPU may still answer a request. Return once the kernel says stopped.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if stoppedState(p.PID()) {
			return nil
		}
	}
	return fmt.Errorf("replica %d (pid %d) did not stop within 2s of SIGSTOP", r.index, p.PID())
}

// stoppedState reports whether /proc says the process is stopped (T).
func stoppedState(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces, so read after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && (s[i+2] == 'T' || s[i+2] == 't')
}

// Cont resumes a stopped process (SIGCONT).
func (r *Replica) Cont() error {
	p, err := r.current()
	if err != nil {
		return err
	}
	return p.Signal(syscall.SIGCONT)
}

// Terminate sends SIGTERM and waits for a graceful exit; after 30s it
// SIGKILLs and reports that it had to.
func (r *Replica) Terminate() error {
	p, err := r.current()
	if err != nil {
		return err
	}
	_ = p.Signal(syscall.SIGCONT)
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.Exited():
		return nil
	case <-time.After(30 * time.Second):
	}
	if err := p.Kill(); err != nil {
		return err
	}
	return fmt.Errorf("replica %d ignored SIGTERM for 30s and was killed", r.index)
}

// ExitError returns how the latest process exited (nil while it runs or
// when it exited cleanly).
func (r *Replica) ExitError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.p == nil || r.p.Running() {
		return nil
	}
	return r.p.WaitErr()
}

// Restart terminates the replica if it runs (SIGTERM), then starts it again
// and waits until it is ready.
func (r *Replica) Restart(ctx context.Context) error {
	if r.Running() {
		if err := r.Terminate(); err != nil {
			return err
		}
	}
	return r.Start(ctx)
}

// Remove terminates the replica for good: it leaves CNIAddrs and the join
// lists of later starts. Call RestartKubelet to stop sending calls to it.
func (r *Replica) Remove() error {
	var err error
	if r.Running() {
		err = r.Terminate()
	}
	r.mu.Lock()
	r.removed = true
	r.mu.Unlock()
	return err
}

func (r *Replica) stopProc(grace time.Duration) error {
	r.mu.Lock()
	p := r.p
	r.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.Stop(grace)
}

// Metrics scrapes its /metrics.
func (r *Replica) Metrics(ctx context.Context) (Samples, error) {
	return Scrape(ctx, r.MetricsURL())
}

// Metric scrapes /metrics and returns the sum of the series called name
// whose labels include labels (nil: every series of that name). A metric
// with no series is an error.
func (r *Replica) Metric(ctx context.Context, name string, labels map[string]string) (float64, error) {
	ss, err := r.Metrics(ctx)
	if err != nil {
		return 0, err
	}
	v, ok := ss.Sum(name, labels)
	if !ok {
		return 0, fmt.Errorf("replica %d: no series %s%v", r.index, name, labels)
	}
	return v, nil
}
