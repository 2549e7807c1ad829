//go:build integration

package webhook_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cce-ipam/sharded/cloud/bcesim"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/webhook"
	"github.com/cce-ipam/sharded/ipamcore/webhook/certs"
)

const zoneKey = "topology.kubernetes.io/zone"

// zonesOf returns the zone values of each required node selector term.
func zonesOf(p *corev1.Pod) [][]string {
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
	}
	var out [][]string
	for _, t := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		var zones []string
		for _, e := range t.MatchExpressions {
			if e.Key == zoneKey {
				zones = e.Values
			}
		}
		out = append(out, zones)
	}
	return out
}

func ipResource(c corev1.Container) (string, string) {
	name := corev1.ResourceName(cce.ResourceIP)
	req, lim := c.Resources.Requests[name], c.Resources.Limits[name]
	return req.String(), lim.String()
}

// mutated reports how p differs from what a pod of PSTS psts with zones
// must look like; "" when it is right.
func mutated(p *corev1.Pod, psts string, zones []string) string {
	if got := p.Annotations[cce.AnnotationPodSubnetTopologySpread]; got != psts {
		return fmt.Sprintf("annotation %q, want %q", got, psts)
	}
	for _, z := range zonesOf(p) {
		if !slices.Equal(z, zones) {
			return fmt.Sprintf("zone terms %q, want %q in each", zonesOf(p), zones)
		}
	}
	if len(zonesOf(p)) == 0 {
		return "no required zone affinity"
	}
	if req, lim := ipResource(p.Spec.Containers[0]); req != "1" || lim != "1" {
		return fmt.Sprintf("%s request %s limit %s, want 1 and 1", cce.ResourceIP, req, lim)
	}
	return ""
}

// A pod created through the API server comes out annotated with its PSTS,
// with the zone affinity (ANDed into its own terms) and the IP resource; a
// pod no PSTS selects comes out unchanged.
func TestWebhook_PodsGetTheirPSTS(t *testing.T) {
	e := newEnv(t)
	r := e.startReplica("r0", nil)
	e.register("https://" + r.addr)
	e.waitServing()
	if _, err := e.createPSTS(e.psts("web", map[string]string{"app": "web"},
		map[string]cce.SubnetAllocation{e.subnetA: {}, e.subnetB: {}}), false); err != nil {
		t.Fatal(err)
	}
	for id, zone := range map[string]string{e.subnetA: "cn-bj-a", e.subnetB: "cn-bj-b"} {
		sn, err := e.cce.CceV1alpha1().Subnets(cce.SubnetNamespace).Get(e.ctx, id, metav1.GetOptions{})
		if err != nil || !sn.Status.Enable || sn.Spec.Exclusive || sn.Spec.AvailabilityZone != zone {
			t.Fatalf("Subnet %s after an Elastic PSTS: %+v (%v); want it enabled, not exclusive, in %s", id, sn, err, zone)
		}
	}
	// CCE's node labels: cn-bj-a is zoneA.
	zones := []string{"zoneA", "zoneB"}
	eventually(t, e.ctx, "the webhook's caches know the PSTS and its subnets", func() error {
		p, err := e.createPod(e.pod("probe", map[string]string{"app": "web"}), true)
		if err != nil {
			return err
		}
		if d := mutated(p, "web", zones); d != "" {
			return fmt.Errorf("%s", d)
		}
		return nil
	})

	p, err := e.createPod(e.pod("web-1", map[string]string{"app": "web"}), false)
	if err != nil {
		t.Fatal(err)
	}
	if d := mutated(p, "web", zones); d != "" {
		t.Errorf("pod web-1: %s", d)
	}

	own := e.pod("web-2", map[string]string{"app": "web"})
	own.Annotations = map[string]string{cce.AnnotationPodSubnetTopologySpread: "web"}
	own.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "disk", Operator: corev1.NodeSelectorOpIn, Values: []string{"ssd"}}}},
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "gpu", Operator: corev1.NodeSelectorOpExists}}},
		}},
	}}
	p, err = e.createPod(own, false)
	if err != nil {
		t.Fatal(err)
	}
	terms := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if d := mutated(p, "web", zones); d != "" || len(terms) != 2 || terms[0].MatchExpressions[0].Key != "disk" ||
		terms[1].MatchExpressions[0].Key != "gpu" {
		t.Errorf("pod web-2 with its own terms: %s; terms %+v", d, terms)
	}

	plain := e.pod("db-1", map[string]string{"app": "db"})
	p, err = e.createPod(plain, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Annotations) != 0 || p.Spec.Affinity != nil || len(p.Spec.Containers[0].Resources.Requests) != 0 ||
		len(p.Spec.Containers[0].Resources.Limits) != 0 {
		t.Errorf("pod db-1 matches no PSTS, but changed: annotations %v affinity %+v resources %+v",
			p.Annotations, p.Spec.Affinity, p.Spec.Containers[0].Resources)
	}
}

