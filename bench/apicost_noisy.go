package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// Item 8d: a noisy neighbour. API Priority and Fairness sorts requests by
// who makes them; the fleet's replicas run as a member of system:masters,
// which APF exempts, so for this part the replica runs as the chart's
// ServiceAccount (a token from the TokenRequest API), as it does in a
// cluster, and the neighbour as another ServiceAccount. Both are bound to
// cluster-admin: RBAC does not enter APF's matching. The wep fencing policy
// fences the fleet's user, not this one: in this part the replica's wep
// writes are not fenced.

// noisyWorkers is how many LISTs of every pod the neighbour keeps in flight.
const noisyWorkers = 32

// noisyResult is item 8d.
type noisyResult struct {
	identity string // the replica's user in this part
	workers  int
	pods     int // pods every LIST returns (at the start)
	// ADD phases: no neighbour, neighbour, and the same two with the
	// chart's flow-control objects applied.
	quiet, flood, quietFC, floodFC phase
	// the neighbour's LISTs per second, and answers 429, per flood
	lists, listsFC           float64
	rejected, rejectedFC     int64
	fcObjects                []string // kind/name of what the chart rendered and was applied
	fcMissing                string   // why the flow-control half was not measured
	addsPerCondition, waves  int
	floodErrs, floodErrsFC   int64
	lastFloodErr, lastErrsFC string
	// floodFailed and floodFailedFC say why a flood condition's ADDs did not
	// all succeed within noisyFloodLimit (the replica lost its partitions,
	// say): a result of the part, not an end of it.
	floodFailed, floodFailedFC string
}

// noisyFloodLimit bounds one flood condition's ADDs: a replica the flood
// starves may fail every call for as long as the flood lasts.
const noisyFloodLimit = 3 * time.Minute

// runNoisy is item 8d on one replica, restarted as the chart's
// ServiceAccount (and restarted back at the end).
func (e *env) runNoisy(ctx context.Context, nodes []string, phaseArgs []string) (_ *noisyResult, err error) {
	p := e.cfg.Profile
	res := &noisyResult{workers: noisyWorkers, waves: 3}
	restore, err := e.runAsChartServiceAccount(ctx, res, phaseArgs)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, restore()) }()
	noisy, err := e.saClient(ctx, "bench-noisy")
	if err != nil {
		return nil, err
	}
	if all, err := e.kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err == nil {
		res.pods = len(all.Items)
	}
	pods, err := e.drv.createPods(ctx, "nz", nodes, p.LatPerNode, 16)
	if err != nil {
		return nil, err
	}
	defer func() { _ = e.drv.deletePods(context.WithoutCancel(ctx), pods, 16) }()
	sleep(ctx, 3*time.Second)
	res.addsPerCondition = res.waves * len(pods)

	adds := func(ctx context.Context) (phase, error) {
		var all phase
		for range res.waves {
			add, _, err := e.addDelPhases(ctx, pods, p.Conc, e.firstTarget())
			if err != nil {
				return all, err
			}
			all.took, all.errors = append(all.took, add.took...), all.errors+add.errors
			sleep(ctx, 2*time.Second) // cooling (1s) + pool check
		}
		return all, nil
	}
	withFlood := func() (ph phase, listsPerSec float64, rejected, errs int64, last string, err error) {
		fctx, stop := context.WithCancel(ctx)
		var fl flooder
		var wg sync.WaitGroup
		start := time.Now()
		for range res.workers {
			wg.Go(func() { fl.run(fctx, noisy) })
		}
		sleep(ctx, 3*time.Second) // the flood fills the API server's seats first
		actx, cancel := context.WithTimeout(ctx, noisyFloodLimit)
		ph, err = adds(actx)
		cancel()
		stop()
		wg.Wait()
		return ph, float64(fl.ok.Load()) / time.Since(start).Seconds(), fl.rejected.Load(), fl.errs.Load(), fl.lastErr(), err
	}
	// One untimed wave first: the pods' first ADDs on a freshly restarted
	// replica (pod watches filling, pools growing) are no baseline.
	if _, err = adds(ctx); err != nil {
		return res, fmt.Errorf("warm-up: %w", err)
	}
	if res.quiet, err = adds(ctx); err != nil {
		return res, fmt.Errorf("quiet: %w", err)
	}
	res.flood, res.lists, res.rejected, res.floodErrs, res.lastFloodErr, err = withFlood()
	if err = e.afterFlood(ctx, &res.floodFailed, err); err != nil {
		return res, fmt.Errorf("flood: %w", err)
	}
	remove, err := e.applyFlowControl(ctx, res)
	if err != nil {
		res.fcMissing = err.Error()
		return res, nil
	}
	defer remove()
	sleep(ctx, 3*time.Second) // APF's config controller picks the objects up
	if res.quietFC, err = adds(ctx); err != nil {
		return res, fmt.Errorf("quiet, flow control: %w", err)
	}
	res.floodFC, res.listsFC, res.rejectedFC, res.floodErrsFC, res.lastErrsFC, err = withFlood()
	if err = e.afterFlood(ctx, &res.floodFailedFC, err); err != nil {
		return res, fmt.Errorf("flood, flow control: %w", err)
	}
	return res, nil
}

