// Command demo is `make demo`: the whole system on one machine, with real
// parts, as separate processes (package e2e/fleet): a control plane (etcd,
// kube-apiserver, kube-controller-manager), bce-sim, three cce-ipam
// replicas that shard the nodes between them, and the kubelet simulator
// spreading the CNI calls over every replica.
//
// It first shows the basics: a Deployment and a fixed-IP StatefulSet get
// unique IPs, a StatefulSet pod keeps its IP across a restart, a scale-down
// releases IPs, the invariant checker agrees. Then, until Ctrl-C, it churns
// the Deployment and shows live which replica owns how many nodes,
// allocations per second, CNI latency, and BCE calls per second against
// the budget. Ctrl-C stops every process it started.
//
//	go run ./e2e/demo --bin-dir bin [--replicas 3 --nodes 50 --pods 200 --duration 0]
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/invariants"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
)

const ns = "demo"

type options struct {
	binDir   string
	replicas int
	nodes    int
	pods     int
	// live shows the live view with churn after the checks, until ctx ends
	// or duration passes (0: until Ctrl-C).
	live     bool
	duration time.Duration
	// timeout bounds the start and the checks (not the live view).
	timeout time.Duration
	// removeDir deletes the working directory (data and logs) at the end;
	// the command keeps it so that the logs can be read.
	removeDir bool
}

func main() {
	var o options
	var keep bool
	flag.StringVar(&o.binDir, "bin-dir", "bin", "directory with etcd, kube-apiserver, kube-controller-manager, bce-sim and cce-ipam")
	flag.IntVar(&o.replicas, "replicas", 3, "cce-ipam replicas")
	flag.IntVar(&o.nodes, "nodes", 50, "simulated BCC nodes")
	flag.IntVar(&o.pods, "pods", 200, "most replicas of the demo Deployment (the churn scales it between half and all of them)")
	flag.BoolVar(&o.live, "live", true, "after the checks, churn pods and show the live view until Ctrl-C")
	flag.BoolVar(&keep, "keep", false, "same as --live (kept for old scripts)")
	flag.DurationVar(&o.duration, "duration", 0, "stop the live view after this long (0: until Ctrl-C)")
	flag.DurationVar(&o.timeout, "timeout", 10*time.Minute, "give up if start-up and checks take longer")
	flag.Parse()
	o.live = o.live || keep
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	binDir, err := filepath.Abs(o.binDir)
	if err != nil {
		return err
	}
	o.replicas = max(o.replicas, 1)
	setupCtx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	start := time.Now()
	step := func(format string, args ...any) {
		fmt.Printf("[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}

	dir, err := os.MkdirTemp("", "cce-ipam-demo-")
	if err != nil {
		return err
	}
	if o.removeDir {
		defer os.RemoveAll(dir)
	}
	step("starting etcd, kube-apiserver, kube-controller-manager (built by make tools), bce-sim, "+
		"%d cce-ipam replicas, and %d simulated BCC nodes", o.replicas, o.nodes)
	f, err := fleet.New(setupCtx, fleet.Options{BinDir: binDir, Dir: dir, KeepDir: true, Name: "demo",
		Replicas: o.replicas, Nodes: o.nodes, AttachDelay: 500 * time.Millisecond})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Println("stopping every process ...")
		if err := f.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "stop:", err)
		}
		fmt.Printf("stopped; logs in %s\n", dir)
	}()
	step("control plane: export KUBECONFIG=%s", f.Kubeconfig)
	step("bce-sim: %s (admin API under /admin/)", f.SimURL())
	for _, r := range f.Live() {
		step("replica %d: CNI gRPC %s, Prometheus metrics %s, log %s", r.Index(), r.GRPCAddr(), r.MetricsURL(), r.LogPath())
	}
	if err := checks(setupCtx, f, o, step); err != nil {
		return err
	}
	fmt.Printf("\ndemo checks passed in %.1fs; logs in %s\n", time.Since(start).Seconds(), dir)
	if !o.live {
		return nil
	}
	liveCtx := ctx
	if o.duration > 0 {
		var c context.CancelFunc
		liveCtx, c = context.WithTimeout(ctx, o.duration)
		defer c()
	}
	return live(liveCtx, f, o)
}

