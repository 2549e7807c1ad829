package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// reqRow is one kind of CNI call of item 8a: the API requests per call,
// by verb and resource, with the background taken out.
type reqRow struct {
	kind    string
	calls   int
	perCall reqCounts
	// floor is the target in requests per call (NaN: reported
	// only), floorText says what it is made of.
	floor     float64
	floorText string
}

// requestsResult is item 8a.
type requestsResult struct {
	rows []reqRow
	// background is what the API server served per second with no CNI
	// call running (Leases, the replica's informers), subtracted from
	// every row.
	background reqCounts
	replicas   int
}

// cniResources are the resources a CNI call may touch; a row's totals are
// counted over them only, so a Lease renewal the background subtraction
// missed by a fraction does not show as a request per call.
var cniResources = map[string]bool{"workloadendpoints": true, "pods": true, "ipclaims": true, "ippools": true,
	"nodes": true, "statefulsets": true, "podsubnettopologyspreads": true, "subnets": true, "events": true}

// perCallTotal sums a row's requests per call over cniResources (writes,
// reads or both).
func (r reqRow) total(writes, reads bool) float64 {
	return r.perCall.total(func(k reqKey) bool {
		return cniResources[baseResource(k.resource)] && ((writes && k.isWrite()) || (reads && !k.isWrite()))
	})
}

func baseResource(res string) string {
	for i := range len(res) {
		if res[i] == '/' {
			return res[:i]
		}
	}
	return res
}

// fixedSTSName is the StatefulSet of item 8a's fixed-IP pods.
const fixedSTSName = "apicost-sts"

// runRequests is item 8a on one replica: counts of apiserver_request_total
// around n warm ADDs, n re-ADDs (the same sandboxes again), n CheckIPs, n
// DELs, then the first ADD and the DEL of fixed-IP StatefulSet pods. The
// pods exist (and are in the replica's pod watch) before the first count.
func (e *env) runRequests(ctx context.Context, nodes []string, pods []pod) (*requestsResult, error) {
	target := e.firstTarget()
	fixed, cleanup, err := e.createFixedPods(ctx, nodes, len(pods)/3)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	sleep(ctx, 3*time.Second) // the replica's pod watch sees the new pods

	res := &requestsResult{replicas: len(e.running())}
	// Background: the same window length with no call.
	c0, err := e.scrapeAPIServer(ctx)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	sleep(ctx, 10*time.Second)
	c1, err := e.scrapeAPIServer(ctx)
	if err != nil {
		return nil, err
	}
	res.background = c1.minus(c0).scaled(1 / time.Since(t0).Seconds())

	measure := func(kind string, floor float64, floorText string, ps []pod, call callFunc) error {
		return e.countRequests(ctx, res, reqRow{kind: kind, calls: len(ps), floor: floor, floorText: floorText}, call)
	}
	cids := make([]string, len(pods))
	ips := make([]string, len(pods))
	add := func(ps []pod, cids, ips []string) callFunc {
		return func(ctx context.Context, i int) (time.Duration, error) {
			if cids[i] == "" {
				cids[i] = e.drv.containerID()
			}
			ip, d, err := e.drv.allocate(ctx, target(), ps[i], cids[i], 30*time.Second)
			if err == nil && ips[i] != "" && ip != ips[i] {
				err = fmt.Errorf("re-ADD of %s gave %s, the first ADD %s", ps[i].name, ip, ips[i])
			}
			ips[i] = ip
			return d, err
		}
	}
	del := func(ps []pod, cids, ips []string) callFunc {
		return func(ctx context.Context, i int) (time.Duration, error) {
			return e.drv.releaseOnce(ctx, target(), ps[i], cids[i], ips[i])
		}
	}
	steps := []struct {
		kind, floorText string
		floor           float64
		ps              []pod
		call            callFunc
	}{
		{"warm ADD", "1: the wep create", 1, pods, add(pods, cids, ips)},
		{"re-ADD (same sandbox)", "0 where safe", 0, pods, add(pods, cids, ips)},
		{"CheckIP", "0 where safe", 0, pods, func(ctx context.Context, i int) (time.Duration, error) {
			ip, d, err := e.drv.checkOnce(ctx, target(), pods[i], cids[i])
			if err == nil && ip != ips[i] {
				err = fmt.Errorf("CheckIP of %s gave %q, the ADD %s", pods[i].name, ip, ips[i])
			}
			return d, err
		}},
		{"DEL", "2 writes: the finalizer's update and the delete", 2, pods, del(pods, cids, ips)},
	}
	for _, s := range steps {
		if err := measure(s.kind, s.floor, s.floorText, s.ps, s.call); err != nil {
			return res, err
		}
	}
	fcids, fips := make([]string, len(fixed)), make([]string, len(fixed))
	if err := measure("fixed-IP ADD (first)", math.NaN(), "reported (REQUESTS.md: the reservation's get stays, and the create)",
		fixed, add(fixed, fcids, fips)); err != nil {
		return res, err
	}
	if err := measure("fixed-IP DEL (the IP stays reserved)", math.NaN(), "reported", fixed, del(fixed, fcids, fips)); err != nil {
		return res, err
	}
	return res, nil
}

