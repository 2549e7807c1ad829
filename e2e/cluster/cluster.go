package cluster

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/cce-ipam/sharded/e2e/freeport"
	"github.com/cce-ipam/sharded/e2e/supervisor"
)

// Options configures a control plane. The zero value starts etcd and
// kube-apiserver with binaries from the repository's bin/ directory.
type Options struct {
	// BinDir holds etcd, kube-apiserver and kube-controller-manager.
	// Defaults to $CCE_IPAM_BIN_DIR, else bin/ at the root of this module.
	BinDir string
	// ControllerManager also starts kube-controller-manager, which runs the
	// StatefulSet, ReplicaSet, garbage-collector and ServiceAccount
	// controllers. Defaults to false: most tests need only the API server.
	ControllerManager bool
	// Dir is the working directory (data, certificates, logs). Defaults to a
	// new temporary directory, removed by Close.
	Dir string
	// StartTimeout bounds the wait for every component to be ready.
	// Defaults to 90s: a cold kube-apiserver on a loaded 2-core machine
	// can take half a minute.
	StartTimeout time.Duration
	// AuditServiceAccounts makes the API server record every request of a
	// ServiceAccount (audit level Metadata: user, verb, resource, name,
	// response code) in Dir/audit.log, which AuditEvents reads: a test can
	// compare what a component did with what its RBAC grants.
	AuditServiceAccounts bool
	// APIServerArgs are added to kube-apiserver's command line (after the
	// harness's own, so they may override them).
	APIServerArgs []string
}

func (o *Options) defaults() error {
	if o.BinDir == "" {
		o.BinDir = os.Getenv("CCE_IPAM_BIN_DIR")
	}
	if o.BinDir == "" {
		root, err := moduleRoot()
		if err != nil {
			return fmt.Errorf("find bin/ (set CCE_IPAM_BIN_DIR or Options.BinDir): %w", err)
		}
		o.BinDir = filepath.Join(root, "bin")
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 90 * time.Second
	}
	return nil
}

// Cluster is a running control plane.
type Cluster struct {
	// Config is an admin (system:masters) client config for the API server.
	Config *rest.Config
	// Kubeconfig is the path of a kubeconfig file with the same credentials.
	Kubeconfig string
	// ReplicaConfig and ReplicaKubeconfig are the same for the user
	// ReplicaUser (also system:masters): the identity cce-ipam replicas run
	// as, which the wep fencing policy matches (InstallFencingPolicy).
	ReplicaConfig     *rest.Config
	ReplicaKubeconfig string
	// Dir is the working directory; component logs are Dir/<component>.log.
	Dir string

	ownDir    bool
	binDir    string
	etcdURL   string
	procs     []*supervisor.Process // in start order; stopped in reverse
	closeOnce sync.Once
	closeErr  error
}

