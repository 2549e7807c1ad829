package fleet

import (
	"cmp"
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

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cce-ipam/sharded/e2e/freeport"
	"github.com/cce-ipam/sharded/e2e/supervisor"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// Replica is one cce-ipam process of the fleet. Its ports stay the same
// across restarts, so peers and the kubelet simulator find it again.
type Replica struct {
	f           *Fleet
	index       int
	ro          ReplicaOptions
	gossipKey   string // its own key file (ReplicaOptions.OwnGossipKey)
	grpcAddr    string
	metricsAddr string
	gossipHost  string
	gossipPort  int
	netns       string // the network namespace it runs in (Options.NetNS)
	logPath     string
	conn        *grpc.ClientConn // CNI client, dialed when it is added
	cni         rpc.CNIBackendClient

	mu       sync.Mutex
	p        *supervisor.Process
	removed  bool
	starts   int
	lastArgs []string
}

// ReplicaOptions shape one replica that AddReplicaWith adds.
type ReplicaOptions struct {
	// OwnGossipKey gives the replica a gossip key of its own: it tries to
	// join the others but cannot (nor can they gossip with it), like a
	// replica of another cluster or one with a wrong key.
	OwnGossipKey bool
	// NoReadyWait makes Start return once the process answers /healthz
	// instead of /readyz: for a replica that may never become ready (one
	// without peers that cannot claim what others hold).
	NoReadyWait bool
}

// bindAttempts bounds how often AddReplica picks new ports for a replica
// that could not bind them (see freeport).
const bindAttempts = 3

// AddReplica starts one more replica and waits until it is ready. The
// kubelet simulator keeps its endpoint list: call RestartKubelet to spread
// calls over the new replica too.
func (f *Fleet) AddReplica(ctx context.Context) (*Replica, error) {
	return f.AddReplicaWith(ctx, ReplicaOptions{})
}

// AddReplicaWith is AddReplica for a replica shaped by ro. A replica whose
// ports another process took between their choice and its bind is started
// again on new ones.
func (f *Fleet) AddReplicaWith(ctx context.Context, ro ReplicaOptions) (*Replica, error) {
	f.mu.Lock()
	r := &Replica{
		f:     f,
		index: f.nextIndex,
		ro:    ro,
	}
	f.nextIndex++
	f.mu.Unlock()
	r.logPath = filepath.Join(f.Dir, fmt.Sprintf("replica-%d.log", r.index))
	if ro.OwnGossipKey {
		var err error
		if r.gossipKey, err = writeKey(f.Dir, fmt.Sprintf("gossip-%d.key", r.index)); err != nil {
			return nil, err
		}
	}
	if err := r.pickAddrs(); err != nil {
		return nil, err
	}
	// The replica joins the fleet only once its addresses are final: peers
	// and CNIAddrs read them without a lock.
	var err error
	for attempt := 1; ; attempt++ {
		from := logSize(r.logPath)
		err = r.Start(ctx)
		if err == nil || r.netns != "" || attempt == bindAttempts || !r.bindFailed(from) {
			break
		}
		f.opts.Logger.Info("replica could not bind its ports; new ones", "replica", r.index)
		if err := r.pickAddrs(); err != nil {
			return nil, err
		}
	}
	if err == nil {
		if r.conn, err = grpc.NewClient(r.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials())); err == nil {
			r.cni = rpc.NewCNIBackendClient(r.conn)
		} else {
			err = fmt.Errorf("replica %d: CNI client: %w", r.index, err)
		}
	}
	f.mu.Lock()
	f.replicas = append(f.replicas, r)
	f.mu.Unlock()
	return r, err
}

// pickAddrs chooses the replica's addresses: fixed ones on its own address
// in a network namespace, else free ports on 127.0.0.1.
func (r *Replica) pickAddrs() error {
	if n := r.f.netns; n != nil {
		if err := n.ensureSpace(r.index); err != nil {
			return err
		}
		host := n.addr(r.index)
		r.grpcAddr, r.metricsAddr, r.gossipHost, r.gossipPort = host+":9997", host+":9998", host, 7946
		r.netns = n.space(r.index)
		return nil
	}
	ports, err := freeport.Get(3)
	if err != nil {
		return err
	}
	r.grpcAddr = "127.0.0.1:" + strconv.Itoa(ports[0])
	r.metricsAddr = "127.0.0.1:" + strconv.Itoa(ports[1])
	r.gossipHost, r.gossipPort = "127.0.0.1", ports[2]
	return nil
}

