//go:build integration

package ipam_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/pool"
)

// The ENI sync runs only when a test calls SyncENIs (the period is an hour),
// so each test decides when the replica looks at its nodes.
func aheadConfig(c *ipam.Config) {
	c.ENISyncPeriod = time.Hour
	c.PoolCheckPeriod = 200 * time.Millisecond
	c.Cooldown = time.Millisecond
}

// markNode sets (value "") or removes (value "-") annotations and labels of
// the node and its Ready condition, then waits for the IPAM's node cache to
// see them.
func (e *env) markNode(name string, ann, lbl map[string]string, ready bool) {
	e.t.Helper()
	nodes := e.kube.CoreV1().Nodes()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for dst, src := range map[*map[string]string]map[string]string{&n.Annotations: ann, &n.Labels: lbl} {
			if *dst == nil {
				*dst = map[string]string{}
			}
			for k, v := range src {
				if v == "-" {
					delete(*dst, k)
				} else {
					(*dst)[k] = v
				}
			}
		}
		n, err = nodes.Update(e.ctx, n, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastHeartbeatTime: metav1.Now()}}
		_, err = nodes.UpdateStatus(e.ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	eventually(e.t, 10*time.Second, "node cache sees "+name+"'s change", func() bool {
		obj, ok, _ := e.ipam.NodeInformer().GetStore().GetByKey(name)
		if !ok {
			return false
		}
		n := obj.(*corev1.Node)
		for k, v := range ann {
			if got, has := n.Annotations[k]; (v == "-" && has) || (v != "-" && got != v) {
				return false
			}
		}
		for k, v := range lbl {
			if got, has := n.Labels[k]; (v == "-" && has) || (v != "-" && got != v) {
				return false
			}
		}
		isReady := false
		for _, c := range n.Status.Conditions {
			isReady = isReady || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
		}
		return isReady == ready
	})
}

// instanceENIs returns bce-sim's ENIs of the node's instance (any status).
func (e *env) instanceENIs(node string) []bcesim.ENIView {
	var out []bcesim.ENIView
	for _, v := range e.sim.Dump().ENIs {
		if v.InstanceID == e.instance[node] || strings.Contains(v.Name, "/"+node+"/") {
			out = append(out, v)
		}
	}
	return out
}

// inUseENIs counts the node's ENIs bce-sim has attached.
func (e *env) inUseENIs(node string) int {
	n := 0
	for _, v := range e.instanceENIs(node) {
		if v.InstanceID == e.instance[node] && v.Status == bcesim.StatusInUse {
			n++
		}
	}
	return n
}

