package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
)

// ReplicaUser is the token-file user cce-ipam replicas run as in tests.
const ReplicaUser = "cce-ipam-replica"

// InstallFencingPolicy renders the chart's wep fencing policies and bindings
// (templates/fencing-policy.yaml, with bin/helm) for the coordination Leases
// in namespace, fencing the wep writes of ReplicaUser in that namespace only
// (tests share the control plane), creates them, and waits until the API
// server enforces them. It returns the policy's name (for
// --shard-fencing-policy) and a function that deletes the objects.
func (c *Cluster) InstallFencingPolicy(ctx context.Context, chartDir, namespace string) (string, func(), error) {
	return c.installFencingPolicy(ctx, chartDir, namespace, namespace)
}

// InstallFencingPolicyAllNamespaces is InstallFencingPolicy for a control
// plane of one fleet: the weps of every namespace are fenced.
func (c *Cluster) InstallFencingPolicyAllNamespaces(ctx context.Context, chartDir, leaseNamespace string) (string, func(), error) {
	return c.installFencingPolicy(ctx, chartDir, leaseNamespace, "")
}

func (c *Cluster) installFencingPolicy(ctx context.Context, chartDir, namespace, wepNamespace string) (string, func(), error) {
	policies, bindings, err := c.renderFencingPolicy(ctx, chartDir, namespace, wepNamespace)
	if err != nil {
		return "", nil, err
	}
	adm := kubernetes.NewForConfigOrDie(c.Config).AdmissionregistrationV1()
	cleanup := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, b := range bindings {
			_ = adm.ValidatingAdmissionPolicyBindings().Delete(ctx, b.Name, metav1.DeleteOptions{})
		}
		for _, p := range policies {
			_ = adm.ValidatingAdmissionPolicies().Delete(ctx, p.Name, metav1.DeleteOptions{})
		}
	}
	for k := range policies {
		if _, err := adm.ValidatingAdmissionPolicies().Create(ctx, &policies[k], metav1.CreateOptions{}); err != nil {
			cleanup()
			return "", nil, err
		}
	}
	for k := range bindings {
		if _, err := adm.ValidatingAdmissionPolicyBindings().Create(ctx, &bindings[k], metav1.CreateOptions{}); err != nil {
			cleanup()
			return "", nil, err
		}
	}
	if err := c.waitFencingEnforced(ctx, namespace, bindings); err != nil {
		cleanup()
		return "", nil, err
	}
	// The policies' common prefix, the name the replicas are given
	// (--shard-fencing-policy): <name>-g<group> and <name>-token.
	for _, p := range policies {
		if name, ok := strings.CutSuffix(p.Name, "-token"); ok {
			return name, cleanup, nil
		}
	}
	cleanup()
	return "", nil, errors.New("the chart rendered no <name>-token fencing policy")
}

// renderFencingPolicy renders the chart's fencing-policy.yaml with bin/helm
// and decodes its policies and bindings.
func (c *Cluster) renderFencingPolicy(ctx context.Context, chartDir, namespace, wepNamespace string) (
	[]admissionv1.ValidatingAdmissionPolicy, []admissionv1.ValidatingAdmissionPolicyBinding, error) {
	full := "fence-" + namespace
	if len(full) > 52 {
		full = full[:52]
	}
	full = strings.TrimRight(full, "-")
	// --kube-version: the chart needs >= 1.31 (Chart.yaml kubeVersion), and the
	// pinned helm's own default is v1.20.0.
	args := []string{"template", "rel", chartDir, "--kube-version", "1.31.0",
		"--namespace", namespace, "--show-only", "templates/fencing-policy.yaml",
		"--set", "cluster.id=c,cluster.vpcID=v,bce.region=bj,fullnameOverride=" + full,
		"--set", "fencing.user=" + ReplicaUser}
	if wepNamespace != "" {
		args = append(args, "--set-string", `fencing.namespaceSelector.matchLabels.kubernetes\.io/metadata\.name=`+wepNamespace)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, "helm"), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, nil, fmt.Errorf("helm template: %w: %s", err, stderr.String())
	}
	var policies []admissionv1.ValidatingAdmissionPolicy
	var bindings []admissionv1.ValidatingAdmissionPolicyBinding
	for _, doc := range strings.Split(string(out), "\n---") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, nil, err
		}
		switch meta.Kind {
		case "ValidatingAdmissionPolicy":
			var p admissionv1.ValidatingAdmissionPolicy
			err = yaml.UnmarshalStrict([]byte(doc), &p)
			policies = append(policies, p)
		case "ValidatingAdmissionPolicyBinding":
			var b admissionv1.ValidatingAdmissionPolicyBinding
			err = yaml.UnmarshalStrict([]byte(doc), &b)
			bindings = append(bindings, b)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("decode %s: %w", meta.Kind, err)
		}
	}
	if len(policies) == 0 || len(bindings) == 0 {
		return nil, nil, fmt.Errorf("helm template rendered no fencing policy and bindings:\n%s", out)
	}
	return policies, bindings, nil
}

// waitFencingEnforced waits until the API server refuses a token-less wep
// write of the replicas' user, and one under a holder that claims nothing
// (the last partition's binding; its claim may not even exist).
func (c *Cluster) waitFencingEnforced(ctx context.Context, namespace string,
	bindings []admissionv1.ValidatingAdmissionPolicyBinding) error {
	probe := versioned.NewForConfigOrDie(c.ReplicaConfig).CceV1alpha1().WorkloadEndpoints(namespace)
	w := &cce.WorkloadEndpoint{
		ObjectMeta: metav1.ObjectMeta{
			Name:      "fencing-policy-probe",
			Namespace: namespace,
		},
		Spec: cce.WorkloadEndpointSpec{
			ContainerID: "probe",
			IP:          "127.0.0.1",
			Type:        cce.WorkloadEndpointTypePod,
			Node:        "probe",
		},
	}
	last := len(bindings) - 1
	for last > 0 && bindings[last].Spec.ParamRef == nil {
		last--
	}
	p := strings.TrimPrefix(bindings[last].Spec.ParamRef.Name, "cce-ipam-partition-")
	stamped := w.DeepCopy()
	stamped.Labels = map[string]string{"cce.io/fence-partition": p}
	stamped.Annotations = map[string]string{"cce.io/fence-holder": "nobody-probe", "cce.io/fence-epoch": "0"}
	var lastErr error
	refused := func(ctx context.Context, obj *cce.WorkloadEndpoint) (bool, error) {
		_, lastErr = probe.Create(ctx, obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return (apierrors.IsForbidden(lastErr) || apierrors.IsInvalid(lastErr)) &&
			strings.Contains(lastErr.Error(), "ValidatingAdmissionPolicy"), nil
	}
	for _, obj := range []*cce.WorkloadEndpoint{w, stamped} {
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			return refused(ctx, obj)
		})
		if err != nil && lastErr == nil {
			return fmt.Errorf("fencing policy not enforced (the last probe was accepted): %w", err)
		}
		if err != nil {
			return fmt.Errorf("fencing policy not enforced (last probe: %w): %w", lastErr, err)
		}
	}
	return nil
}