func checks(ctx context.Context, f *fleet.Fleet, o options, step func(string, ...any)) error {
	kube, cs := f.Kube, f.CCE
	namespace := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, namespace, metav1.CreateOptions{}); err != nil {
		return err
	}
	first := max(o.pods/2, 1)
	step("creating Deployment web (%d replicas) and fixed-IP StatefulSet db (3 replicas)", first)
	if err := createWorkloads(ctx, kube, first); err != nil {
		return err
	}
	t0 := time.Now()
	pods, err := waitRunning(ctx, kube, first+3)
	if err != nil {
		return err
	}
	step("all %d pods Running with an IP in %.1fs", len(pods), time.Since(t0).Seconds())
	ips := map[string]string{}
	perNode := map[string]int{}
	for _, p := range pods {
		if other, dup := ips[p.Status.PodIP]; dup {
			return fmt.Errorf("DUPLICATE IP %s: %s and %s", p.Status.PodIP, other, p.Name)
		}
		ips[p.Status.PodIP] = p.Name
		perNode[p.Spec.NodeName]++
	}
	step("%d unique IPs; pods per node: %s", len(ips), summarize(perNode))

	dbIP := podIP(pods, "db-1")
	step("deleting db-1 (fixed IP %s); the StatefulSet controller recreates it", dbIP)
	if err := kube.CoreV1().Pods(ns).Delete(ctx, "db-1", metav1.DeleteOptions{}); err != nil {
		return err
	}
	if err := waitRecreated(ctx, kube, "db-1", podUID(pods, "db-1"), dbIP); err != nil {
		return err
	}
	step("db-1 is Running again with the same IP %s", dbIP)

	scaled := max(first/5, 1)
	step("scaling web to %d; released IPs return to the pools", scaled)
	if err := scaleWeb(ctx, kube, scaled); err != nil {
		return err
	}
	if _, err := waitRunning(ctx, kube, scaled+3); err != nil {
		return err
	}
	t1 := time.Now()
	if err := waitWEPs(ctx, cs, scaled+3); err != nil {
		return err
	}
	step("the %d removed pods' IPs were released (CNI DEL) in %.1fs", first-scaled, time.Since(t1).Seconds())

	checker, err := f.Checker(invariants.Config{
		Namespaces:  []string{ns},
		OrphanGrace: 10 * time.Second,
	})
	if err != nil {
		return err
	}
	step("checking invariants: unique IPs, pod IP = wep IP = an IP on the node's ENI, no orphan weps")
	waitCtx, waitCancel := context.WithTimeout(ctx, time.Minute)
	defer waitCancel()
	vs, err := checker.WaitClean(waitCtx, time.Second)
	if err != nil {
		return fmt.Errorf("invariants: %v: %w", vs, err)
	}
	if len(vs) > 0 {
		return fmt.Errorf("invariants: %v", vs)
	}
	weps, err := cs.CceV1alpha1().WorkloadEndpoints(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	fixed := 0
	for _, w := range weps.Items {
		if w.IsFixedStatefulSet() {
			fixed++
		}
	}
	step("invariants hold; %d WorkloadEndpoints (%d fixed-IP)", len(weps.Items), fixed)
	return nil
}

func scaleWeb(ctx context.Context, kube kubernetes.Interface, n int) error {
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)
	_, err := kube.AppsV1().Deployments(ns).Patch(ctx, "web", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// replicaSample is one replica's counters at one scrape.
type replicaSample struct {
	ok            bool
	owned, member float64
	allocs, fwd   float64
}

// live churns the Deployment and redraws the view every second until ctx
// ends.
func live(ctx context.Context, f *fleet.Fleet, o options) error {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	opts := f.Options()
	v := &liveView{
		f:       f,
		budget:  fmt.Sprintf("budget %.0f/s + burst %d", opts.BCERate, opts.BCEBurst),
		prev:    map[int]replicaSample{},
		prevAt:  time.Now(),
		started: time.Now(),
	}
	target := max(o.pods/2, 1)
	lastScale := time.Time{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Println()
			return nil
		case <-tick.C:
		}
		if time.Since(lastScale) > 5*time.Second {
			target = o.pods/2 + rng.IntN(o.pods/2+1)
			_ = scaleWeb(ctx, f.Kube, target)
			lastScale = time.Now()
		}
		deleteSome(ctx, f.Kube, rng, max(target/50, 1)) // the Deployment replaces them: steady churn
		frame := v.frame(ctx, target)
		if ctx.Err() != nil {
			continue // stopping: the scrapes were cut short
		}
		fmt.Print(frame)
	}
}