// An invalid PSTS is refused through the API server with a message naming
// the subnet and the fault; a valid Fixed PSTS gets an exclusive Subnet; a
// dry run writes nothing; a cloud outage refuses with a retryable answer.
func TestWebhook_PSTSValidation(t *testing.T) {
	e := newEnv(t)
	r := e.startReplica("r0", nil)
	e.register("https://" + r.addr)
	e.waitServing()
	id := strings.TrimPrefix(e.appNS, "test")
	subnetENI := e.addSubnet("sbn-e"+id, "cn-bj-a", "10.62.0.0/24")
	subnetC := e.addSubnet("sbn-c"+id, "cn-bj-a", "10.63.0.0/24")
	pool := &cce.IPPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: cce.IPPoolNamespace, Name: "ippool-" + e.appNS},
		Spec:       cce.IPPoolSpec{ENI: cce.ENISpec{Subnets: []string{subnetENI}}},
	}
	if _, err := e.cce.CceV1alpha1().IPPools(cce.IPPoolNamespace).Create(e.ctx, pool, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.cce.CceV1alpha1().IPPools(cce.IPPoolNamespace).Delete(context.Background(), pool.Name, metav1.DeleteOptions{})
	})
	strategy := func(typ cce.IPAllocType, ips ...string) cce.SubnetAllocation {
		return cce.SubnetAllocation{IPAllocationStrategy: cce.IPAllocationStrategy{Type: typ}, IPv4: ips}
	}

	// A valid Fixed PSTS: its subnet gets an exclusive Subnet resource.
	if _, err := e.createPSTS(e.psts("fixed", map[string]string{"app": "db"},
		map[string]cce.SubnetAllocation{e.subnetA: strategy(cce.IPAllocTypeFixed, "10.60.0.10", "10.60.0.11")}), false); err != nil {
		t.Fatal(err)
	}
	sn, err := e.cce.CceV1alpha1().Subnets(cce.SubnetNamespace).Get(e.ctx, e.subnetA, metav1.GetOptions{})
	if err != nil || !sn.Spec.Exclusive || !sn.Status.Enable || sn.Spec.CIDR != "10.60.0.0/24" || sn.Status.AvailableIPNum <= 0 {
		t.Fatalf("Subnet %s after a Fixed PSTS: %+v %+v (%v); want it exclusive, enabled, from the cloud", e.subnetA, sn.Spec, sn.Status, err)
	}
	// The ENI subnet must be known to the webhook's IPPool cache.
	eventually(t, e.ctx, "the webhook sees the IPPool", func() error {
		_, err := e.createPSTS(e.psts("probe", nil, map[string]cce.SubnetAllocation{subnetENI: strategy(cce.IPAllocTypeManual)}), true)
		if err == nil {
			return fmt.Errorf("a Manual PSTS on an IPPool's ENI subnet was admitted")
		}
		return nil
	})

	for _, tc := range []struct {
		name    string
		subnets map[string]cce.SubnetAllocation
		want    []string
	}{
		{"no subnets", map[string]cce.SubnetAllocation{}, []string{"spec.subnets is empty"}},
		{"unknown type", map[string]cce.SubnetAllocation{e.subnetB: strategy("Sticky")},
			[]string{"subnet " + e.subnetB, `unknown strategy type "Sticky"`}},
		{"unknown release strategy", map[string]cce.SubnetAllocation{e.subnetB: {IPAllocationStrategy: cce.IPAllocationStrategy{
			Type: cce.IPAllocTypeFixed, ReleaseStrategy: "Sometimes"}}}, []string{"subnet " + e.subnetB, `unknown release strategy "Sometimes"`}},
		{"subnet the cloud does not know", map[string]cce.SubnetAllocation{"sbn-nope" + id: {}},
			[]string{"subnet sbn-nope" + id + " does not exist in the cloud"}},
		{"address outside the subnet", map[string]cce.SubnetAllocation{e.subnetB: strategy(cce.IPAllocTypeManual, "10.60.0.99")},
			[]string{"subnet " + e.subnetB + " (Manual strategy): addresses do not fit the subnet 10.61.0.0/24", "10.60.0.99 is not inside"}},
		{"overlapping ranges", map[string]cce.SubnetAllocation{e.subnetB: {IPAllocationStrategy: cce.IPAllocationStrategy{Type: cce.IPAllocTypeFixed},
			IPv4Range: []string{"10.61.0.0/28", "10.61.0.4/30"}}}, []string{"subnet " + e.subnetB, "overlap"}},
		{"malformed address", map[string]cce.SubnetAllocation{e.subnetB: strategy(cce.IPAllocTypeFixed, "10.61.0.256")},
			[]string{"subnet " + e.subnetB, `"10.61.0.256" is not an IPv4 address`}},
		{"Elastic on an exclusive subnet", map[string]cce.SubnetAllocation{e.subnetA: {}},
			[]string{"subnet " + e.subnetA + " (Elastic strategy): the subnet is exclusive"}},
		{"Fixed on an IPPool's ENI subnet", map[string]cce.SubnetAllocation{subnetENI: strategy(cce.IPAllocTypeFixed)},
			[]string{"subnet " + subnetENI + " (Fixed strategy): the subnet is an ENI subnet of IPPool default/" + pool.Name}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.createPSTS(e.psts("bad", map[string]string{"app": "x"}, tc.subnets), false)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "denied the request") {
				t.Fatalf("err %v, want the webhook's refusal (422)", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message %q lacks %q", err, w)
				}
			}
		})
	}

	custom := e.psts("custom", map[string]string{"app": "c"}, map[string]cce.SubnetAllocation{subnetC: strategy(cce.IPAllocTypeCustom)})
	if _, err := e.createPSTS(custom, true); err != nil {
		t.Fatalf("dry run of a valid PSTS: %v", err)
	}
	if _, err := e.cce.CceV1alpha1().Subnets(cce.SubnetNamespace).Get(e.ctx, subnetC, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a dry run created Subnet %s (%v)", subnetC, err)
	}

	// The cloud fails every DescribeSubnet: refused for now, not admitted.
	if err := e.sim.SetFaults(bcesim.Faults{ErrorRate: map[bcesim.Op]float64{bcesim.OpDescribeSubnet: 1}}); err != nil {
		t.Fatal(err)
	}
	_, err = e.createPSTS(custom, false)
	var status apierrors.APIStatus
	if err == nil || !strings.Contains(err.Error(), "try again") || !strings.Contains(err.Error(), subnetC) ||
		!asStatus(err, &status) || status.Status().Code != http.StatusServiceUnavailable {
		t.Fatalf("with the cloud down: %v, want a 503 naming %s and saying to try again", err, subnetC)
	}
	if err := e.sim.SetFaults(bcesim.Faults{}); err != nil {
		t.Fatal(err)
	}

	// An existing Subnet that nothing uses is marked exclusive for a Custom
	// PSTS: an Elastic PSTS made it, and is gone.
	if _, err := e.createPSTS(e.psts("elastic", map[string]string{"app": "e"}, map[string]cce.SubnetAllocation{subnetC: {}}), false); err != nil {
		t.Fatal(err)
	}
	if err := e.cce.CceV1alpha1().PodSubnetTopologySpreads(e.appNS).Delete(e.ctx, "elastic", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, e.ctx, "the Custom PSTS admitted once the Elastic one is gone", func() error {
		_, err := e.createPSTS(custom, false)
		return err
	})
	if sn, err := e.cce.CceV1alpha1().Subnets(cce.SubnetNamespace).Get(e.ctx, subnetC, metav1.GetOptions{}); err != nil || !sn.Spec.Exclusive {
		t.Fatalf("Subnet %s after the Custom PSTS: %+v (%v), want exclusive", subnetC, sn, err)
	}
}