// sync runs one ENI sync and waits until no creation it started runs.
func (e *env) sync() {
	e.t.Helper()
	if err := e.ipam.SyncENIs(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	eventually(e.t, 30*time.Second, "ENI creations of the sync", func() bool {
		for _, n := range e.nodes {
			if e.ipam.ENICreatingForTest(n) {
				return false
			}
		}
		return true
	})
}

// ahead is the ENIs-ahead-of-demand counter of the IPAM.
func (e *env) ahead() float64 {
	return max(e.gauge("cce_ipam_enis_created_ahead_total"), 0)
}

// Pre-attach: a Ready node asking for 3 ENIs gets them from the ENI sync,
// one per sync, before any pod exists; nothing more afterwards.
func TestIPAM_ENIAhead_PreAttachedBeforeAnyPod(t *testing.T) {
	e := newEnvIn(t, "preatt", 1, testConfig(aheadConfig), world{annotateMaxIPs: true, ipPool: true})
	node := e.nodes[0]
	e.markNode(node, map[string]string{pool.AnnotationPreAttachedENINum: "3"}, nil, true)
	for want := 2; want <= 3; want++ {
		e.sync()
		if got := e.inUseENIs(node); got != want {
			t.Fatalf("after sync %d: %d ENIs in use, want %d", want-1, got, want)
		}
	}
	e.sync()
	if got, ahead := e.inUseENIs(node), e.ahead(); got != 3 || ahead != 2 {
		t.Fatalf("settled: %d ENIs in use (want 3), %v created ahead (want 2)", got, ahead)
	}
	if st := e.stats(node); st.Assigned != 0 {
		t.Fatalf("%d addresses assigned: the ENIs were to come before any pod", st.Assigned)
	}
	e.checkNoLeak()
}

// Warm IP target: with 16 addresses per ENI (15 for pods) and a target of
// 5, ten pods leave a spare of 5 (no new ENI); the eleventh leaves 4, and
// the next sync creates one although the first ENI still has room.
func TestIPAM_ENIAhead_WarmIPTarget(t *testing.T) {
	e := newEnvIn(t, "warm", 1, testConfig(aheadConfig), world{annotateMaxIPs: true, ipPool: true, memoryGB: 16})
	node := e.nodes[0]
	e.markNode(node, map[string]string{pool.AnnotationPreAttachedENINum: "1", pool.AnnotationWarmIPTarget: "5"}, nil, true)
	pods := e.createPods("w", 11)
	e.allocateAll(pods[:10], 4)
	e.sync()
	if got := e.inUseENIs(node); got != 1 {
		t.Fatalf("spare 5 = target 5: %d ENIs, want 1", got)
	}
	e.allocateAll(pods[10:], 1)
	e.sync()
	if got, ahead := e.inUseENIs(node), e.ahead(); got != 2 || ahead != 1 {
		t.Fatalf("spare 4 < target 5: %d ENIs (want 2), %v created ahead (want 1)", got, ahead)
	}
	e.checkNoLeak()
}

// max-eni-num caps: asking for 4 pre-attached ENIs on a node capped at 2
// stops at 2.
func TestIPAM_ENIAhead_MaxENINumCaps(t *testing.T) {
	e := newEnvIn(t, "maxeni", 1, testConfig(aheadConfig), world{annotateMaxIPs: true, ipPool: true, maxENIs: 2})
	node := e.nodes[0]
	e.markNode(node, map[string]string{pool.AnnotationPreAttachedENINum: "4"}, nil, true)
	for range 3 {
		e.sync()
	}
	if got := e.inUseENIs(node); got != 2 {
		t.Fatalf("%d ENIs in use, want the cap 2", got)
	}
}

// A node that is not Ready, and a node with an ENI on its way (created for
// it, not attached yet), get no ENI from the sync; each gets one once that
// changes.
func TestIPAM_ENIAhead_SkipsNotReadyAndInFlight(t *testing.T) {
	e := newEnvIn(t, "skip", 2, testConfig(aheadConfig), world{annotateMaxIPs: true, ipPool: true})
	notReady, inFlight := e.nodes[0], e.nodes[1]
	ann := map[string]string{pool.AnnotationPreAttachedENINum: "2"}
	e.markNode(notReady, ann, nil, false)
	e.markNode(inFlight, ann, nil, true)
	pending, err := e.cloud.CreateENI(e.ctx, cloudReq(testCluster+"/"+e.instance[inFlight]+"/"+inFlight+"/abcdef",
		"sbn-skip", "g-skip"))
	if err != nil {
		t.Fatal(err)
	}
	e.sync()
	if a, b := e.inUseENIs(notReady), e.inUseENIs(inFlight); a != 1 || b != 1 || e.ahead() != 0 {
		t.Fatalf("ENIs in use: not Ready %d, in flight %d (want 1 and 1), %v created ahead", a, b, e.ahead())
	}
	// The ENI on its way attaches; the other node becomes Ready.
	if err := e.cloud.AttachENI(e.ctx, pending, e.instance[inFlight]); err != nil {
		t.Fatal(err)
	}
	e.markNode(notReady, nil, nil, true)
	e.sync()
	if a, b := e.inUseENIs(notReady), e.inUseENIs(inFlight); a != 2 || b != 2 || e.ahead() != 1 {
		t.Fatalf("ENIs in use: was not Ready %d (want 2 by the sync), was in flight %d (want 2, the attached one), %v created ahead (want 1)",
			a, b, e.ahead())
	}
}

// An attaching ENI (BCE takes seconds) is in flight too: no second ENI.
func TestIPAM_ENIAhead_SkipsAttaching(t *testing.T) {
	e := newEnvIn(t, "attaching", 1, testConfig(aheadConfig), world{annotateMaxIPs: true, ipPool: true})
	node := e.nodes[0]
	if err := e.sim.SetAttachDelay(40 * time.Second); err != nil {
		t.Fatal(err)
	}
	id, err := e.cloud.CreateENI(e.ctx, cloudReq(testCluster+"/"+e.instance[node]+"/"+node+"/a77ach", "sbn-attaching", "g-attaching"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.cloud.AttachENI(e.ctx, id, e.instance[node]); err != nil {
		t.Fatal(err)
	}
	e.markNode(node, map[string]string{pool.AnnotationPreAttachedENINum: "3"}, nil, true)
	if err := e.ipam.SyncENIs(e.ctx); err != nil {
		t.Fatal(err)
	}
	if e.ipam.ENICreatingForTest(node) || len(e.instanceENIs(node)) != 2 || e.ahead() != 0 {
		t.Fatalf("an ENI is attaching: the sync started a creation (%d ENIs)", len(e.instanceENIs(node)))
	}
}

// addSubnet adds a subnet to bce-sim and, unless cr is nil, its Subnet
// resource with cr's spec flags and status, and waits for the IPAM's cache.
func (e *env) addSubnet(id, cidr string, cr *cce.Subnet) {
	e.t.Helper()
	if _, err := e.sim.AddSubnet(bcesim.SubnetSpec{ID: id, ZoneName: testZone, CIDR: cidr, VPCID: testVPC}); err != nil {
		e.t.Fatal(err)
	}
	if cr == nil {
		return
	}
	cr.ObjectMeta = metav1.ObjectMeta{Name: id, Namespace: cce.SubnetNamespace}
	cr.Spec.ID, cr.Spec.Name, cr.Spec.AvailabilityZone, cr.Spec.CIDR = id, id, testZone, cidr
	status := cr.Status
	created, err := e.cce.CceV1alpha1().Subnets(cce.SubnetNamespace).Create(e.ctx, cr, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	created.Status = status // no status subresource: written with the object
	if _, err := e.cce.CceV1alpha1().Subnets(cce.SubnetNamespace).Update(e.ctx, created, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = e.cce.CceV1alpha1().Subnets(cce.SubnetNamespace).Delete(context.Background(), id, metav1.DeleteOptions{})
	})
	eventually(e.t, 10*time.Second, "subnet cache sees "+id, func() bool {
		got := e.ipam.SubnetCachedForTest(id)
		return got != nil && got.Status == status && got.Spec.Exclusive == cr.Spec.Exclusive
	})
}

func (e *env) addPool(name, selector string, priority int32, eniSpec cce.ENISpec) {
	e.t.Helper()
	_, err := e.cce.CceV1alpha1().IPPools(cce.IPPoolNamespace).Create(e.ctx, &cce.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       cce.IPPoolSpec{NodeSelector: selector, Priority: priority, ENI: eniSpec},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = e.cce.CceV1alpha1().IPPools(cce.IPPoolNamespace).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// updateOwnPool changes the node's own IPPool's ENI spec.
func (e *env) updateOwnPool(node string, change func(*cce.ENISpec)) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := e.cce.CceV1alpha1().IPPools(cce.IPPoolNamespace).Get(e.ctx, cce.IPPoolName(node), metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(&p.Spec.ENI)
		_, err = e.cce.CceV1alpha1().IPPools(cce.IPPoolNamespace).Update(e.ctx, p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

// nodeWarning waits for a Warning event on the node whose message has every
// one of parts.
func (e *env) nodeWarning(node, reason string, parts ...string) {
	e.t.Helper()
	var seen []string
	eventually(e.t, 15*time.Second, fmt.Sprintf("a %s Warning on %s mentioning %v", reason, node, parts), func() bool {
		evs, err := e.kube.CoreV1().Events(metav1.NamespaceAll).List(e.ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + node,
		})
		if err != nil {
			return false
		}
		seen = seen[:0]
	next:
		for _, ev := range evs.Items {
			seen = append(seen, ev.Reason+": "+ev.Message)
			if ev.Type != corev1.EventTypeWarning || ev.Reason != reason {
				continue
			}
			for _, p := range parts {
				if !strings.Contains(ev.Message, p) {
					continue next
				}
			}
			return true
		}
		return false
	})
}

// Placement: the node matches its own pool (priority 0), a user pool of
// priority 5 and one of priority 10. The new ENI goes to the one usable
// subnet of the priority-10 pool, a /24, although its exclusive, disabled
// and exhausted subnets (/20s) and the lower pools' subnets have more free
// IPs (MostFreeIP would pick them). With only unusable subnets left, the
// creation fails with a Warning naming each and why, and no ENI is made.
func TestIPAM_ENIPlacement_TopPriorityUsableSubnets(t *testing.T) {
	e := newEnvIn(t, "place", 1, testConfig(aheadConfig), world{annotateMaxIPs: true, ipPool: true})
	node := e.nodes[0]
	e.addSubnet("sbn-place-hi", "10.5.0.0/24", &cce.Subnet{Status: cce.SubnetStatus{Enable: true}})
	e.addSubnet("sbn-place-excl", "10.6.0.0/20", &cce.Subnet{Spec: cce.SubnetSpec{Exclusive: true}, Status: cce.SubnetStatus{Enable: true}})
	e.addSubnet("sbn-place-off", "10.7.0.0/20", &cce.Subnet{Status: cce.SubnetStatus{Enable: false}})
	e.addSubnet("sbn-place-full", "10.8.0.0/20", &cce.Subnet{Status: cce.SubnetStatus{Enable: true, HasNoMoreIP: true}})
	e.addSubnet("sbn-place-mid", "10.9.0.0/20", &cce.Subnet{Status: cce.SubnetStatus{Enable: true}})
	e.addPool("place-top", "pool=place", 10, cce.ENISpec{VPCID: testVPC, AvailabilityZone: testZone,
		Subnets: []string{"sbn-place-excl", "sbn-place-off", "sbn-place-full", "sbn-place-hi"}})
	e.addPool("place-mid", "pool=place", 5, cce.ENISpec{VPCID: testVPC, AvailabilityZone: testZone,
		Subnets: []string{"sbn-place-mid"}, SecurityGroups: []string{"g-other"}})
	e.addPool("place-elsewhere", "pool=other", 20, cce.ENISpec{Subnets: []string{"sbn-place-mid"}})
	e.markNode(node, map[string]string{pool.AnnotationPreAttachedENINum: "2"}, map[string]string{"pool": "place"}, true)
	e.sync()
	var created []bcesim.ENIView
	for _, v := range e.instanceENIs(node) {
		if !strings.HasSuffix(v.Name, "/000000") {
			created = append(created, v)
		}
	}
	if len(created) != 1 || created[0].SubnetID != "sbn-place-hi" || !slices.Equal(created[0].SecurityGroupIDs, []string{"g-place"}) {
		t.Fatalf("new ENIs %+v: want one in sbn-place-hi with the node's own pool's group g-place", created)
	}

	// Nothing usable left at the top priority: no ENI, a clear Warning.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := e.cce.CceV1alpha1().IPPools(cce.IPPoolNamespace).Get(e.ctx, "place-top", metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Spec.ENI.Subnets = []string{"sbn-place-excl", "sbn-place-off", "sbn-place-full"}
		_, err = e.cce.CceV1alpha1().IPPools(cce.IPPoolNamespace).Update(e.ctx, p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	e.markNode(node, map[string]string{pool.AnnotationPreAttachedENINum: "3"}, nil, true)
	e.sync()
	e.nodeWarning(node, "CreateNewENIFailed", "no subnet qualifies", "sbn-place-excl exclusive", "sbn-place-off disabled",
		"sbn-place-full exhausted")
	if got := len(e.instanceENIs(node)); got != 2 {
		t.Fatalf("%d ENIs: no subnet qualified, so none was to be created", got)
	}
}

// Enterprise security groups: a node's own pool that sets them (and no
// ordinary groups) gets ENIs carrying them in bce-sim; a pool that sets
// both kinds is refused with a Warning and creates nothing.
func TestIPAM_ENIPlacement_EnterpriseSecurityGroups(t *testing.T) {
	e := newEnvIn(t, "esg", 2, testConfig(aheadConfig), world{annotateMaxIPs: true, ipPool: true})
	esgNode, bothNode := e.nodes[0], e.nodes[1]
	e.updateOwnPool(esgNode, func(s *cce.ENISpec) { s.SecurityGroups, s.EnterpriseSecurityGroups = nil, []string{"esg-tenant"} })
	e.updateOwnPool(bothNode, func(s *cce.ENISpec) { s.EnterpriseSecurityGroups = []string{"esg-tenant"} })
	ann := map[string]string{pool.AnnotationPreAttachedENINum: "2"}
	e.markNode(esgNode, ann, nil, true)
	e.markNode(bothNode, ann, nil, true)
	e.sync()
	var esgENI *bcesim.ENIView
	for _, v := range e.instanceENIs(esgNode) {
		if !strings.HasSuffix(v.Name, "/000000") {
			esgENI = &v
		}
	}
	if esgENI == nil || !slices.Equal(esgENI.EnterpriseSecurityGroupIDs, []string{"esg-tenant"}) || len(esgENI.SecurityGroupIDs) != 0 {
		t.Fatalf("new ENI %+v: want enterprise groups [esg-tenant] and no ordinary ones", esgENI)
	}
	e.nodeWarning(bothNode, "CreateNewENIFailed", "sets both securityGroups and enterpriseSecurityGroups")
	if got := len(e.instanceENIs(bothNode)); got != 1 {
		t.Fatalf("%d ENIs on the node whose pool sets both kinds: want none created", got)
	}
}

func cloudReq(name, subnet, sg string) cloud.CreateENIRequest {
	return cloud.CreateENIRequest{Name: name, SubnetID: subnet, SecurityGroupIDs: []string{sg}}
}