// liveView draws the demo's screen; it keeps the previous scrape of each
// replica for the rates.
type liveView struct {
	f           *fleet.Fleet
	budget      string
	prev        map[int]replicaSample
	prevBuckets map[float64]float64
	prevAt      time.Time
	started     time.Time
}

// frame scrapes everything once and returns the screen.
func (v *liveView) frame(ctx context.Context, target int) string {
	f := v.f
	now := time.Now()
	dt := now.Sub(v.prevAt).Seconds()
	v.prevAt = now

	var b strings.Builder
	b.WriteString("\033[H\033[2J")
	fmt.Fprintf(&b, "cce-ipam demo: %d replicas, %d nodes, up %s   (Ctrl-C stops everything)\n\n",
		len(f.Live()), len(f.Nodes()), time.Since(v.started).Round(time.Second))
	allocRate, buckets := v.replicaTable(ctx, &b, dt)
	p50, p99 := math.NaN(), math.NaN()
	if v.prevBuckets != nil {
		delta := map[float64]float64{}
		for le, x := range buckets {
			delta[le] = x - v.prevBuckets[le]
		}
		p50, p99 = fleet.HistogramQuantile(0.5, delta), fleet.HistogramQuantile(0.99, delta)
	}
	v.prevBuckets = buckets
	fmt.Fprintf(&b, "\nallocations: %.1f/s   CNI AllocateIP latency (last second, all replicas): p50 %s  p99 %s\n",
		allocRate, ms(p50), ms(p99))
	if st, err := f.SimStats(ctx); err == nil {
		var last int64
		for _, s := range st.All.PerSecond {
			if s.Unix == now.Unix()-1 {
				last = s.Calls
			}
		}
		fmt.Fprintf(&b, "BCE calls at bce-sim: %d/s (%s), busiest second %d, throttled (429) %d of %d\n",
			last, v.budget, st.All.MaxPerSecond(), st.All.Throttled, st.All.Calls)
	}
	if pods, err := f.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err == nil {
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				running++
			}
		}
		fmt.Fprintf(&b, "pods: %d Running of %d (web scaled to %d every 5s, %d deleted per second; db 3 fixed-IP)\n",
			running, len(pods.Items), target, max(target/50, 1))
	}
	if k := f.Kubelet(); k != nil {
		ks := k.Stats()
		fmt.Fprintf(&b, "kubelet-sim: %d allocations, %d failed and retried, %d releases; since start p50 %s p99 %s\n",
			ks.Allocations, ks.AllocationErrors, ks.Releases, ks.AllocateLatency.P50.Round(time.Microsecond*100),
			ks.AllocateLatency.P99.Round(time.Microsecond*100))
	}
	fmt.Fprintf(&b, "\nkubeconfig: %s   logs: %s\n", f.Kubeconfig, f.Dir)
	return b.String()
}

// replicaTable writes one line per live replica (rates over the dt seconds
// since the previous frame) and returns the summed allocation rate and the
// summed AllocateIP latency buckets.
func (v *liveView) replicaTable(ctx context.Context, b *strings.Builder, dt float64) (float64, map[float64]float64) {
	fmt.Fprintf(b, "%-8s %-8s %-6s %6s %8s %9s %9s  %s\n", "replica", "pid", "state", "nodes", "members", "allocs/s", "fwd/s", "metrics")
	buckets := map[float64]float64{}
	var allocRate float64
	for _, r := range v.f.Live() {
		cur := replicaSample{}
		ss, err := r.Metrics(ctx)
		state := "down"
		if err == nil {
			state = "ready"
			if !r.Ready() {
				state = "busy"
			}
			cur.ok = true
			cur.owned, _ = ss.Sum("cce_ipam_shard_owned_nodes", nil)
			cur.member, _ = ss.Sum("cce_ipam_shard_members", nil)
			cur.allocs, _ = ss.Sum("cce_ipam_allocations_total", map[string]string{"result": "ok"})
			cur.fwd, _ = ss.Sum("cce_ipam_shard_forwarded_requests_total", nil)
			entry := map[string]string{"method": "AllocateIP", "hop": "entry"} // as the CNI plugin waited
			for le, x := range ss.Buckets("cce_ipam_cni_request_duration_seconds", entry) {
				buckets[le] += x
			}
		}
		p := v.prev[r.Index()]
		rate := func(c, q float64) float64 {
			if !p.ok || !cur.ok || dt <= 0 || c < q {
				return 0
			}
			return (c - q) / dt
		}
		ar := rate(cur.allocs, p.allocs)
		allocRate += ar
		fmt.Fprintf(b, "r%-7d %-8d %-6s %6.0f %8.0f %9.1f %9.1f  %s\n", r.Index(), r.PID(), state, cur.owned, cur.member,
			ar, rate(cur.fwd, p.fwd), r.MetricsURL())
		v.prev[r.Index()] = cur
	}
	return allocRate, buckets
}

