package fleet

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/e2e/cluster"
	"github.com/cce-ipam/sharded/e2e/invariants"
	"github.com/cce-ipam/sharded/e2e/kubeletsim"
	"github.com/cce-ipam/sharded/e2e/supervisor"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
)

// Fleet is a running bce-sim, cce-ipam replicas and kubelet simulator on a
// control plane. Its exported fields are read-only.
type Fleet struct {
	// Cluster is the control plane the fleet started; nil when it was given
	// one.
	Cluster *cluster.Cluster
	// Config and Kubeconfig reach the control plane.
	Config     *rest.Config
	Kubeconfig string
	Kube       kubernetes.Interface
	CCE        cceclient.Interface
	// Cloud is a BCE client of the fleet's bce-sim (generous budget), for
	// tests and the invariant checker.
	Cloud *cloud.Client
	// The cloud world the replicas serve.
	ClusterID, VPCID, SubnetID, SecurityGroup string
	// Dir holds the logs.
	Dir string

	opts Options
	// fencingPolicy and replicaKubeconfig: the wep fencing policy the
	// fleet installed in its control plane, and the identity it fences.
	fencingPolicy     string
	removeFencing     func() // the policy's removal from a SharedCluster
	replicaKubeconfig string
	gossipKey         string // file paths, shared by every replica
	forwardKey        string
	sim               *supervisor.Process
	simURL            string

	mu        sync.Mutex
	replicas  []*Replica
	nextIndex int
	nodes     []string
	nodeSeq   int                 // next node number
	apiserver *supervisor.Process // a restarted kube-apiserver (see RestartAPIServer)
	netns     *netnsNet

	kubeletMu     sync.Mutex
	kubelet       *kubeletsim.Simulator
	kubeletStop   context.CancelFunc
	kubeletDone   chan error
	kubeletLog    *slog.Logger
	kubeletLogOut *os.File

	closeOnce sync.Once
	closeErr  error
}

// New starts a fleet: the control plane when Options has none, bce-sim, the
// replicas (waiting until each is ready), and the kubelet simulator with
// its nodes. On error everything it started is stopped again. Close stops
// it all.
func New(ctx context.Context, opts Options) (*Fleet, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	f := &Fleet{
		opts:          opts,
		Dir:           opts.Dir,
		ClusterID:     "cce-" + opts.Name,
		VPCID:         "vpc-" + opts.Name,
		SubnetID:      "sbn-" + opts.Name,
		SecurityGroup: "g-" + opts.Name,
	}
	if err := f.start(ctx); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return f, nil
}

// start runs the steps of New in order: working directory, control plane
// and its clients, bce-sim and its client, the network namespaces, the
// replicas, and the kubelet simulator with its nodes.
func (f *Fleet) start(ctx context.Context) error {
	o := &f.opts
	if e := o.External; e != nil {
		return f.startExternal(ctx, e)
	}
	for _, b := range []string{"cce-ipam", "bce-sim"} {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			return fmt.Errorf("fleet: %s missing in %s (run `make binaries`): %w", b, o.BinDir, err)
		}
	}
	if err := f.makeDir(); err != nil {
		return err
	}
	if err := f.connectControlPlane(ctx); err != nil {
		return err
	}
	if err := f.startSim(ctx); err != nil {
		return err
	}
	var err error
	if f.Cloud, err = f.simClient(); err != nil {
		return err
	}
	if o.NetNS {
		u, err := url.Parse(f.Config.Host)
		if err != nil {
			return err
		}
		if err := f.setupNetNS(u.Host, strings.TrimPrefix(f.simURL, "http://")); err != nil {
			return err
		}
	}
	if err := f.startReplicas(ctx); err != nil {
		return err
	}
	if o.NoKubelet {
		return nil
	}
	if o.Nodes > 0 {
		if _, err := f.AddNodes(ctx, o.Nodes); err != nil {
			return err
		}
	}
	return f.startKubelet()
}

// makeDir creates the log directory (a temporary one unless Options.Dir).
func (f *Fleet) makeDir() error {
	if f.Dir == "" {
		dir, err := os.MkdirTemp("", "cce-ipam-fleet-")
		if err != nil {
			return err
		}
		f.Dir = dir
		return nil
	}
	return os.MkdirAll(f.Dir, 0o755)
}