func asStatus(err error, out *apierrors.APIStatus) bool {
	s, ok := err.(apierrors.APIStatus) //nolint:errorlint // client-go returns the status error itself
	*out = s
	return ok
}

// Two replicas started at once against no Secret: one creates it, both
// serve its certificate, and both keep the caBundle equal to its CAs (a
// caBundle reset, as a helm upgrade might do, is repaired).
func TestWebhook_ReplicasShareOneSecret(t *testing.T) {
	e := newEnv(t)
	r0, r1 := e.startReplica("r0", nil), e.startReplica("r1", nil)
	e.register("https://" + startBalancer(t, r0.addr, r1.addr))
	e.waitServing()
	s := e.secret()
	b, err := certs.Parse(s.Data)
	if err != nil || len(b.CAs) != 1 || b.Serving == nil {
		t.Fatalf("Secret: %d CAs, serving %v, %v", len(b.CAs), b.Serving != nil, err)
	}
	for _, r := range []*replica{r0, r1} {
		eventually(t, e.ctx, r.addr+" serves the Secret's certificate", func() error {
			c, err := servedCert(r.addr)
			if err != nil {
				return err
			}
			if !c.Equal(b.Serving.Cert) {
				return fmt.Errorf("serves %s, the Secret holds %s", c.SerialNumber, b.Serving.Cert.SerialNumber)
			}
			return nil
		})
	}
	if created := counter(t, "cce_ipam_webhook_secret_writes_total", "created", r0.reg, r1.reg); created != 1 {
		t.Fatalf("the Secret was created %v times, want once", created)
	}
	checkCABundles(t, e, s.Data[certs.KeyCACert])

	_, err = e.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Patch(e.ctx, e.configName, types.JSONPatchType,
		[]byte(`[{"op":"remove","path":"/webhooks/0/clientConfig/caBundle"}]`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, e.ctx, "the caBundle restored", func() error {
		c, err := e.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(e.ctx, e.configName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !bytes.Equal(c.Webhooks[0].ClientConfig.CABundle, s.Data[certs.KeyCACert]) {
			return fmt.Errorf("caBundle of %d bytes", len(c.Webhooks[0].ClientConfig.CABundle))
		}
		return nil
	})
}

func checkCABundles(t *testing.T, e *env, want []byte) {
	t.Helper()
	eventually(t, e.ctx, "both configurations carry the Secret's CAs", func() error {
		m, err := e.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(e.ctx, e.configName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		v, err := e.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(e.ctx, e.configName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !bytes.Equal(m.Webhooks[0].ClientConfig.CABundle, want) || !bytes.Equal(v.Webhooks[0].ClientConfig.CABundle, want) {
			return fmt.Errorf("caBundles differ from the Secret's ca.crt")
		}
		return nil
	})
}

// counter sums a counter with one label value over registries.
func counter(t *testing.T, name, label string, regs ...*prometheus.Registry) float64 {
	t.Helper()
	var sum float64
	for _, reg := range regs {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetValue() == label {
						sum += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	return sum
}

// With a 20s serving certificate and a 60s CA, two replicas renew the
// serving certificate and hand over to a new CA while pods and PSTS objects
// are admitted in a loop through the API server: not one admission fails
// (a failed pod call would leave the pod unannotated: the pod webhook fails
// open), and the served certificate really changes, CA included.
func TestWebhook_RotationWithoutFailedAdmissions(t *testing.T) {
	e := newEnv(t)
	short := func(c *webhook.Config) { c.ServingValidity, c.CAValidity = 20*time.Second, 60*time.Second }
	r0, r1 := e.startReplica("r0", short), e.startReplica("r1", short)
	e.register("https://" + startBalancer(t, r0.addr, r1.addr))
	e.waitServing()
	if _, err := e.createPSTS(e.psts("web", map[string]string{"app": "web"}, map[string]cce.SubnetAllocation{e.subnetA: {}}), false); err != nil {
		t.Fatal(err)
	}
	zones := []string{"zoneA"}
	eventually(t, e.ctx, "pods get the PSTS", func() error {
		p, err := e.createPod(e.pod("probe", map[string]string{"app": "web"}), true)
		if err != nil {
			return err
		}
		if d := mutated(p, "web", zones); d != "" {
			return fmt.Errorf("%s", d)
		}
		return nil
	})

	var (
		mu               sync.Mutex
		admitted, failed int
		failures         []string
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			real := i%10 == 0
			p, err := e.createPod(e.pod(fmt.Sprintf("web-%d", i), map[string]string{"app": "web"}), !real)
			var why string
			switch {
			case err != nil:
				why = err.Error()
			case mutated(p, "web", zones) != "":
				why = "pod " + p.Name + ": " + mutated(p, "web", zones)
			}
			if real && err == nil {
				_ = ignoreNotFound(e.kube.CoreV1().Pods(e.appNS).Delete(e.ctx, p.Name, metav1.DeleteOptions{}))
			}
			if why == "" && i%5 == 0 {
				if _, err := e.createPSTS(e.psts("probe", nil, nil), true); err == nil || !strings.Contains(err.Error(), "spec.subnets is empty") {
					why = fmt.Sprintf("PSTS dry run: %v", err)
				}
			}
			mu.Lock()
			admitted++
			if why != "" {
				failed++
				failures = append(failures, why)
			}
			mu.Unlock()
		}
	})

	// Watch what the replicas serve until a second CA signs and the serving
	// certificate was renewed under it.
	serials := map[string]bool{}
	issuers := map[string]int{} // issuer key ID → served certificates it signed
	var first string            // the first CA's key ID
	eventually(t, e.ctx, "a CA hand-over and a renewal under the new CA", func() error {
		for _, r := range []*replica{r0, r1} {
			c, err := servedCert(r.addr)
			if err != nil {
				return err
			}
			if first == "" {
				first = string(c.AuthorityKeyId)
			}
			if !serials[c.SerialNumber.String()] {
				serials[c.SerialNumber.String()] = true
				issuers[string(c.AuthorityKeyId)]++
			}
		}
		for id, n := range issuers {
			if id != first && n >= 2 {
				return nil
			}
		}
		return fmt.Errorf("%d serving certificates from %d CAs served so far", len(serials), len(issuers))
	})
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d admissions in the loop, %d serving certificates from %d CAs", admitted, len(serials), len(issuers))
	if failed > 0 {
		t.Fatalf("%d of %d admissions failed, first: %s", failed, admitted, failures[0])
	}
	if admitted < 100 {
		t.Fatalf("only %d admissions in the loop", admitted)
	}
	s := e.secret()
	b, err := certs.Parse(s.Data)
	if err != nil || len(b.CAs) > 2 {
		t.Fatalf("Secret after the rotations: %d CAs, %v", len(b.CAs), err)
	}
	checkCABundles(t, e, s.Data[certs.KeyCACert])
	if n := counter(t, "cce_ipam_webhook_secret_writes_total", "rotated", r0.reg, r1.reg); n < 3 {
		t.Fatalf("%v renewals written, want at least 3", n)
	}
}

// With the webhook down, pods are still created (failurePolicy Ignore,
// unannotated: the allocator matches them at ADD) and PSTS objects are
// refused (Fail).
func TestWebhook_DownFailsOpenForPodsAndClosedForPSTS(t *testing.T) {
	e := newEnv(t)
	r := e.startReplica("r0", nil)
	e.register("https://" + r.addr)
	e.waitServing()
	web := e.psts("web", map[string]string{"app": "web"}, map[string]cce.SubnetAllocation{e.subnetA: {}})
	if _, err := e.createPSTS(web, false); err != nil {
		t.Fatal(err)
	}
	eventually(t, e.ctx, "pods get the PSTS", func() error {
		p, err := e.createPod(e.pod("probe", map[string]string{"app": "web"}), true)
		if err != nil {
			return err
		}
		if d := mutated(p, "web", []string{"zoneA"}); d != "" {
			return fmt.Errorf("%s", d)
		}
		return nil
	})
	if err := r.stop(); err != nil {
		t.Fatalf("Run after a graceful stop: %v", err)
	}
	p, err := e.createPod(e.pod("web-down", map[string]string{"app": "web"}), false)
	if err != nil {
		t.Fatalf("pod creation with the webhook down: %v", err)
	}
	if _, ok := p.Annotations[cce.AnnotationPodSubnetTopologySpread]; ok {
		t.Fatalf("pod annotated with the webhook down: %v", p.Annotations)
	}
	web.Name = "web-2"
	if _, err := e.createPSTS(web, false); err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
		t.Fatalf("PSTS creation with the webhook down: %v, want refused", err)
	}
}

// In cert-manager mode a replica serves the Secret cert-manager writes (and
// its renewals) and writes nothing: neither the Secret nor the caBundles.
func TestWebhook_CertManagerModeOnlyServes(t *testing.T) {
	e := newEnv(t)
	e.register("https://127.0.0.1:1") // the caBundle must stay as cainjector leaves it: empty here
	issue := func() *certs.Bundle {
		now := time.Now()
		p := certs.Policy{CAValidity: time.Hour, ServingValidity: time.Hour, DNSNames: []string{"x.svc"}}
		b, err := certs.Apply(&certs.Bundle{}, certs.Plan(&certs.Bundle{}, now, p, func(*x509.Certificate) bool { return true }), now, p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cm := func(b *certs.Bundle) map[string][]byte { // cert-manager's keys: no ca.key
		d := b.Data()
		return map[string][]byte{"ca.crt": d["ca.crt"], "tls.crt": d["tls.crt"], "tls.key": d["tls.key"]}
	}
	first := issue()
	s, err := e.kube.CoreV1().Secrets(e.replicaNS).Create(e.ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "cce-ipam-webhook-certs"}, Type: corev1.SecretTypeTLS, Data: cm(first),
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := e.startReplica("r0", func(c *webhook.Config) { c.CertManager = true })
	serves := func(want *certs.Bundle) {
		eventually(t, e.ctx, "the replica serves cert-manager's certificate", func() error {
			c, err := servedCert(r.addr)
			if err != nil {
				return err
			}
			if !c.Equal(want.Serving.Cert) {
				return fmt.Errorf("serves %s", c.SerialNumber)
			}
			return nil
		})
	}
	serves(first)
	renewed := issue()
	s.Data = cm(renewed)
	if s, err = e.kube.CoreV1().Secrets(e.replicaNS).Update(e.ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	serves(renewed)
	if got := e.secret(); got.ResourceVersion != s.ResourceVersion {
		t.Fatalf("the replica wrote cert-manager's Secret")
	}
	m, err := e.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(e.ctx, e.configName, metav1.GetOptions{})
	if err != nil || len(m.Webhooks[0].ClientConfig.CABundle) != 0 {
		t.Fatalf("the replica patched the caBundle in cert-manager mode (%v)", err)
	}
}