// deleteSome deletes n random Running web pods.
func deleteSome(ctx context.Context, kube kubernetes.Interface, rng *rand.Rand, n int) {
	pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		return
	}
	var running []string
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			running = append(running, p.Name)
		}
	}
	for range min(n, len(running)) {
		k := rng.IntN(len(running))
		_ = kube.CoreV1().Pods(ns).Delete(ctx, running[k], metav1.DeleteOptions{})
		running = append(running[:k], running[k+1:]...)
	}
}

func ms(sec float64) string {
	if math.IsNaN(sec) {
		return "-"
	}
	return fmt.Sprintf("%.1fms", sec*1000)
}

func createWorkloads(ctx context.Context, kube kubernetes.Interface, replicas int) error {
	pause := corev1.PodSpec{
		Containers: []corev1.Container{{
			Name:  "app",
			Image: "registry.k8s.io/pause:3.10",
		}},
		TerminationGracePeriodSeconds: ptr.To[int64](0),
	}
	web := map[string]string{"app": "web"}
	_, err := kube.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(replicas)), Selector: &metav1.LabelSelector{MatchLabels: web},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: web},
				Spec:       pause,
			}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	db := map[string]string{"app": "db"}
	_, err = kube.AppsV1().StatefulSets(ns).Create(ctx, &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](3), Selector: &metav1.LabelSelector{MatchLabels: db},
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: db,
				Annotations: map[string]string{cce.AnnotationStsEnableFixIP: cce.EnableFixIPTrue}}, Spec: pause}},
	}, metav1.CreateOptions{})
	return err
}

// waitRunning waits until exactly n pods of the namespace are Running with
// an IP and none is terminating.
func waitRunning(ctx context.Context, kube kubernetes.Interface, n int) ([]corev1.Pod, error) {
	for {
		list, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			var running []corev1.Pod
			settled := len(list.Items) == n
			for _, p := range list.Items {
				if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && p.DeletionTimestamp == nil {
					running = append(running, p)
				}
			}
			if settled && len(running) == n {
				return running, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %d Running pods: %w", n, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// waitWEPs waits until the namespace holds exactly n WorkloadEndpoints.
func waitWEPs(ctx context.Context, cs cceclient.Interface, n int) error {
	for {
		list, err := cs.CceV1alpha1().WorkloadEndpoints(ns).List(ctx, metav1.ListOptions{})
		if err == nil && len(list.Items) == n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d WorkloadEndpoints: %w", n, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func waitRecreated(ctx context.Context, kube kubernetes.Interface, name string, oldUID types.UID, wantIP string) error {
	for {
		p, err := kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && p.UID != oldUID && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			if p.Status.PodIP != wantIP {
				return fmt.Errorf("%s came back with %s, want its fixed IP %s", name, p.Status.PodIP, wantIP)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s to come back: %w", name, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func podUID(pods []corev1.Pod, name string) types.UID {
	for _, p := range pods {
		if p.Name == name {
			return p.UID
		}
	}
	return ""
}

func podIP(pods []corev1.Pod, name string) string {
	for _, p := range pods {
		if p.Name == name {
			return p.Status.PodIP
		}
	}
	return ""
}

func summarize(perNode map[string]int) string {
	counts := make([]int, 0, len(perNode))
	for _, c := range perNode {
		counts = append(counts, c)
	}
	sort.Ints(counts)
	if len(counts) == 0 {
		return "none"
	}
	return fmt.Sprintf("%d nodes, min %d, max %d", len(counts), counts[0], counts[len(counts)-1])
}
