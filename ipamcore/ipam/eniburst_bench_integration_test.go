//go:build integration

package ipam_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/pool"
)

// BenchmarkENIBurst measures, in one run, a burst of 30 pods on a node whose
// pool and ENI are full (16 addresses per ENI: 13 pods and 2 idle on the one
// ENI), with bce-sim attaching in 5 s (BCE takes seconds), three ways:
//
//   - off: no ahead-of-demand annotations: every new ENI is created when the
//     pool runs dry, so the burst pays two attaches;
//   - warm: cce.io/warm-ip-target=8 (the node agent's default for 16 per ENI):
//     the ENI sync before the burst created one ENI (spare 2 < 8), so the
//     burst pays one attach;
//   - pre: cce.io/pre-attached-eni-num=3: both ENIs the burst needs exist.
//
// It reports each burst's time until all 30 pods have an IP and the ratios
// to off (lower is better). One measurement per invocation: run it with
// -benchtime=1x. The periodic ENI sync (20 s) is left at its default; the
// test runs the syncs before the bursts itself, as the period would have.
func BenchmarkENIBurst(b *testing.B) {
	const burst = 30
	e := newEnvIn(b, "burst", 3, testConfig(func(c *ipam.Config) {
		c.IdleMin, c.IdleMax = 2, 6
		c.PoolCheckPeriod = time.Second
		c.Cooldown = time.Millisecond
	}), world{annotateMaxIPs: true, ipPool: true, memoryGB: 16})
	if err := e.sim.SetAttachDelay(5 * time.Second); err != nil {
		b.Fatal(err)
	}
	off, warm, pre := e.nodes[0], e.nodes[1], e.nodes[2]
	e.markNode(off, nil, nil, true)
	e.markNode(warm, map[string]string{pool.AnnotationPreAttachedENINum: "1", pool.AnnotationWarmIPTarget: "8"}, nil, true)
	e.markNode(pre, map[string]string{pool.AnnotationPreAttachedENINum: "3"}, nil, true)

	// Fill each node's ENI: 13 pods, 2 idle, no room (15 for pods).
	for _, n := range e.nodes {
		e.allocateAll(e.createPodsOn("fill", n, 13), 4)
		eventually(b, 30*time.Second, "full ENI on "+n, func() bool {
			st := e.stats(n)
			return st.Total == 15 && st.Idle == 2
		})
	}
	// The ENI syncs before the burst (pre needs two: one creation each).
	e.sync()
	e.sync()
	if got := [3]int{e.inUseENIs(off), e.inUseENIs(warm), e.inUseENIs(pre)}; got != [3]int{1, 2, 3} {
		b.Fatalf("ENIs before the burst (off, warm, pre) = %v, want [1 2 3]", got)
	}

	b.ResetTimer()
	took := map[string]time.Duration{}
	for _, n := range []string{off, warm, pre} {
		pods := e.createPodsOn("burst", n, burst)
		start := time.Now()
		e.burstAllocate(pods)
		took[n] = time.Since(start)
	}
	b.StopTimer()
	b.ReportMetric(took[off].Seconds(), "off-s")
	b.ReportMetric(took[warm].Seconds(), "warm-s")
	b.ReportMetric(took[pre].Seconds(), "pre-s")
	b.ReportMetric(took[warm].Seconds()/took[off].Seconds(), "warm/off")
	b.ReportMetric(took[pre].Seconds()/took[off].Seconds(), "pre/off")
	b.Logf("burst of %d, attach 5s: off %s (ENIs after: %d), warm %s (%d), pre %s (%d)", burst,
		took[off].Round(time.Millisecond), e.inUseENIs(off), took[warm].Round(time.Millisecond), e.inUseENIs(warm),
		took[pre].Round(time.Millisecond), e.inUseENIs(pre))
	e.checkNoLeak()
}

// burstAllocate allocates every pod at once, as kubelets' sandboxes would
// ask, retrying an answer to try again (the CNI server takes 20 calls at a
// time; a pod waiting for an ENI may outlast the allocate wait) until each
// has an IP.
func (e *env) burstAllocate(pods []podRef) {
	e.t.Helper()
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for try := 0; ; try++ {
				_, err := e.allocateTries(p, 0)
				if err == nil {
					return
				}
				if try == 2000 {
					e.t.Errorf("allocate %s: %v", p.name, err)
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	if e.t.Failed() {
		e.t.FailNow()
	}
}

// createPodsOn creates count bound pods on one node.
func (e *env) createPodsOn(prefix, node string, count int) []podRef {
	e.t.Helper()
	all := e.nodes
	e.nodes = []string{node}
	defer func() { e.nodes = all }()
	pods := e.createPods(fmt.Sprintf("%s-%s", prefix, node), count)
	for k := range pods {
		// createPods numbers container IDs from 1 per call: keep them unique.
		pods[k].containerID = fmt.Sprintf("%s%058x", "c0ffee", time.Now().UnixNano()+int64(k))
	}
	return pods
}