// logSize is the length of the log file (0 when it does not exist yet).
func logSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// bindFailed reports whether the latest process exited and wrote, after
// offset from of its log, that an address was in use.
func (r *Replica) bindFailed(from int64) bool {
	if r.Running() {
		return false
	}
	data, err := os.ReadFile(r.logPath)
	if err != nil || int64(len(data)) < from {
		return false
	}
	return strings.Contains(string(data[from:]), "address already in use")
}

// Index is the replica's number in the fleet (never reused).
func (r *Replica) Index() int { return r.index }

// GRPCAddr is the host:port of its CNI gRPC service.
func (r *Replica) GRPCAddr() string { return r.grpcAddr }

// CNI is a client of its CNI gRPC service, calling this replica only (the
// router forwards what it does not own). The connection is kept across
// restarts; Close closes it. Nil when AddReplica failed.
func (r *Replica) CNI() rpc.CNIBackendClient { return r.cni }

func (r *Replica) closeCNI() error {
	if r.conn == nil {
		return nil
	}
	return r.conn.Close()
}

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
		// Orphaned cloud addresses (an add whose reply was lost, a takeover
		// read that lagged) wait out this grace before their delete; the
		// suites' end checks count them as idle meanwhile.
		"--leaked-ip-grace", "20s",
		"--ip-cooling-period", "1s", "--log-level", o.LogLevel}
	a = append(a, "--memberlist-bind-addr", r.gossipHost, "--memberlist-bind-port", strconv.Itoa(r.gossipPort),
		"--memberlist-advertise-addr", r.gossipHost,
		"--memberlist-gossip-key-file", cmp.Or(r.gossipKey, f.gossipKey),
		"--memberlist-name-prefix", fmt.Sprintf("%s-r%d", o.Name, r.index),
		"--memberlist-grpc-advertise-addr", r.grpcAddr,
		"--namespace", o.LeaseNamespace,
		"--shard-forward-key-file", f.forwardKey)
	if f.fencingPolicy != "" {
		a = append(a, "--shard-fencing-policy", f.fencingPolicy)
	}
	for _, peer := range f.Replicas() {
		if peer != r && !peer.Removed() && !o.NoJoinSeeds {
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
	var env []string // nil: the test binary's environment
	if fn := r.f.opts.ReplicaEnvFunc; fn != nil {
		if extra := fn(r.index); len(extra) > 0 {
			env = append(os.Environ(), extra...)
		}
	}
	p, err := supervisor.Start(supervisor.Spec{
		Name:    fmt.Sprintf("replica-%d", r.index),
		Bin:     bin,
		Args:    cmd,
		Env:     env,
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
	if r.ro.NoReadyWait {
		return r.waitProbe(ctx, "/healthz")
	}
	return r.WaitReady(ctx)
}

// WaitReady polls /readyz until it answers 200, the process exits, or ctx
// ends.
func (r *Replica) WaitReady(ctx context.Context) error {
	return r.waitProbe(ctx, "/readyz")
}

// waitProbe polls the probe at path until it answers 200, the process
// exits, or ctx ends.
func (r *Replica) waitProbe(ctx context.Context, path string) error {
	r.mu.Lock()
	p := r.p
	r.mu.Unlock()
	if p == nil {
		return fmt.Errorf("replica %d was never started", r.index)
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for !r.probe(path) {
		select {
		case <-p.Exited():
			return fmt.Errorf("replica %d, before %s answered: %w", r.index, path, p.ExitError())
		case <-ctx.Done():
			return fmt.Errorf("replica %d: no %s: %w:\n%s", r.index, path, ctx.Err(), r.Logs(30))
		case <-t.C:
		}
	}
	return nil
}

// Ready reports whether /readyz answers 200 right now.
func (r *Replica) Ready() bool { return r.probe("/readyz") }

// probe reports whether GET path answers 200 right now.
func (r *Replica) probe(path string) bool {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + r.metricsAddr + path)
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
func (r *Replica) Terminate() error { return r.TerminateWithin(30 * time.Second) }

// TerminateWithin is Terminate with grace instead of 30s.
func (r *Replica) TerminateWithin(grace time.Duration) error {
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
	case <-time.After(grace):
	}
	if err := p.Kill(); err != nil {
		return err
	}
	return fmt.Errorf("replica %d ignored SIGTERM for %s and was killed", r.index, grace)
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
