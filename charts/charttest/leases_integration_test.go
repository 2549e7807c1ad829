//go:build integration

package charttest

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// The Role grants update and delete on every Lease of the release namespace
// (the replica Leases cannot be named); the chart's lease-name policy keeps
// the replicas' ServiceAccount to cce-ipam-* Leases. As that user, on the
// local control plane: with the Role alone, a foreign Lease (the
// scheduler's) can be rewritten; with the policy, updating, deleting or
// creating a Lease outside cce-ipam-* is refused, and the replicas' own
// Leases still work. The fleet test runs the replicas under the policy.
func TestChart_LeaseNamesRestricted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns, objs, sa := asChartServiceAccount(t, ctx, "leases")
	admin := kubernetes.NewForConfigOrDie(cp.Config)
	leases := sa.CoordinationV1().Leases(ns)

	if _, err := admin.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-scheduler"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: new("scheduler-1")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	steal := func() error {
		l, err := leases.Get(ctx, "kube-scheduler", metav1.GetOptions{})
		if err != nil {
			return err
		}
		l.Spec.HolderIdentity = new("cce-ipam")
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		return err
	}
	if err := steal(); err != nil {
		t.Fatalf("with the Role alone, updating a foreign Lease: %v (this test assumes the Role allows it)", err)
	}

	policy := find(objs, "ValidatingAdmissionPolicy", "leases-cce-ipam-lease-names")
	binding := find(objs, "ValidatingAdmissionPolicyBinding", "leases-cce-ipam-lease-names")
	if len(policy) != 1 || len(binding) != 1 {
		t.Fatal("the chart renders no lease-name policy and binding")
	}
	apply(t, ctx, policy[0], binding[0])
	// The policy takes effect once the API server has loaded it.
	eventually(t, ctx, 200*time.Millisecond, "the lease-name policy refuses a foreign Lease's update", func() error {
		err := steal()
		if err == nil {
			return errors.New("the update was allowed")
		}
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "cce-ipam-*") {
			return err
		}
		return nil
	})
	if err := leases.Delete(ctx, "kube-scheduler", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("delete a foreign Lease: %v, want Forbidden", err)
	}
	if _, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "not-ours"}},
		metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("create a Lease outside cce-ipam-*: %v, want Forbidden", err)
	}

	// The replicas' own Leases: create, renew, delete.
	for _, name := range []string{"cce-ipam-partition-0", "cce-ipam-replica-leases-r0-0a1b2c3d", "cce-ipam-leader"} {
		l, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: new("r0")}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		l.Spec.HolderIdentity = new("r1")
		if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update %s: %v", name, err)
		}
		if err := leases.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete %s: %v", name, err)
		}
	}
}

// asChartServiceAccount renders the chart as release rel in a new
// namespace, applies its ServiceAccount, Role and RoleBinding, and returns
// the namespace, the rendered objects and a client that acts as that
// ServiceAccount (a TokenRequest token), as the replicas do.
func asChartServiceAccount(t *testing.T, ctx context.Context, rel string) (string, []*unstructured.Unstructured, kubernetes.Interface) {
	t.Helper()
	ns := cp.Namespace(t)
	objs := render(t, rel, ns)
	apply(t, ctx, one(t, objs, "ServiceAccount"), one(t, objs, "Role"), one(t, objs, "RoleBinding"))
	tok, err := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().ServiceAccounts(ns).CreateToken(ctx, rel+"-cce-ipam",
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(cp.Config)
	cfg.BearerToken = tok.Status.Token
	return ns, objs, kubernetes.NewForConfigOrDie(cfg)
}

// apply server-side-applies rendered objects as the admin; cluster-scoped
// ones are deleted when the test ends (namespaced ones go with the
// namespace).
func apply(t *testing.T, ctx context.Context, objs ...*unstructured.Unstructured) {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cp.Config)))
	for _, o := range objs {
		m, err := mapper.RESTMapping(o.GroupVersionKind().GroupKind(), o.GroupVersionKind().Version)
		if err != nil {
			t.Fatal(err)
		}
		ri := dynamic.ResourceInterface(dyn.Resource(m.Resource))
		if o.GetNamespace() != "" {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		data, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{
			FieldManager: "charttest", Force: new(true)}); err != nil {
			t.Fatalf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		if o.GetNamespace() == "" {
			name, kind := o.GetName(), o.GetKind()
			t.Cleanup(func() {
				if err := ri.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("delete %s %s: %v", kind, name, err)
				}
			})
		}
	}
}
