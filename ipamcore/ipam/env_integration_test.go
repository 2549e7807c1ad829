//go:build integration

package ipam_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/e2e/cluster"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/cni"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

const (
	testAK      = "AKIPAMTEST"
	testSK      = "SKipamTestSecret"
	testVPC     = "vpc-ipam"
	testZone    = "cn-bj-a"
	testCluster = "cce-ipamtest"
)

var (
	cp          *cluster.Cluster
	installCRDs sync.Once
	crdErr      error
)

func TestMain(m *testing.M) {
	os.Exit(cluster.RunTests(m, cluster.Options{}, &cp))
}

// env is one test's world: bce-sim with a subnet and instances, Node objects
// backed by them (each with one attached ENI, as the node agent leaves it),
// and an IPAM serving them behind a real gRPC server.
type env struct {
	t        testing.TB
	ctx      context.Context
	sim      *bcesim.Server
	cloud    *cloud.Client
	kube     kubernetes.Interface
	cce      versioned.Interface
	ns       string
	nodes    []string
	instance map[string]string // node → instance ID
	unserved []string          // nodes created but not served (world.instanceTypes)
	cfg      ipam.Config

	ipam *ipam.IPAM
	reg  *prometheus.Registry
	cni  rpc.CNIBackendClient
	stop func()
}

// world shapes the simulated cloud of one env.
type world struct {
	subnetCIDR string // defaults to 10.1.0.0/20
	memoryGB   int    // per instance; defaults to 128 (40 IPs per ENI)
	// annotateMaxIPs sets cce.io/max-ip-per-eni on the nodes (the node
	// agent's view of the memory cap); without it the cloud is the only
	// authority on what fits.
	annotateMaxIPs bool
	maxENIs        int  // cce.io/max-eni-num, when set
	noENI          bool // no pre-attached ENI: the IPAM must create one
	ipPool         bool // an IPPool ippool-<node> as the node agent writes it
	secondSubnet   bool // the IPPool lists a second subnet, 10.4.0.0/20
	// instanceTypes labels node k beta.kubernetes.io/instance-type=
	// instanceTypes[k] ("" or past the end: no label). A node the IPAM does
	// not serve (ipam.ServesNode) goes to env.unserved, not env.nodes.
	instanceTypes []string
	// primaryOnlyCreate: bce-sim refuses ENIs created with secondary
	// addresses (bcesim.WorldConfig.CreateENIPrimaryOnly).
	primaryOnlyCreate bool
}

// testConfig is ipam.DefaultConfig with a test's changes.
func testConfig(change func(c *ipam.Config)) ipam.Config {
	c := ipam.DefaultConfig()
	change(&c)
	return c
}

func newEnv(t testing.TB, prefix string, nodes int, cfg ipam.Config) *env {
	return newEnvIn(t, prefix, nodes, cfg, world{annotateMaxIPs: true})
}

// envPrefixes counts the envs made with each prefix in this process.
var envPrefixes = struct {
	sync.Mutex
	n map[string]int
}{n: map[string]int{}}

// uniquePrefix is prefix the first time, then prefix-r2, -r3 ...: a test
// run again (go test -count=N) must name other nodes (the API server's
// objects outlive the test; the simulated cloud is the env's own), because
// the weps of its previous run outlive their namespace (finalizers) and
// still name the old nodes.
func uniquePrefix(prefix string) string {
	envPrefixes.Lock()
	defer envPrefixes.Unlock()
	envPrefixes.n[prefix]++
	if k := envPrefixes.n[prefix]; k > 1 {
		return fmt.Sprintf("%s-r%d", prefix, k)
	}
	return prefix
}

