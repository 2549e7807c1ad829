package cluster

import (
	"bytes"
	"context"
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

// InstallFencingPolicy renders the chart's wep fencing policy and binding
// (templates/fencing-policy.yaml, with bin/helm) for the coordination Leases
// in namespace, fencing the wep writes of ReplicaUser in that namespace only
// (tests share the control plane), creates them, and waits until the API
// server enforces them. It returns the policy's name (for
// --shard-fencing-policy) and a function that deletes both objects.
func (c *Cluster) InstallFencingPolicy(ctx context.Context, chartDir, namespace string) (string, func(), error) {
	binDir := c.binDir
	full := "fence-" + namespace
	if len(full) > 52 {
		full = full[:52]
	}
	full = strings.TrimRight(full, "-")
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "helm"), "template", "rel", chartDir,
		"--namespace", namespace, "--show-only", "templates/fencing-policy.yaml",
		"--set", "cluster.id=c,cluster.vpcID=v,bce.region=bj,fullnameOverride="+full,
		"--set", "fencing.user="+ReplicaUser,
		"--set-string", `fencing.namespaceSelector.matchLabels.kubernetes\.io/metadata\.name=`+namespace)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", nil, fmt.Errorf("helm template: %w: %s", err, stderr.String())
	}
	var policy admissionv1.ValidatingAdmissionPolicy
	var binding admissionv1.ValidatingAdmissionPolicyBinding
	for _, doc := range strings.Split(string(out), "\n---") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return "", nil, err
		}
		switch meta.Kind {
		case "ValidatingAdmissionPolicy":
			err = yaml.UnmarshalStrict([]byte(doc), &policy)
		case "ValidatingAdmissionPolicyBinding":
			err = yaml.UnmarshalStrict([]byte(doc), &binding)
		}
		if err != nil {
			return "", nil, fmt.Errorf("decode %s: %w", meta.Kind, err)
		}
	}
	if policy.Name == "" || binding.Name == "" {
		return "", nil, fmt.Errorf("helm template rendered no fencing policy and binding:\n%s", out)
	}
	adm := kubernetes.NewForConfigOrDie(c.Config).AdmissionregistrationV1()
	if _, err := adm.ValidatingAdmissionPolicies().Create(ctx, &policy, metav1.CreateOptions{}); err != nil {
		return "", nil, err
	}
	cleanup := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = adm.ValidatingAdmissionPolicyBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{})
		_ = adm.ValidatingAdmissionPolicies().Delete(ctx, policy.Name, metav1.DeleteOptions{})
	}
	if _, err := adm.ValidatingAdmissionPolicyBindings().Create(ctx, &binding, metav1.CreateOptions{}); err != nil {
		cleanup()
		return "", nil, err
	}
	// Enforced once a token-less wep write of the replicas' user is refused.
	probe := versioned.NewForConfigOrDie(c.ReplicaConfig).CceV1alpha1().WorkloadEndpoints(namespace)
	w := &cce.WorkloadEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "fencing-policy-probe", Namespace: namespace},
		Spec:       cce.WorkloadEndpointSpec{ContainerID: "probe", IP: "127.0.0.1", Type: cce.WorkloadEndpointTypePod, Node: "probe"},
	}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = probe.Create(ctx, w, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return (apierrors.IsForbidden(last) || apierrors.IsInvalid(last)) && strings.Contains(last.Error(), "ValidatingAdmissionPolicy"), nil
	})
	if err != nil {
		got, _ := adm.ValidatingAdmissionPolicies().Get(ctx, policy.Name, metav1.GetOptions{})
		cleanup()
		return "", nil, fmt.Errorf("fencing policy not enforced (last probe: %v; status %+v): %w", last, got.Status, err)
	}
	return policy.Name, cleanup, nil
}