// Start launches a control plane and waits until it serves. On error every
// process it started is already stopped.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	for _, bin := range opts.binaries() {
		if _, err := os.Stat(bin); err != nil {
			return nil, fmt.Errorf("control-plane binary %s is missing (run `make tools`): %w", bin, err)
		}
	}
	c := &Cluster{
		Dir:    opts.Dir,
		binDir: opts.BinDir,
	}
	if c.Dir == "" {
		removeAbandonedDirs()
		dir, err := os.MkdirTemp("", tempDirPrefix)
		if err != nil {
			return nil, err
		}
		c.Dir, c.ownDir = dir, true
		if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	if err := c.start(ctx, opts); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

func (o *Options) binaries() []string {
	bins := []string{filepath.Join(o.BinDir, "etcd"), filepath.Join(o.BinDir, "kube-apiserver")}
	if o.ControllerManager {
		bins = append(bins, filepath.Join(o.BinDir, "kube-controller-manager"))
	}
	return bins
}

func (c *Cluster) start(ctx context.Context, opts Options) error {
	ports, err := freeport.Get(3)
	if err != nil {
		return err
	}
	etcdPort, peerPort, apiPort := ports[0], ports[1], ports[2]
	if err := c.startEtcd(ctx, opts.BinDir, etcdPort, peerPort); err != nil {
		return err
	}
	var audit []string
	if opts.AuditServiceAccounts {
		if audit, err = c.auditArgs(); err != nil {
			return err
		}
	}
	if err := c.startAPIServer(ctx, opts.BinDir, apiPort, append(audit, opts.APIServerArgs...)...); err != nil {
		return err
	}
	if opts.ControllerManager {
		if err := c.startControllerManager(ctx, opts.BinDir); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) startEtcd(ctx context.Context, binDir string, port, peerPort int) error {
	c.etcdURL = "http://127.0.0.1:" + strconv.Itoa(port)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	p, err := c.startProcess("etcd", filepath.Join(binDir, "etcd"),
		"--name=default",
		"--data-dir="+filepath.Join(c.Dir, "etcd-data"),
		"--listen-client-urls="+c.etcdURL,
		"--advertise-client-urls="+c.etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL,
		// Test data is disposable; fsync would only slow every write.
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	return waitFor(ctx, p, "etcd", func() bool { return httpOK(http.DefaultClient, c.etcdURL+"/health") })
}

// startAPIServer starts kube-apiserver on port with two token users (the
// admin and ReplicaUser, both system:masters), waits for /readyz and
// writes the clients' configs and kubeconfigs.
func (c *Cluster) startAPIServer(ctx context.Context, binDir string, port int, extraArgs ...string) error {
	certDir := filepath.Join(c.Dir, "certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return err
	}
	saKey, saPub, err := writeServiceAccountKeys(c.Dir)
	if err != nil {
		return err
	}
	tokenFile := filepath.Join(c.Dir, "tokens.csv")
	token, replicaToken, err := writeTokens(tokenFile)
	if err != nil {
		return err
	}
	host := "https://127.0.0.1:" + strconv.Itoa(port)
	p, err := c.startProcess("kube-apiserver", filepath.Join(binDir, "kube-apiserver"), append([]string{
		"--etcd-servers=" + c.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// A loopback advertise address is refused by the endpoints
		// reconciler; nothing here routes to the kubernetes Service anyway.
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + certDir,
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saPub,
		"--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--allow-privileged=true",
		// Without kubelets nothing mounts tokens; and without a running
		// ServiceAccount controller the plugin would reject every pod.
		"--disable-admission-plugins=ServiceAccount",
		"--v=1",
	}, extraArgs...)...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	if err := waitFor(ctx, p, "kube-apiserver /readyz", apiServerReady(host, token)); err != nil {
		return err
	}
	return c.writeClientConfigs(host, token, replicaToken, filepath.Join(certDir, "apiserver.crt"))
}

// writeTokens writes the API server's token file: an admin and ReplicaUser,
// both in system:masters.
func writeTokens(path string) (admin, replica string, err error) {
	if admin, err = randomToken(); err != nil {
		return "", "", err
	}
	if replica, err = randomToken(); err != nil {
		return "", "", err
	}
	tokens := admin + ",admin,admin,system:masters\n" + replica + "," + ReplicaUser + "," + ReplicaUser + ",system:masters\n"
	return admin, replica, os.WriteFile(path, []byte(tokens), 0o600)
}

// apiServerReady probes /readyz. The serving certificate is generated by the
// API server at start-up; until it exists, probe without verification
// (readiness only).
func apiServerReady(host, token string) func() bool {
	probe := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: insecureTLS()},
	}
	return func() bool {
		req, _ := http.NewRequest(http.MethodGet, host+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := probe.Do(req)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
}

// writeClientConfigs extracts the CA the API server generated, sets Config
// and ReplicaConfig, writes their kubeconfigs, and proves the CA verifies
// the server before handing it out.
func (c *Cluster) writeClientConfigs(host, token, replicaToken, servingCert string) error {
	caFile, err := extractCA(servingCert, filepath.Join(c.Dir, "ca.crt"))
	if err != nil {
		return err
	}
	c.Config = &rest.Config{
		Host:            host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: caFile},
		QPS:             200,
		Burst:           400,
	}
	c.Kubeconfig = filepath.Join(c.Dir, "admin.kubeconfig")
	if err := writeKubeconfig(c.Kubeconfig, c.Config); err != nil {
		return err
	}
	c.ReplicaConfig = rest.CopyConfig(c.Config)
	c.ReplicaConfig.BearerToken = replicaToken
	c.ReplicaKubeconfig = filepath.Join(c.Dir, "replica.kubeconfig")
	if err := writeKubeconfig(c.ReplicaKubeconfig, c.ReplicaConfig); err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	if _, err := cs.Discovery().ServerVersion(); err != nil {
		return fmt.Errorf("verify kube-apiserver with its generated CA: %w", err)
	}
	return nil
}

func (c *Cluster) startControllerManager(ctx context.Context, binDir string) error {
	p, err := c.startProcess("kube-controller-manager", filepath.Join(binDir, "kube-controller-manager"),
		"--kubeconfig="+c.Kubeconfig,
		"--bind-address=127.0.0.1",
		// No serving endpoint: readiness is judged by its effects below.
		"--secure-port=0",
		"--leader-elect=false",
		"--service-account-private-key-file="+filepath.Join(c.Dir, "sa.key"),
		"--root-ca-file="+c.Config.CAFile,
		"--use-service-account-credentials=false",
		"--v=1",
	)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	// The ServiceAccount controller creates "default" in every namespace
	// once its informers have synced: a cheap sign the controllers run.
	return waitFor(ctx, p, "kube-controller-manager", func() bool {
		_, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
}

// Close stops every process in reverse start order and removes the working
// directory if Start created it. Logs are kept when a process refused to stop.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		var errs []error
		for i := len(c.procs) - 1; i >= 0; i-- {
			if err := c.procs[i].Stop(10 * time.Second); err != nil {
				errs = append(errs, err)
			}
		}
		if c.ownDir && len(errs) == 0 {
			errs = append(errs, os.RemoveAll(c.Dir))
		}
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// PIDs returns the process IDs of the components, by name.
func (c *Cluster) PIDs() map[string]int {
	out := make(map[string]int, len(c.procs))
	for _, p := range c.procs {
		out[p.Name()] = p.PID()
	}
	return out
}

// Logs returns the last lines of every component's log, for failure reports.
func (c *Cluster) Logs(lines int) string {
	var s string
	for _, p := range c.procs {
		s += fmt.Sprintf("==> %s <==\n%s\n", p.Name(), p.LogTail(lines))
	}
	return s
}

// CreateNamespace creates a namespace with a generated name for one test.
func (c *Cluster) CreateNamespace(ctx context.Context, prefix string) (string, error) {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return "", err
	}
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create namespace: %w", err)
	}
	return ns.Name, nil
}

// DeleteNamespace deletes a namespace; a missing one is not an error.
func (c *Cluster) DeleteNamespace(ctx context.Context, name string) error {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	err = cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

const (
	tempDirPrefix = "cce-ipam-cluster-"
	// ownerFile records the PID of the process that owns a temp dir.
	ownerFile = "owner.pid"
)

// removeAbandonedDirs deletes the temp dirs of control planes whose owner was
// killed before it could run Close (their processes died with it).
func removeAbandonedDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempDirPrefix+"*"))
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // being created right now, or not ours
		}
		if pid, err := strconv.Atoi(string(data)); err == nil && !supervisor.Alive(pid) {
			_ = os.RemoveAll(dir)
		}
	}
}