// connectControlPlane starts the fleet's own control plane unless Options
// gives one, and builds the clients.
func (f *Fleet) connectControlPlane(ctx context.Context) error {
	o := &f.opts
	switch {
	case o.SharedCluster != nil:
		if err := f.fenceSharedCluster(ctx); err != nil {
			return err
		}
	case o.Config == nil:
		if err := f.startControlPlane(ctx); err != nil {
			return err
		}
	default:
		f.Config, f.Kubeconfig = o.Config, o.Kubeconfig
	}
	var err error
	if f.Kube, err = kubernetes.NewForConfig(f.Config); err != nil {
		return err
	}
	f.CCE, err = cceclient.NewForConfig(f.Config)
	return err
}

// fenceSharedCluster installs the CRDs into Options.SharedCluster and the
// chart's wep fencing policy for LeaseNamespace only; the replicas run as
// the user it fences.
func (f *Fleet) fenceSharedCluster(ctx context.Context) error {
	cp := f.opts.SharedCluster
	f.Config, f.Kubeconfig = cp.Config, cp.Kubeconfig
	install := cp.InstallCRDs
	if f.opts.KeepCRDs {
		install = cp.InstallMissingCRDs
	}
	if err := install(ctx, filepath.Join(f.chartDir(), "crds")); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	name, remove, err := cp.InstallFencingPolicy(ctx, f.chartDir(), f.opts.LeaseNamespace)
	if err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	f.fencingPolicy, f.removeFencing, f.replicaKubeconfig = name, remove, cp.ReplicaKubeconfig
	return nil
}

// startControlPlane starts e2e/cluster with kube-controller-manager, installs
// the CRDs and the chart's wep fencing policy (all namespaces). The replicas
// run as the user the policy fences (through the netns proxy they keep the
// admin's token, which the policy does not check).
func (f *Fleet) startControlPlane(ctx context.Context) error {
	o := &f.opts
	o.Logger.Info("starting control plane")
	if err := os.MkdirAll(filepath.Join(f.Dir, "control-plane"), 0o755); err != nil {
		return err
	}
	cp, err := cluster.Start(ctx, cluster.Options{
		BinDir:            o.BinDir,
		ControllerManager: true,
		Dir:               filepath.Join(f.Dir, "control-plane"),
	})
	if err != nil {
		return fmt.Errorf("fleet: control plane: %w", err)
	}
	f.Cluster = cp
	if err := cp.InstallCRDs(ctx, filepath.Join(f.chartDir(), "crds")); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	f.Config, f.Kubeconfig = cp.Config, cp.Kubeconfig
	name, _, err := cp.InstallFencingPolicyAllNamespaces(ctx, f.chartDir(), o.LeaseNamespace)
	if err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	f.fencingPolicy, f.replicaKubeconfig = name, cp.ReplicaKubeconfig
	return nil
}

// chartDir is the repository's Helm chart (CRDs, fencing policy).
func (f *Fleet) chartDir() string {
	root, err := moduleRoot()
	if err != nil {
		root = filepath.Dir(f.opts.BinDir)
	}
	return filepath.Join(root, "charts", "cce-ipam")
}

// simClient is a BCE client of the fleet's bce-sim with a generous budget.
func (f *Fleet) simClient() (*cloud.Client, error) {
	cfg := cloud.DefaultConfig()
	cfg.OpLimits = nil // no per-operation limits: only the rate above
	cfg.Endpoint = f.simURL
	cfg.Region = Region
	cfg.AccessKeyID = AccessKey
	cfg.SecretAccessKey = SecretKey
	cfg.Rate = 1000
	cfg.Burst = 1000
	return cloud.New(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
}

// startReplicas writes the keys every replica shares (gossip, forwarding)
// and starts Options.Replicas replicas, each waited for until ready.
func (f *Fleet) startReplicas(ctx context.Context) error {
	var err error
	if f.gossipKey, err = writeKey(f.Dir, "gossip.key"); err != nil {
		return err
	}
	if f.forwardKey, err = writeKey(f.Dir, "forward.key"); err != nil {
		return err
	}
	for range f.opts.Replicas {
		if _, err := f.AddReplica(ctx); err != nil {
			return err
		}
	}
	return nil
}

// startExternal uses an IPAM and bce-sim someone else runs.
func (f *Fleet) startExternal(ctx context.Context, e *External) error {
	o := &f.opts
	f.ClusterID, f.VPCID, f.SubnetID, f.SecurityGroup = e.ClusterID, e.VPCID, e.SubnetID, e.SecurityGroup
	f.simURL = strings.TrimRight(e.SimURL, "/")
	if !strings.Contains(f.simURL, "://") {
		f.simURL = "http://" + f.simURL
	}
	if f.Dir == "" {
		dir, err := os.MkdirTemp("", "cce-ipam-fleet-")
		if err != nil {
			return err
		}
		f.Dir = dir
	} else if err := os.MkdirAll(f.Dir, 0o755); err != nil {
		return err
	}
	f.Config, f.Kubeconfig = o.Config, o.Kubeconfig
	var err error
	if f.Kube, err = kubernetes.NewForConfig(f.Config); err != nil {
		return err
	}
	if f.CCE, err = cceclient.NewForConfig(f.Config); err != nil {
		return err
	}
	if f.Cloud, err = f.simClient(); err != nil {
		return err
	}
	if o.NoKubelet {
		return nil
	}
	if o.Nodes > 0 {
		if _, err := f.AddNodes(ctx, o.Nodes); err != nil {
			return err
		}
	}
	return f.startKubelet()
}

// External reports whether the fleet runs against an IPAM it did not start.
func (f *Fleet) External() bool { return f.opts.External != nil }

func writeKey(dir, name string) (string, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	return path, os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600)
}