func newEnvIn(t testing.TB, prefix string, nodes int, cfg ipam.Config, w world) *env {
	t.Helper()
	nodePrefix := uniquePrefix(prefix)
	installCRDs.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		crdErr = cp.InstallCRDs(ctx, filepath.Join("..", "..", "charts", "cce-ipam", "crds"))
	})
	if crdErr != nil {
		t.Fatal(crdErr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &env{t: t, ctx: ctx, instance: map[string]string{}, ns: cp.Namespace(t)}
	e.kube = kubernetes.NewForConfigOrDie(cp.Config)
	e.cce = versioned.NewForConfigOrDie(cp.Config)

	sim, err := bcesim.New(bcesim.Config{Credentials: map[string]string{testAK: testSK}, PageSize: 100,
		World: bcesim.WorldConfig{CreateENIPrimaryOnly: w.primaryOnlyCreate}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	e.sim = sim
	if w.subnetCIDR == "" {
		w.subnetCIDR = "10.1.0.0/20"
	}
	if w.memoryGB == 0 {
		w.memoryGB = 128
	}
	subnet, err := sim.AddSubnet(bcesim.SubnetSpec{ID: "sbn-" + prefix, ZoneName: testZone, CIDR: w.subnetCIDR, VPCID: testVPC})
	if err != nil {
		t.Fatal(err)
	}
	poolSubnets := []string{subnet}
	if w.secondSubnet {
		second, err := sim.AddSubnet(bcesim.SubnetSpec{ID: "sbn-" + prefix + "-b", ZoneName: testZone, CIDR: "10.4.0.0/20", VPCID: testVPC})
		if err != nil {
			t.Fatal(err)
		}
		poolSubnets = append(poolSubnets, second)
	}
	sg, err := sim.AddSecurityGroup(bcesim.SecurityGroupSpec{ID: "g-" + prefix, VPCID: testVPC})
	if err != nil {
		t.Fatal(err)
	}
	bceCfg := cloud.DefaultConfig()
	bceCfg.OpLimits = nil // no per-operation limits: only the rate above
	bceCfg.Endpoint = sim.URL()
	bceCfg.AccessKeyID = testAK
	bceCfg.SecretAccessKey = testSK
	bceCfg.Rate = 1e6
	bceCfg.Burst = 1e6
	bceCfg.SDKRetryBase = time.Millisecond
	bceCfg.ThrottleBackoff = time.Millisecond
	e.cloud, err = cloud.New(bceCfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.cloud.Close)

	for k := range nodes {
		name := fmt.Sprintf("%s-node-%02d", nodePrefix, k)
		inst, err := sim.AddInstance(bcesim.InstanceSpec{
			ID: fmt.Sprintf("i-%s-%02d", prefix, k), SubnetID: subnet, CPUCount: 16, MemoryGB: w.memoryGB, SecurityGroupIDs: []string{sg},
		})
		if err != nil {
			t.Fatal(err)
		}
		if !w.noENI {
			eni, err := e.cloud.CreateENI(ctx, cloud.CreateENIRequest{
				Name: testCluster + "/" + inst + "/" + name + "/000000", SubnetID: subnet, SecurityGroupIDs: []string{sg},
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := e.cloud.AttachENI(ctx, eni, inst); err != nil {
				t.Fatal(err)
			}
		}
		if w.ipPool {
			_, err := e.cce.CceV1alpha1().IPPools(cce.IPPoolNamespace).Create(ctx, &cce.IPPool{
				ObjectMeta: metav1.ObjectMeta{Name: cce.IPPoolName(name)},
				Spec: cce.IPPoolSpec{NodeSelector: "kubernetes.io/hostname=" + name, CreationSource: "cce-cni",
					ENI: cce.ENISpec{VPCID: testVPC, AvailabilityZone: testZone, Subnets: poolSubnets, SecurityGroups: []string{sg}}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = e.cce.CceV1alpha1().IPPools(cce.IPPoolNamespace).Delete(context.Background(), cce.IPPoolName(name), metav1.DeleteOptions{})
			})
		}
		annotations := map[string]string{}
		if w.maxENIs > 0 {
			annotations[cce.AnnotationMaxENINum] = strconv.Itoa(w.maxENIs)
		}
		if w.annotateMaxIPs {
			annotations[cce.AnnotationMaxIPPerENI] = strconv.Itoa(bcesim.MaxIPsPerENI(w.memoryGB))
		}
		var labels map[string]string
		if k < len(w.instanceTypes) && w.instanceTypes[k] != "" {
			labels = map[string]string{ipam.LabelInstanceTypeBeta: w.instanceTypes[k]}
		}
		created, err := e.kube.CoreV1().Nodes().Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations, Labels: labels},
			Spec:       corev1.NodeSpec{ProviderID: "cce://" + inst},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.kube.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		if served, _ := ipam.ServesNode(created); served {
			e.nodes = append(e.nodes, name)
		} else {
			e.unserved = append(e.unserved, name)
		}
		e.instance[name] = inst
	}
	cfg.ClusterID, cfg.VPCID = testCluster, testVPC
	e.cfg = cfg
	e.start()
	return e
}

// start runs a fresh IPAM (a new process, as far as state goes) serving every
// node, behind a gRPC server on 127.0.0.1.
func (e *env) start() { e.startWith(nil) }

// startWith is start with beforeServe run on the new IPAM, running, before
// it serves the nodes.
func (e *env) startWith(beforeServe func(ctx context.Context, ip *ipam.IPAM)) {
	t := e.t
	t.Helper()
	e.reg = prometheus.NewRegistry()
	ip, err := ipam.New(e.cfg, ipam.Deps{Kube: e.kube, CCE: e.cce, Cloud: e.cloud}, slog.New(slog.DiscardHandler), e.reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- ip.Run(ctx) }()
	if beforeServe != nil {
		beforeServe(ctx, ip)
	}
	// All at once, as a takeover does (from bulkRebuildNodes nodes on, the
	// weps are read in one bulk read).
	for n, err := range ip.ServeNodes(ctx, e.nodes) {
		cancel()
		t.Fatalf("serve %s: %v", n, err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rpc.RegisterCNIBackendServer(gs, cni.NewServer(cni.DefaultConfig(), ip, nil, nil))
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			_ = conn.Close()
			gs.Stop()
			cancel()
			if err := <-runErr; err != nil {
				t.Errorf("ipam Run: %v", err)
			}
		})
	}
	t.Cleanup(e.stop)
	e.ipam, e.cni = ip, rpc.NewCNIBackendClient(conn)
}

// restart stops the IPAM and starts a new one with empty memory.
func (e *env) restart() {
	e.stop()
	e.start()
}

type podRef struct {
	name, node, containerID string
}

// createPods creates bound pods, as the scheduler would leave them.
func (e *env) createPods(prefix string, perNode int) []podRef {
	e.t.Helper()
	var pods []podRef
	for _, n := range e.nodes {
		for k := range perNode {
			p := podRef{name: fmt.Sprintf("%s-%s-%d", prefix, n, k), node: n, containerID: fmt.Sprintf("%064x", len(pods)+1)}
			_, err := e.kube.CoreV1().Pods(e.ns).Create(e.ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: p.name},
				Spec:       corev1.PodSpec{NodeName: n, Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
			}, metav1.CreateOptions{})
			if err != nil {
				e.t.Fatal(err)
			}
			pods = append(pods, p)
		}
	}
	return pods
}

// allocateAll calls AllocateIP for every pod from `workers` goroutines and
// returns pod name → reply. A "busy" answer is retried, as kubelet would.
func (e *env) allocateAll(pods []podRef, workers int) map[string]*rpc.ENIMultiIPReply {
	e.t.Helper()
	out := map[string]*rpc.ENIMultiIPReply{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	work := make(chan podRef)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range work {
				reply, err := e.allocate(p)
				mu.Lock()
				if err != nil {
					e.t.Errorf("allocate %s: %v", p.name, err)
				} else {
					out[p.name] = reply
				}
				mu.Unlock()
			}
		}()
	}
	for _, p := range pods {
		work <- p
	}
	close(work)
	wg.Wait()
	return out
}

func (e *env) allocate(p podRef) (*rpc.ENIMultiIPReply, error) {
	return e.allocateTries(p, 20)
}

// allocateTries calls AllocateIP until it succeeds, at most tries+1 times.
func (e *env) allocateTries(p podRef, tries int) (*rpc.ENIMultiIPReply, error) {
	for attempt := 0; ; attempt++ {
		reply, err := e.cni.AllocateIP(e.ctx, &rpc.AllocateIPRequest{
			K8SPodName: p.name, K8SPodNamespace: e.ns, K8SPodInfraContainerID: p.containerID, K8SNodeName: p.node,
		})
		if err != nil {
			return nil, err
		}
		if reply.IsSuccess {
			return reply.GetENIMultiIP(), nil
		}
		if attempt >= tries {
			return nil, fmt.Errorf("%s", reply.ErrMsg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// release is a DEL, and waits until the release has finished (the DEL is
// answered once the wep's delete is marked; ReleaseSettledForTest).
func (e *env) release(p podRef) (*rpc.ReleaseIPReply, error) {
	reply, err := e.cni.ReleaseIP(e.ctx, &rpc.ReleaseIPRequest{
		K8SPodName: p.name, K8SPodNamespace: e.ns, K8SPodInfraContainerID: p.containerID, K8SNodeName: p.node,
	})
	e.ipam.ReleaseSettledForTest(e.ns, p.name)
	return reply, err
}

// cloudIPs returns, per instance, the non-primary addresses bce-sim has on
// the instance's ENIs.
func (e *env) cloudIPs() map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for _, eni := range e.sim.Dump().ENIs {
		if out[eni.InstanceID] == nil {
			out[eni.InstanceID] = map[string]bool{}
		}
		for _, ip := range eni.PrivateIPSet {
			if !ip.Primary {
				out[eni.InstanceID][ip.PrivateIPAddress] = true
			}
		}
	}
	return out
}

// checkNoLeak proves every cloud IP of every node is known to the datastore
// and vice versa (I4 for a settled pool), and bce-sim's own invariants hold.
func (e *env) checkNoLeak() {
	e.t.Helper()
	e.checkNoLeakOwned(func(string) *ipam.IPAM { return e.ipam })
}

// checkNoLeakOwned is checkNoLeak reading each node's datastore from
// owner(node), for tests that run several replicas. A pool worker may be
// between a cloud write and its record (a refill or a trim in flight), so
// the counts must agree within 10 s; a leak or a loss never does.
func (e *env) checkNoLeakOwned(owner func(node string) *ipam.IPAM) {
	e.t.Helper()
	if err := e.sim.Check(); err != nil {
		e.t.Fatalf("bce-sim invariants: %v", err)
	}
	var mismatch []string
	settles(10*time.Second, func() bool {
		mismatch = mismatch[:0]
		cloudIPs := e.cloudIPs()
		for _, n := range e.nodes {
			st, err := owner(n).Stats(n)
			if err != nil {
				e.t.Fatal(err)
			}
			if got := len(cloudIPs[e.instance[n]]); got != st.Total {
				mismatch = append(mismatch, fmt.Sprintf("node %s: cloud has %d IPs, its owner's datastore %d (leak or loss)", n, got, st.Total))
			}
		}
		return len(mismatch) == 0
	})
	for _, m := range mismatch {
		e.t.Error(m)
	}
}

func (e *env) stats(n string) datastore.NodeStats {
	e.t.Helper()
	st, err := e.ipam.Stats(n)
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

// eventually polls cond for up to d (e2e-style: the pool worker runs on its
// own goroutine).
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !settles(d, cond) {
		t.Fatalf("timed out after %s waiting for %s", d, what)
	}
}

// settles polls cond for up to d and reports whether it came to hold; a
// caller that reports what it saw keeps it from cond's last call.
func settles(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// gauge reads a gauge (or counter) of the IPAM's registry; labels are name,
// value pairs. It returns -1 when the series is absent.
func (e *env) gauge(name string, labels ...string) float64 {
	e.t.Helper()
	return metricValue(e.t, e.reg, name, labels...)
}

// metricValue is env.gauge for any registry (an IPAM a test built itself).
func metricValue(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k := 0; k+1 < len(labels); k += 2 {
				if have[labels[k]] != labels[k+1] {
					continue next
				}
			}
			if m.Gauge != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}