// startProcess runs one component in the working directory, its output in
// Dir/<name>.log.
func (c *Cluster) startProcess(name, bin string, args ...string) (*supervisor.Process, error) {
	return supervisor.Start(supervisor.Spec{
		Name:    name,
		Bin:     bin,
		Args:    args,
		Dir:     c.Dir,
		LogPath: filepath.Join(c.Dir, name+".log"),
	})
}

// waitFor polls ready every 100ms until it returns true, the process exits, or
// ctx ends.
func waitFor(ctx context.Context, p *supervisor.Process, what string, ready func() bool) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if ready() {
			return nil
		}
		select {
		case <-p.Exited():
			return p.ExitError()
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w; last log lines:\n%s", what, ctx.Err(), p.LogTail(30))
		case <-tick.C:
		}
	}
}

func httpOK(client *http.Client, url string) bool {
	resp, err := client.Get(url)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func randomToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// writeServiceAccountKeys generates the RSA key pair the API server signs
// service-account tokens with.
func writeServiceAccountKeys(dir string) (keyPath, pubPath string, err error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", "", err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", err
	}
	keyPath, pubPath = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	keyPEM := pem.EncodeToMemory(&pem.Block{
		Type:  "RSA PRIVATE KEY",
		Bytes: x509.MarshalPKCS1PrivateKey(key),
	})
	pubPEM := pem.EncodeToMemory(&pem.Block{
		Type:  "PUBLIC KEY",
		Bytes: pub,
	})
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return "", "", err
	}
	return keyPath, pubPath, os.WriteFile(pubPath, pubPEM, 0o644)
}

// extractCA copies the CA certificate out of the bundle the API server wrote
// (serving certificate first, then its self-signed CA). Clients and
// kube-controller-manager's root CA must be the CA alone.
func extractCA(bundle, out string) (string, error) {
	data, err := os.ReadFile(bundle)
	if err != nil {
		return "", fmt.Errorf("read API server certificate: %w", err)
	}
	for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return "", fmt.Errorf("parse %s: %w", bundle, err)
		}
		if cert.IsCA {
			return out, os.WriteFile(out, pem.EncodeToMemory(block), 0o644)
		}
	}
	return "", fmt.Errorf("no CA certificate in %s", bundle)
}

func writeKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{
		Server:               cfg.Host,
		CertificateAuthority: cfg.CAFile,
	}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["local"] = &clientcmdapi.Context{
		Cluster:  "local",
		AuthInfo: "admin",
	}
	kc.CurrentContext = "local"
	return clientcmd.WriteToFile(*kc, path)
}