// afterFlood records a flood condition that failed (err) in failed and
// waits until the replica serves every node again, so that the next
// condition starts from the same state.
func (e *env) afterFlood(ctx context.Context, failed *string, err error) error {
	if err == nil || ctx.Err() != nil {
		return err
	}
	*failed = err.Error()
	if _, serr := e.settle(ctx, len(e.f.Nodes()), 3*time.Minute); serr != nil {
		return fmt.Errorf("after the flood (%w): %w", err, serr)
	}
	return nil
}

// runAsChartServiceAccount restarts the one replica as the chart's
// ServiceAccount (and a neighbour's ServiceAccount is made too); restore
// restarts it as before and removes the bindings.
func (e *env) runAsChartServiceAccount(ctx context.Context, res *noisyResult, phaseArgs []string) (restore func() error, err error) {
	sa, err := e.chartServiceAccount(ctx)
	if err != nil {
		return nil, err
	}
	cleanup, err := e.adminServiceAccounts(ctx, sa, "bench-noisy")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			cleanup()
		}
	}()
	kubeconfig := filepath.Join(e.cfg.WorkDir, "apicost-replica-sa.kubeconfig")
	if err = e.writeSAKubeconfig(ctx, sa, kubeconfig); err != nil {
		return nil, err
	}
	res.identity = "system:serviceaccount:" + podNamespace + ":" + sa
	run := e.running()
	if len(run) == 0 {
		return nil, errors.New("no replica is running")
	}
	for _, r := range run[1:] {
		if err = r.Remove(); err != nil {
			return nil, err
		}
	}
	if err = e.restartWith(ctx, append(append([]string(nil), phaseArgs...), "--kubeconfig", kubeconfig)...); err != nil {
		return nil, err
	}
	return func() error {
		defer cleanup()
		if ctx.Err() != nil {
			return nil
		}
		return e.restartWith(ctx, phaseArgs...)
	}, nil
}

// flooder LISTs every pod of the cluster in a loop.
type flooder struct {
	ok, rejected, errs atomic.Int64
	mu                 sync.Mutex
	last               string
}

// run keeps one LIST of every pod in flight until ctx ends. The answer is
// read and dropped, not decoded: the neighbour stands for a client on
// another machine, and decoding 1,000 pods 80 times a second would cost
// this machine's cores more than the API server's work does, which is what
// APF orders.
func (f *flooder) run(ctx context.Context, c kubernetes.Interface) {
	for ctx.Err() == nil {
		err := listDiscard(ctx, c)
		switch {
		case err == nil:
			f.ok.Add(1)
		case ctx.Err() != nil:
		case apierrors.IsTooManyRequests(err):
			f.rejected.Add(1)
		default:
			f.errs.Add(1)
			f.mu.Lock()
			f.last = err.Error()
			f.mu.Unlock()
		}
	}
}

// listDiscard LISTs every pod and reads the answer to its end.
func listDiscard(ctx context.Context, c kubernetes.Interface) error {
	body, err := c.CoreV1().RESTClient().Get().Resource("pods").Stream(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = body.Close() }()
	_, err = io.Copy(io.Discard, body)
	return err
}

func (f *flooder) lastErr() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

// chartServiceAccount renders the chart's ServiceAccount and returns its
// name (the replicas' identity in a cluster).
func (e *env) chartServiceAccount(ctx context.Context) (string, error) {
	out, err := e.helmTemplate(ctx, "templates/serviceaccount.yaml")
	if err != nil {
		return "", err
	}
	var sa corev1.ServiceAccount
	if err := yaml.Unmarshal(out, &sa); err != nil {
		return "", fmt.Errorf("decode the chart's ServiceAccount: %w", err)
	}
	if sa.Name == "" {
		return "", fmt.Errorf("the chart's ServiceAccount has no name (rendered %q)", out)
	}
	return sa.Name, nil
}