// ForwardKeyFile is the forward key file the replicas are started with
// (base64 text, the format of the chart Secret's forward-key), for a client
// that signs operator calls (ipamctl allocate/release); empty for an
// external fleet.
func (f *Fleet) ForwardKeyFile() string { return f.forwardKey }

// Options returns the options the fleet runs with, defaults filled in.
func (f *Fleet) Options() Options { return f.opts }

// Replicas returns every replica ever added, removed ones included, in
// index order.
func (f *Fleet) Replicas() []*Replica {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*Replica(nil), f.replicas...)
}

// Live returns the replicas not removed (running, stopped or killed).
func (f *Fleet) Live() []*Replica {
	var out []*Replica
	for _, r := range f.Replicas() {
		if !r.Removed() {
			out = append(out, r)
		}
	}
	return out
}

// Replica returns the replica with index i (indexes are never reused).
func (f *Fleet) Replica(i int) *Replica {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.replicas {
		if r.index == i {
			return r
		}
	}
	return nil
}

// CNIAddrs returns the gRPC addresses of the replicas not removed (with
// External, its addresses).
func (f *Fleet) CNIAddrs() []string {
	if e := f.opts.External; e != nil {
		return append([]string(nil), e.CNIAddrs...)
	}
	var out []string
	for _, r := range f.Live() {
		out = append(out, r.GRPCAddr())
	}
	return out
}

// Nodes returns the names of the nodes the fleet registered and did not
// delete.
func (f *Fleet) Nodes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.nodes...)
}

// SimulatorName is the kubelet simulator's name: the value of
// kubeletsim.LabelSimulator on the fleet's nodes.
func (f *Fleet) SimulatorName() string { return f.opts.Name }

// NodeSelector selects the fleet's nodes.
func (f *Fleet) NodeSelector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{kubeletsim.LabelSimulator: f.SimulatorName()})
}

// Checker returns an invariant checker for the fleet: nodes are the fleet's
// (unless cfg.NodeSelector is set) and the cloud is its bce-sim's world (read
// through the admin API, so checks do not compete with the replicas for the
// ListENIs limit), ENIs named <cluster-id>/... .
func (f *Fleet) Checker(cfg invariants.Config) (*invariants.Checker, error) {
	if cfg.NodeSelector == nil {
		cfg.NodeSelector = f.NodeSelector()
	}
	return invariants.New(cfg, f.Kube, f.CCE, invariants.WorldView(f.SimWorld, f.ClusterID+"/"))
}

// AddNodes registers n more simulated nodes (instance, pre-attached ENI,
// IPPool, Node) and returns their names.
func (f *Fleet) AddNodes(ctx context.Context, n int) ([]string, error) {
	return f.AddNodesIn(ctx, n, f.SubnetID)
}

