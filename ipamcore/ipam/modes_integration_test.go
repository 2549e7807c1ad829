//go:build integration

package ipam_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/baidubce/bce-sdk-go/services/eni"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/cloud"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// foreignTypes are the IP types of the reference's other IPAMs, with the
// name a user knows them by.
var foreignTypes = map[rpc.IPType]string{
	rpc.IPType_BBCPrimaryENIMultiIPType: "BBC",
	rpc.IPType_CrossVPCENIIPType:        "cross-VPC ENI",
	rpc.IPType_RoCEENIMultiIPType:       "RoCE",
	rpc.IPType_ERIENIMultiIPType:        "ERI",
}

// Through the real gRPC server, in a vpc-secondary-ip mode other than the
// default: BCC pods are served; an ADD of another IPAM's type fails naming
// the type and leaves nothing behind; its DEL succeeds when we hold nothing
// (the pod's teardown is not blocked) and frees what we hold for the pod.
func TestIPAM_ForeignIPTypes(t *testing.T) {
	e := newEnv(t, "iptypes", 1, testConfig(func(c *ipam.Config) { c.CNIMode = ipam.CNIModeSecondaryIPIPVlan }))
	pods := e.createPods("p", 2)
	bcc, other := pods[0], pods[1]
	served, err := e.allocate(bcc)
	if err != nil {
		t.Fatalf("BCC pod in %s mode: %v", e.cfg.CNIMode, err)
	}

	for typ, name := range foreignTypes {
		add, err := e.cni.AllocateIP(e.ctx, &rpc.AllocateIPRequest{K8SPodName: other.name, K8SPodNamespace: e.ns,
			K8SPodInfraContainerID: other.containerID, K8SNodeName: other.node, IPType: typ})
		if err != nil || add.IsSuccess || !strings.Contains(add.ErrMsg, "unsupported IP type") ||
			!strings.Contains(add.ErrMsg, name+" pods") {
			t.Fatalf("ADD of type %s = %v, err %v; want a failure naming %s", typ, add, err, name)
		}
		del, err := e.cni.ReleaseIP(e.ctx, &rpc.ReleaseIPRequest{K8SPodName: other.name, K8SPodNamespace: e.ns,
			K8SPodInfraContainerID: other.containerID, K8SNodeName: other.node, IPType: typ})
		if err != nil || !del.IsSuccess || del.GetENIMultiIP() != nil {
			t.Fatalf("DEL of type %s for a pod we hold nothing for = %v, err %v; want success without address", typ, del, err)
		}
	}
	if _, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, other.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("wep of the refused pod: err %v, want not found", err)
	}

	// A pod we do hold an address for (ADDed as BCC), DELeted with a BBC
	// type: released as BCC.
	del, err := e.cni.ReleaseIP(e.ctx, &rpc.ReleaseIPRequest{K8SPodName: bcc.name, K8SPodNamespace: e.ns,
		K8SPodInfraContainerID: bcc.containerID, K8SNodeName: bcc.node, IPType: rpc.IPType_BBCPrimaryENIMultiIPType})
	if err != nil || !del.IsSuccess || del.GetENIMultiIP().GetIP() != served.GetIP() {
		t.Fatalf("BBC-typed DEL of a pod holding %s = %v, err %v; want it released", served.GetIP(), del, err)
	}
	e.ipam.ReleaseSettledForTest(e.ns, bcc.name)
	if _, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, bcc.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("wep of the released pod: err %v, want it deleted", err)
	}
	if st := e.stats(bcc.node); st.Assigned != 0 {
		t.Fatalf("node stats after the DELs %+v, want nothing assigned", st)
	}
	e.checkNoLeak()
}

// The reference's BCC node selection: nodes labelled BCC, GPU or DCC get
// ENIs and a pool; a BBC node with a cce:// providerID gets neither, even
// when asked to serve it, nor does the ENI sync touch its instance.
func TestIPAM_ServesOnlyBCCNodes(t *testing.T) {
	e := newEnvIn(t, "bccsel", 4, testConfig(func(c *ipam.Config) { c.AllocateWait = 30 * time.Second }),
		world{annotateMaxIPs: true, noENI: true, ipPool: true, instanceTypes: []string{"BCC", "GPU", "DCC", "BBC"}})
	if len(e.nodes) != 3 || len(e.unserved) != 1 {
		t.Fatalf("served %v, unserved %v; want the BCC, GPU and DCC nodes served", e.nodes, e.unserved)
	}
	bbc := e.unserved[0]
	replies := e.allocateAll(e.createPods("p", 1), 3)
	if len(replies) != 3 {
		t.Fatalf("%d of 3 pods on BCC/GPU/DCC nodes got an IP", len(replies))
	}

	if err := e.ipam.ServeNode(e.ctx, bbc); !errors.Is(err, ipam.ErrNotBCCNode) || !strings.Contains(err.Error(), `"BBC"`) {
		t.Fatalf("ServeNode(BBC node) = %v, want ErrNotBCCNode naming the type", err)
	}
	if _, err := e.ipam.Stats(bbc); err == nil {
		t.Fatal("the BBC node has a pool")
	}
	if err := e.ipam.SyncENIs(e.ctx); err != nil {
		t.Fatal(err)
	}
	withENI := map[string]bool{}
	for _, eni := range e.sim.Dump().ENIs {
		withENI[eni.InstanceID] = true
	}
	for _, n := range e.nodes {
		if !withENI[e.instance[n]] {
			t.Errorf("node %s (%s) has no ENI", n, e.instance[n])
		}
	}
	if withENI[e.instance[bbc]] {
		t.Fatalf("the BBC node's instance %s got an ENI", e.instance[bbc])
	}
	pool, err := e.cce.CceV1alpha1().IPPools(cce.IPPoolNamespace).Get(e.ctx, cce.IPPoolName(bbc), metav1.GetOptions{})
	if err != nil || len(pool.Status.ENI.ENIs) != 0 {
		t.Fatalf("the BBC node's IPPool status lists %d ENIs (err %v), want none", len(pool.Status.ENI.ENIs), err)
	}
}