// callFunc is one timed call of a phase.
type callFunc = func(ctx context.Context, i int) (time.Duration, error)

// countRequests runs row.calls calls and adds row to res with the API
// requests per call: apiserver_request_total's counts before and after,
// less the background over the phase's length.
func (e *env) countRequests(ctx context.Context, res *requestsResult, row reqRow, call callFunc) error {
	before, err := e.scrapeAPIServer(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	if _, err := timedPhase(ctx, row.calls, e.cfg.Profile.Conc, call); err != nil {
		return fmt.Errorf("%s: %w", row.kind, err)
	}
	// A DEL is answered before its finalizer's patch: count those too.
	if _, err := e.finishesDone(ctx, quietPoll); err != nil {
		return fmt.Errorf("%s: %w", row.kind, err)
	}
	after, err := e.scrapeAPIServer(ctx)
	if err != nil {
		return err
	}
	took := time.Since(start).Seconds()
	row.perCall = after.minus(before).minus(res.background.scaled(took)).scaled(1 / float64(row.calls))
	res.rows = append(res.rows, row)
	e.log.Info("apicost requests", "kind", row.kind, "calls", row.calls, "per_call", reqLine(row.perCall, 0.05))
	return nil
}

// createFixedPods creates a StatefulSet (no controller runs it: it is the
// pods' owner, which makes them fixed-IP pods) and n pods of it, bound
// round-robin to nodes. cleanup deletes the pods and the StatefulSet (the
// fixed IPs are then the GC's).
func (e *env) createFixedPods(ctx context.Context, nodes []string, n int) ([]pod, func(), error) {
	n = max(n, 1)
	replicas := int32(n)
	sts, err := e.kube.AppsV1().StatefulSets(podNamespace).Create(ctx, &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: fixedSTSName},
		Spec: appsv1.StatefulSetSpec{Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fixedSTSName}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": fixedSTSName}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		sts, err = e.kube.AppsV1().StatefulSets(podNamespace).Get(ctx, fixedSTSName, metav1.GetOptions{})
	}
	if err != nil {
		return nil, nil, fmt.Errorf("create StatefulSet: %w", err)
	}
	pods := make([]pod, n)
	yes := true
	err = parallel(ctx, n, 16, func(ctx context.Context, i int) error {
		pods[i] = pod{name: fmt.Sprintf("%s-%d", fixedSTSName, i), node: nodes[i%len(nodes)]}
		_, err := e.kube.CoreV1().Pods(podNamespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: pods[i].name, Labels: map[string]string{"app": fixedSTSName},
				Annotations: map[string]string{cce.AnnotationStsEnableFixIP: cce.EnableFixIPTrue},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name,
					UID: sts.UID, Controller: &yes}}},
			Spec: corev1.PodSpec{NodeName: pods[i].node, TerminationGracePeriodSeconds: new(int64),
				Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
	cleanup := func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = errors.Join(e.drv.deletePods(cctx, pods, 16),
			e.kube.AppsV1().StatefulSets(podNamespace).Delete(cctx, fixedSTSName, metav1.DeleteOptions{}))
	}
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("create fixed-IP pods: %w", err)
	}
	return pods, cleanup, nil
}