// AddNodesIn registers n more simulated nodes whose instances, first ENI
// and IPPool use subnetID (see AddSubnet).
func (f *Fleet) AddNodesIn(ctx context.Context, n int, subnetID string) ([]string, error) {
	// Names are never reused, also after DeleteNode: a deleted node's
	// instance and ENIs stay in bce-sim.
	f.mu.Lock()
	from := f.nodeSeq
	f.nodeSeq += n
	f.mu.Unlock()
	names := kubeletsim.NodeNames(f.opts.Name, from, n)
	cfg := f.kubeletConfig()
	cfg.SubnetID = subnetID
	reg, err := kubeletsim.New(cfg, kubeletsim.Deps{Kube: f.Kube, CCE: f.CCE,
		Instances: kubeletsim.AdminInstances(f.simURL, nil), ENIs: f.Cloud}, nil, prometheus.NewRegistry())
	if err != nil {
		return nil, err
	}
	infos, err := reg.RegisterNodes(ctx, names)
	f.mu.Lock()
	for _, in := range infos {
		f.nodes = append(f.nodes, in.Name)
	}
	f.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("fleet: register nodes: %w", err)
	}
	f.opts.Logger.Info("nodes registered", "count", len(infos))
	return names, nil
}

// DeleteNode deletes a node object (as a scale-in would); its IPPool stays,
// as the node agent's would until GC. The kubelet simulator stops serving it.
func (f *Fleet) DeleteNode(ctx context.Context, name string) error {
	if err := f.Kube.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, n := range f.nodes {
		if n == name {
			f.nodes = append(f.nodes[:i], f.nodes[i+1:]...)
			break
		}
	}
	return nil
}

// Close stops everything the fleet started, in reverse order: the kubelet
// simulator, the replicas (SIGTERM, SIGKILL after 10s) and their CNI
// clients, the fencing policy it installed in a SharedCluster, the fleet's
// nodes and IPPools when the control plane was given (so the next fleet on
// it does not see them), bce-sim, and the control plane it started. It is
// safe to call more than once.
func (f *Fleet) Close() error {
	f.closeOnce.Do(func() {
		var errs []error
		errs = append(errs, f.stopKubelet())
		if f.kubeletLogOut != nil {
			_ = f.kubeletLogOut.Close()
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, r := range f.Replicas() {
			wg.Go(func() {
				if err := r.stopProc(10 * time.Second); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		for _, r := range f.Replicas() {
			errs = append(errs, r.closeCNI())
		}
		if f.removeFencing != nil {
			f.removeFencing()
		}
		if f.Cluster == nil && f.Kube != nil {
			errs = append(errs, f.deleteObjects())
		}
		if f.netns != nil {
			errs = append(errs, f.netns.close())
		}
		if f.Cloud != nil {
			f.Cloud.Close()
		}
		if f.sim != nil {
			errs = append(errs, f.sim.Stop(5*time.Second))
		}
		f.mu.Lock()
		api := f.apiserver
		f.mu.Unlock()
		if api != nil {
			errs = append(errs, api.Stop(10*time.Second))
		}
		if f.Cluster != nil {
			errs = append(errs, f.Cluster.Close())
		}
		f.closeErr = errors.Join(errs...)
		if f.closeErr == nil && f.opts.Dir == "" && !f.opts.KeepDir && f.Dir != "" {
			f.closeErr = os.RemoveAll(f.Dir)
		}
	})
	return f.closeErr
}

// deleteObjects removes the fleet's nodes and IPPools from a shared control
// plane.
func (f *Fleet) deleteObjects() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: f.NodeSelector().String()}
	err1 := f.Kube.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, sel)
	err2 := f.CCE.CceV1alpha1().IPPools(cce.IPPoolNamespace).DeleteCollection(ctx, metav1.DeleteOptions{}, sel)
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("fleet: delete nodes and IPPools: %w", err)
	}
	return nil
}

// LogTails returns the last lines of every log, for failure reports.
func (f *Fleet) LogTails(lines int) string {
	var b strings.Builder
	for _, r := range f.Replicas() {
		fmt.Fprintf(&b, "==> replica %d (%s) <==\n%s\n", r.index, r.logPath, r.Logs(lines))
	}
	fmt.Fprintf(&b, "==> bce-sim <==\n%s\n", supervisor.LogTail(filepath.Join(f.Dir, "bce-sim.log"), lines/2))
	fmt.Fprintf(&b, "==> kubelet-sim <==\n%s\n", supervisor.LogTail(filepath.Join(f.Dir, "kubelet-sim.log"), lines/2))
	if f.Cluster != nil {
		b.WriteString(f.Cluster.Logs(lines / 4))
	}
	return b.String()
}