// An ERI (traffic mode highPerformance) attached to a served node's
// instance, named like the cluster's ENIs and holding secondary IPs, is
// never adopted as a pod ENI: no pod gets its IPs, the datastore never
// holds them, and neither the ENI sync nor the GC deletes them.
func TestIPAM_ERIsNotAdopted(t *testing.T) {
	// The SDK's constructor initializes its package's HTTP client once, a
	// write the race detector sees against the IPAM's calls: build it
	// before anything runs, and point it at bce-sim once that is up.
	sdk, err := eni.NewClient(testAK, testSK, "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, "eri", 1, testConfig(func(c *ipam.Config) {
		c.ReadLag = 50 * time.Millisecond
		c.LeakGrace = time.Millisecond
	}))
	node := e.nodes[0]
	inst := e.instance[node]
	var subnet string
	var groups []string
	for _, v := range e.sim.Dump().ENIs {
		if v.InstanceID == inst {
			subnet, groups = v.SubnetID, v.SecurityGroupIDs
		}
	}
	// Created through the real SDK: cloud.Client makes only standard ENIs.
	sdk.Config.Endpoint = e.sim.URL()
	created, err := sdk.CreateEni(&eni.CreateEniArgs{Name: testCluster + "/" + inst + "/" + node + "/e71e71", SubnetId: subnet,
		SecurityGroupIds: groups, PrivateIpSet: []eni.PrivateIp{{Primary: true}}, NetworkInterfaceTrafficMode: "highPerformance"})
	if err != nil {
		t.Fatal(err)
	}
	eriID := created.EniId
	if err := e.cloud.AttachENI(e.ctx, eriID, inst); err != nil {
		t.Fatal(err)
	}
	eriIPs, err := e.cloud.BatchAddPrivateIPs(e.ctx, eriID, cloud.BatchAddRequest{Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	eriIPs = append(eriIPs, "") // the primary, whatever it is, must not show up either
	onERI := func(ip string) bool { return slices.Contains(eriIPs, ip) }

	// A fresh IPAM takes the node over (rebuild from the ENI list), the ENI
	// sync runs twice (two reads agree), pods allocate, the GC runs past
	// the leak grace.
	e.restart()
	for range 2 {
		if err := e.ipam.SyncENIs(e.ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	replies := e.allocateAll(e.createPods("p", 8), 2)
	if len(replies) != 8 {
		t.Fatalf("%d of 8 pods got an IP", len(replies))
	}
	for pod, r := range replies {
		if r.GetENIID() == eriID || onERI(r.GetIP()) {
			t.Fatalf("pod %s got %s on %s: an ERI's", pod, r.GetIP(), r.GetENIID())
		}
	}
	for range 2 {
		e.ipam.CollectGarbage(e.ctx)
		time.Sleep(10 * time.Millisecond)
	}
	if err := e.ipam.SyncENIs(e.ctx); err != nil {
		t.Fatal(err)
	}
	var still int
	for _, v := range e.sim.Dump().ENIs {
		if v.ENIID != eriID {
			continue
		}
		if v.InstanceID != inst || v.NetworkInterfaceTrafficMode != "highPerformance" {
			t.Fatalf("the ERI was changed: %+v", v)
		}
		for _, ip := range v.PrivateIPSet {
			if onERI(ip.PrivateIPAddress) {
				still++
			}
		}
	}
	if still != 3 {
		t.Fatalf("%d of the ERI's 3 secondary IPs are left, want all", still)
	}
	standard := 0
	for _, v := range e.sim.Dump().ENIs {
		if v.ENIID == eriID {
			continue
		}
		for _, ip := range v.PrivateIPSet {
			if !ip.Primary {
				standard++
			}
		}
	}
	eventually(t, 10*time.Second, "the datastore to hold exactly the standard ENI's IPs", func() bool {
		return e.stats(node).Total == standard
	})
}