// adminServiceAccounts creates the ServiceAccounts in podNamespace and binds
// them to cluster-admin; cleanup removes the bindings.
func (e *env) adminServiceAccounts(ctx context.Context, names ...string) (cleanup func(), err error) {
	var bindings []string
	cleanup = func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		for _, b := range bindings {
			_ = e.kube.RbacV1().ClusterRoleBindings().Delete(cctx, b, metav1.DeleteOptions{})
		}
	}
	for _, n := range names {
		_, err := e.kube.CoreV1().ServiceAccounts(podNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: n}},
			metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			cleanup()
			return nil, fmt.Errorf("create ServiceAccount %s: %w", n, err)
		}
		b := "apicost-" + n
		_, err = e.kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: b},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: n, Namespace: podNamespace}},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			cleanup()
			return nil, fmt.Errorf("bind ServiceAccount %s: %w", n, err)
		}
		bindings = append(bindings, b)
	}
	return cleanup, nil
}

// saConfig is a client config of ServiceAccount sa in podNamespace with a
// token of the TokenRequest API, valid for 2 hours, and no client-side
// limit.
func (e *env) saConfig(ctx context.Context, sa string) (*rest.Config, error) {
	exp := int64(7200)
	tr, err := e.kube.CoreV1().ServiceAccounts(podNamespace).CreateToken(ctx, sa,
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token of ServiceAccount %s: %w", sa, err)
	}
	c := rest.AnonymousClientConfig(e.cp.Config)
	c.BearerToken = tr.Status.Token
	c.QPS, c.Burst = -1, 0
	return c, nil
}

func (e *env) saClient(ctx context.Context, sa string) (kubernetes.Interface, error) {
	c, err := e.saConfig(ctx, sa)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(c)
}

// writeSAKubeconfig writes a kubeconfig of ServiceAccount sa for a replica.
func (e *env) writeSAKubeconfig(ctx context.Context, sa, path string) error {
	c, err := e.saConfig(ctx, sa)
	if err != nil {
		return err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["bench"] = &clientcmdapi.Cluster{Server: c.Host, CertificateAuthority: c.CAFile,
		CertificateAuthorityData: c.CAData, InsecureSkipTLSVerify: c.Insecure}
	kc.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: c.BearerToken}
	kc.Contexts["bench"] = &clientcmdapi.Context{Cluster: "bench", AuthInfo: sa}
	kc.CurrentContext = "bench"
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return clientcmd.WriteToFile(*kc, path)
}

// applyFlowControl renders the chart's templates/flowcontrol.yaml with its
// defaults and creates every object it holds; remove deletes them. An error
// says why the flow-control half cannot be measured (the template is not in
// the chart yet, or renders nothing).
func (e *env) applyFlowControl(ctx context.Context, res *noisyResult) (remove func(), err error) {
	out, err := e.helmTemplate(ctx, "templates/flowcontrol.yaml")
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(e.cp.Config)
	if err != nil {
		return nil, err
	}
	groups, err := restmapper.GetAPIGroupResources(e.kube.Discovery())
	if err != nil {
		return nil, err
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	type created struct {
		ri   dynamic.ResourceInterface
		name string
	}
	var done []created
	remove = func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		for _, c := range done {
			_ = c.ri.Delete(cctx, c.name, metav1.DeleteOptions{})
		}
	}
	for _, doc := range strings.Split(string(out), "\n---") {
		var obj unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
			remove()
			return nil, fmt.Errorf("decode flowcontrol.yaml: %w", err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			remove()
			return nil, fmt.Errorf("flowcontrol.yaml: %s: %w", gvk, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if ns := obj.GetNamespace(); ns != "" {
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		if _, err := ri.Create(ctx, &obj, metav1.CreateOptions{}); err != nil {
			remove()
			return nil, fmt.Errorf("apply %s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		done = append(done, created{ri: ri, name: obj.GetName()})
		res.fcObjects = append(res.fcObjects, gvk.Kind+"/"+obj.GetName())
	}
	if len(done) == 0 {
		return nil, errors.New("the chart's flowcontrol.yaml renders no object with the default values")
	}
	return remove, nil
}
