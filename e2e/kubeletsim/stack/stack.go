package stack

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/e2e/invariants"
	"github.com/cce-ipam/sharded/e2e/kubeletsim"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/cni"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// Credentials of the in-process bce-sim.
const (
	AccessKey = "AKKUBELETSIM"
	SecretKey = "SKkubeletSimSecret"
)

// Options shape one stack. Zero values get the documented defaults.
type Options struct {
	// Name prefixes the cluster ID, VPC, subnet, nodes and the simulator
	// name, so stacks of different tests never share objects. Required;
	// lower case letters, digits and dashes.
	Name string
	// Nodes is the number of simulated nodes. Defaults to 1.
	Nodes int
	// Namespace is the only namespace whose pods the simulator runs.
	// Required (tests share one control plane).
	Namespace string
	// SubnetCIDR defaults to 10.1.0.0/20.
	SubnetCIDR string
	// MemoryGB per instance sets max-ip-per-eni. Defaults to 64 (30 IPs).
	MemoryGB int
	// IPAM, when set, adjusts the IPAM's config: ipam.DefaultConfig with
	// test-friendly pool timings (IdleMin 2, IdleMax 6, Cooldown 200ms,
	// PoolCheckPeriod 1s, GCPeriod 5s); ClusterID and VPCID are filled in.
	IPAM func(*ipam.Config)
	// Kubelet, when set, adjusts the simulator's config (kubeletsim's
	// DefaultConfig); the endpoint, names and cloud placement are filled in.
	Kubelet func(*kubeletsim.Config)
	// NoServe registers the nodes without asking the IPAM to serve them;
	// call Serve later.
	NoServe bool
}

// Stack is a running IPAM with its cloud and kubelets.
type Stack struct {
	Opts Options
	// IPAMConfig is the config the IPAM runs with.
	IPAMConfig ipam.Config
	ClusterID  string
	VPCID      string
	SubnetID   string
	Zone       string
	Kube       kubernetes.Interface
	CCE        cceclient.Interface
	BCE        *bcesim.Server
	Cloud      *cloud.Client
	IPAM       *ipam.IPAM
	Kubelet    *kubeletsim.Simulator
	CNIAddr    string
	Nodes      []kubeletsim.NodeInfo

	ctx context.Context
	t   testing.TB
}

// Start brings the stack up or fails the test: the in-process bce-sim and
// its client, the IPAM behind a gRPC server, then the kubelet simulator with
// its nodes.
func Start(t testing.TB, cfg *rest.Config, o Options) *Stack {
	t.Helper()
	if o.Name == "" || o.Namespace == "" {
		t.Fatal("stack: Name and Namespace are required")
	}
	o.fillDefaults()
	s := &Stack{
		t:         t,
		ClusterID: "cce-" + o.Name,
		VPCID:     "vpc-" + o.Name,
		Zone:      "cn-bj-a",
	}
	s.IPAMConfig = o.ipamConfig(s.ClusterID, s.VPCID)
	s.Opts = o
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s.ctx = ctx
	s.Kube = kubernetes.NewForConfigOrDie(cfg)
	s.CCE = cceclient.NewForConfigOrDie(cfg)

	sg := s.startCloud(t)
	s.startIPAM(t)
	s.startKubelets(t, sg)
	return s
}

// fillDefaults gives zero fields the documented defaults.
func (o *Options) fillDefaults() {
	if o.Nodes == 0 {
		o.Nodes = 1
	}
	if o.SubnetCIDR == "" {
		o.SubnetCIDR = "10.1.0.0/20"
	}
	if o.MemoryGB == 0 {
		o.MemoryGB = 64
	}
}

// ipamConfig is the stack's IPAM config: the defaults, the test-friendly
// pool timings, then the test's adjustments.
func (o Options) ipamConfig(clusterID, vpcID string) ipam.Config {
	c := ipam.DefaultConfig()
	c.IdleMin, c.IdleMax = 2, 6
	c.Cooldown = 200 * time.Millisecond
	c.PoolCheckPeriod = time.Second
	c.GCPeriod = 5 * time.Second
	if o.IPAM != nil {
		o.IPAM(&c)
	}
	c.ClusterID, c.VPCID = clusterID, vpcID
	return c
}

