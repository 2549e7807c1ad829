package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cce-ipam/sharded/membership"
	"github.com/cce-ipam/sharded/operator"
	"github.com/cce-ipam/sharded/shard"
)

// adminUsage is the usage text of the commands that change state.
const adminUsage = `  allocate NS/POD the CNI ADD of the pod, by hand: prints its IP (--container-id, else the
                  sandbox its WorkloadEndpoint names, else "` + operator.SyntheticContainerID + `"; --reason)
  release NS/POD  the CNI DEL of the pod's sandbox (--container-id, else the one its
                  WorkloadEndpoint names; --reason)
                  Both are signed with the replicas' forward key (--forward-key-file, else the
                  Secret --key-secret read with the kubeconfig) and recorded as Events on the pod
                  with your user name (the API server's, else $USER@host).
`

// adminOptions are the flags of allocate and release.
type adminOptions struct {
	fs          *pflag.FlagSet
	containerID *string
	reason      *string
	keyFile     *string
	keySecret   *string
}

// registerAdminFlags adds the flags of allocate and release. The kubeconfig
// and namespace flags are shared with the other commands: added here only
// when the flag set lacks them.
func registerAdminFlags(fs *pflag.FlagSet) *adminOptions {
	o := &adminOptions{fs: fs}
	o.containerID = fs.String("container-id", "", "allocate/release: the pod's sandbox (infra container ID)")
	o.reason = fs.String("reason", "", "allocate/release: why, recorded in the pod's Event")
	o.keyFile = fs.String("forward-key-file", "",
		"allocate/release: file with the replicas' forward key (base64, the forward-key value of the <fullname>-keys Secret)")
	o.keySecret = fs.String("key-secret", "cce-ipam-keys",
		"allocate/release: the Secret (in --namespace) whose forward-key signs the request, read with the kubeconfig")
	if fs.Lookup("kubeconfig") == nil {
		fs.String("kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
	}
	if fs.Lookup("namespace") == nil {
		fs.String("namespace", "kube-system", "the namespace of the cce-ipam release")
	}
	return o
}

func (o *adminOptions) flag(name string) string {
	if f := o.fs.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}

// runAdmin runs allocate or release of "NS/POD".
func runAdmin(ctx context.Context, w io.Writer, c *client, output string, o *adminOptions, cmd string, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("%s takes one pod, as NAMESPACE/NAME", cmd)
	}
	ns, name, ok := strings.Cut(args[0], "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("%s: %q is not NAMESPACE/NAME", cmd, args[0])
	}
	kube, kubeErr := o.kubeClient()
	key, err := o.forwardKey(ctx, kube, kubeErr)
	if err != nil {
		return err
	}
	body, err := json.Marshal(operator.Request{
		Namespace:   ns,
		Name:        name,
		ContainerID: *o.containerID,
		User:        userName(ctx, kube),
		Reason:      *o.reason,
	})
	if err != nil {
		return err
	}
	path := operator.PathAllocate
	if cmd == "release" {
		path = operator.PathRelease
	}
	sig, err := shard.NewAuthenticator(key).SignRequest(http.MethodPost, path, body)
	if err != nil {
		return err
	}
	var ans operator.Answer
	if err := c.do(ctx, http.MethodPost, path, body, http.Header{shard.HeaderOperatorSignature: {sig}}, &ans); err != nil {
		return fmt.Errorf("%s %s/%s: %w", cmd, ns, name, err)
	}
	if output == "json" {
		return writeJSON(w, ans)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintf(tw, "POD\tIP\tNODE\tCONTAINER\tANSWERED BY\n")
	fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%s\t%s\n", ans.Namespace, ans.Name, ans.IP, ans.Node, ans.ContainerID, ans.AnsweredBy)
	return nil
}

// kubeClient is a client from the kubeconfig kubectl would use; an error
// when there is none (then only --forward-key-file can sign).
func (o *adminOptions) kubeClient() (kubernetes.Interface, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.flag("kubeconfig")
	overrides := &clientcmd.ConfigOverrides{CurrentContext: o.flag("context")}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, errors.New("no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not in a pod")
		}
	}
	cfg.UserAgent = "ipamctl"
	return kubernetes.NewForConfig(cfg)
}

// forwardKey is the key of --forward-key-file, else the forward-key of the
// key Secret.
func (o *adminOptions) forwardKey(ctx context.Context, kube kubernetes.Interface, kubeErr error) ([]byte, error) {
	if *o.keyFile != "" {
		return membership.LoadGossipKey(*o.keyFile)
	}
	if kubeErr != nil {
		return nil, fmt.Errorf("no forward key to sign with: give --forward-key-file, or a kubeconfig that may read "+
			"the Secret --key-secret (%v)", kubeErr)
	}
	ns := o.flag("namespace")
	s, err := kube.CoreV1().Secrets(ns).Get(ctx, *o.keySecret, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read the forward key from Secret %s/%s (or give --forward-key-file): %w", ns, *o.keySecret, err)
	}
	key, err := membership.ParseGossipKey(s.Data[membership.KeySecretForward])
	if err != nil {
		return nil, fmt.Errorf("the forward key in Secret %s/%s, key %s: %w", ns, *o.keySecret, membership.KeySecretForward, err)
	}
	return key, nil
}

// userName is who the Events name: the API server's answer to "who am I"
// when a kubeconfig is at hand, else $USER@host. Either is asserted, not
// proven, to the replica (see package operator).
func userName(ctx context.Context, kube kubernetes.Interface) string {
	if kube != nil {
		// Short: a kubeconfig of an unreachable cluster must not use up the
		// call's timeout.
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		r, err := kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err == nil && r.Status.UserInfo.Username != "" {
			return r.Status.UserInfo.Username
		}
	}
	host, _ := os.Hostname()
	user := os.Getenv("USER")
	if user == "" {
		user = "unknown"
	}
	return user + "@" + host
}