// startCloud starts bce-sim with the stack's subnet and security group (whose
// ID it returns) and a BCE client without a meaningful budget.
func (s *Stack) startCloud(t testing.TB) (securityGroup string) {
	t.Helper()
	o := s.Opts
	sim, err := bcesim.New(bcesim.Config{
		Credentials: map[string]string{AccessKey: SecretKey},
		PageSize:    100,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	s.BCE = sim
	subnet := bcesim.SubnetSpec{
		ID:       "sbn-" + o.Name,
		ZoneName: s.Zone,
		CIDR:     o.SubnetCIDR,
		VPCID:    s.VPCID,
	}
	if s.SubnetID, err = sim.AddSubnet(subnet); err != nil {
		t.Fatal(err)
	}
	sg, err := sim.AddSecurityGroup(bcesim.SecurityGroupSpec{
		ID:    "g-" + o.Name,
		VPCID: s.VPCID,
	})
	if err != nil {
		t.Fatal(err)
	}
	bceCfg := cloud.DefaultConfig()
	bceCfg.OpLimits = nil // no per-operation limits: only the rate above
	bceCfg.Endpoint = sim.URL()
	bceCfg.AccessKeyID = AccessKey
	bceCfg.SecretAccessKey = SecretKey
	bceCfg.Rate = 1e6
	bceCfg.Burst = 1e6
	bceCfg.SDKRetryBase = time.Millisecond
	bceCfg.ThrottleBackoff = time.Millisecond
	s.Cloud, err = cloud.New(bceCfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Cloud.Close)
	return sg
}

// startIPAM runs the IPAM until its caches synced and serves it over gRPC
// on a free 127.0.0.1 port (CNIAddr).
func (s *Stack) startIPAM(t testing.TB) {
	t.Helper()
	var err error
	deps := ipam.Deps{
		Kube:  s.Kube,
		CCE:   s.CCE,
		Cloud: s.Cloud,
	}
	s.IPAM, err = ipam.New(s.IPAMConfig, deps, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s.goRun(t, "ipam", s.IPAM.Run)
	select {
	case <-s.IPAM.Ready():
	case <-time.After(time.Minute):
		t.Fatal("stack: IPAM caches did not sync")
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rpc.RegisterCNIBackendServer(gs, cni.NewServer(cni.DefaultConfig(), s.IPAM, slog.New(slog.DiscardHandler), prometheus.NewRegistry()))
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis)
	}()
	t.Cleanup(func() {
		gs.Stop()
		<-served
	})
	s.CNIAddr = lis.Addr().String()
}

// startKubelets registers the nodes (served unless NoServe) and runs the
// kubelet simulator until its caches synced.
func (s *Stack) startKubelets(t testing.TB, securityGroup string) {
	t.Helper()
	o := s.Opts
	kc := kubeletsim.DefaultConfig()
	if o.Kubelet != nil {
		o.Kubelet(&kc)
	}
	kc.Name, kc.CNIEndpoint, kc.Namespace = o.Name, s.CNIAddr, o.Namespace
	kc.ClusterID, kc.VPCID, kc.SubnetID, kc.Zone = s.ClusterID, s.VPCID, s.SubnetID, s.Zone
	kc.SecurityGroupIDs = []string{securityGroup}
	kc.InstanceCPUs, kc.InstanceMemoryGB, kc.IPPool = 8, o.MemoryGB, true
	var err error
	s.Kubelet, err = kubeletsim.New(kc, kubeletsim.Deps{
		Kube:      s.Kube,
		CCE:       s.CCE,
		Instances: kubeletsim.InProcessInstances(s.BCE),
		ENIs:      s.Cloud,
	}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	names := kubeletsim.NodeNames(o.Name, 0, o.Nodes)
	t.Cleanup(func() { s.deleteNodes(names) })
	if s.Nodes, err = s.Kubelet.RegisterNodes(s.ctx, names); err != nil {
		t.Fatal(err)
	}
	if !o.NoServe {
		s.Serve()
	}
	s.goRun(t, "kubelet-sim", s.Kubelet.Run)
	select {
	case <-s.Kubelet.Synced():
	case <-time.After(time.Minute):
		t.Fatal("stack: kubelet simulator caches did not sync")
	}
}

// goRun runs fn(ctx) until the test ends; cleanup cancels and waits for it.
func (s *Stack) goRun(t testing.TB, what string, fn func(context.Context) error) {
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: %v", what, err)
			}
		})
	})
}

// Serve asks the IPAM to serve every node of the stack.
func (s *Stack) Serve() {
	s.t.Helper()
	for _, n := range s.Nodes {
		if err := s.IPAM.ServeNode(s.ctx, n.Name); err != nil {
			s.t.Fatal(err)
		}
	}
}

// NodeNames returns the names of the stack's nodes.
func (s *Stack) NodeNames() []string {
	out := make([]string, len(s.Nodes))
	for i, n := range s.Nodes {
		out[i] = n.Name
	}
	return out
}

// Checker returns an invariant checker scoped to this stack's nodes and
// cloud; cfg.NodeSelector is set to the stack's nodes.
func (s *Stack) Checker(cfg invariants.Config) *invariants.Checker {
	s.t.Helper()
	cfg.NodeSelector = labels.SelectorFromSet(labels.Set{kubeletsim.LabelSimulator: s.Opts.Name})
	chk, err := invariants.New(cfg, s.Kube, s.CCE, invariants.SimView(s.BCE, s.ClusterID+"/"))
	if err != nil {
		s.t.Fatal(err)
	}
	return chk
}

func (s *Stack) deleteNodes(names []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range names {
		_ = s.Kube.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{})
		_ = s.CCE.CceV1alpha1().IPPools(cce.IPPoolNamespace).Delete(ctx, cce.IPPoolName(n), metav1.DeleteOptions{})
	}
}

// Eventually polls cond every 100ms until it holds or d passes, then fails
// the test with what and cond's last message.
func Eventually(t testing.TB, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %s", d, what, msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Sanitize turns a test name into a stack name.
func Sanitize(name string) string {
	name = strings.ToLower(name)
	var b strings.Builder
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	out := strings.Trim(b.String(), "-")
	if len(out) > 20 {
		out = strings.Trim(out[len(out)-20:], "-")
	}
	return fmt.Sprint(out)
}
