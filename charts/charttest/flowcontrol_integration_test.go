//go:build integration

package charttest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The chart's flow-control objects (templates/flowcontrol.yaml) apply to the
// local API server, and it classifies the replicas' requests by them: a wep
// write, a pod read and a Lease renewal of the chart's ServiceAccount land in
// the CNI level, its lists and watches in the bulk level, anyone else's in
// neither. The API server names the priority level of every request it
// classified in the X-Kubernetes-PF-PriorityLevel-UID response header.
func TestChart_FlowControlClassifiesReplicaRequests(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := cp.Namespace(t)
	release := "fc" + fmt.Sprint(time.Now().UnixNano()%100000)
	objs := render(t, release, ns, "--show-only", "templates/flowcontrol.yaml")
	kube := kubernetes.NewForConfigOrDie(cp.Config)
	fc := kube.FlowcontrolV1()
	t.Cleanup(func() {
		for _, o := range objs {
			switch o.GetKind() {
			case "FlowSchema":
				_ = fc.FlowSchemas().Delete(context.Background(), o.GetName(), metav1.DeleteOptions{})
			case "PriorityLevelConfiguration":
				_ = fc.PriorityLevelConfigurations().Delete(context.Background(), o.GetName(), metav1.DeleteOptions{})
			}
		}
	})
	levels := map[string]types.UID{}
	for _, o := range objs {
		data, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		opts := metav1.PatchOptions{FieldManager: "charttest", Force: new(true)}
		switch o.GetKind() {
		case "PriorityLevelConfiguration":
			pl, err := fc.PriorityLevelConfigurations().Patch(ctx, o.GetName(), types.ApplyPatchType, data, opts)
			if err != nil {
				t.Fatalf("apply %s: %v", o.GetName(), err)
			}
			levels[pl.Name] = pl.UID
		case "FlowSchema":
			if _, err := fc.FlowSchemas().Patch(ctx, o.GetName(), types.ApplyPatchType, data, opts); err != nil {
				t.Fatalf("apply %s: %v", o.GetName(), err)
			}
		default:
			t.Errorf("unexpected %s %s in templates/flowcontrol.yaml", o.GetKind(), o.GetName())
		}
	}
	cni, bulk := levels[release+"-cce-ipam-cni"], levels[release+"-cce-ipam-bulk"]
	if cni == "" || bulk == "" {
		t.Fatalf("rendered priority levels %v, want %s-cce-ipam-cni and -bulk", levels, release)
	}
	// The API server's flow-control controller marks each FlowSchema once
	// its level exists (condition Dangling=False).
	eventually(t, ctx, 100*time.Millisecond, "the FlowSchemas to be in effect", func() error {
		for _, o := range objs {
			if o.GetKind() != "FlowSchema" {
				continue
			}
			fs, err := fc.FlowSchemas().Get(ctx, o.GetName(), metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !hasCondition(fs.Status.Conditions, flowcontrolv1.FlowSchemaConditionDangling, flowcontrolv1.ConditionFalse) {
				return fmt.Errorf("%s: conditions %v", fs.Name, fs.Status.Conditions)
			}
		}
		return nil
	})

	replica := fmt.Sprintf("system:serviceaccount:%s:%s-cce-ipam", ns, release)
	for _, tc := range []struct {
		what, user, method, path string
		want                     types.UID
		not                      bool
	}{
		{"a wep create", replica, http.MethodPost, "/apis/cce.io/v1alpha1/namespaces/default/workloadendpoints", cni, false},
		{"a wep delete", replica, http.MethodDelete, "/apis/cce.io/v1alpha1/namespaces/default/workloadendpoints/x", cni, false},
		{"a pod read", replica, http.MethodGet, "/api/v1/namespaces/default/pods/x", cni, false},
		{"a Lease renewal", replica, http.MethodPut, "/apis/coordination.k8s.io/v1/namespaces/" + ns + "/leases/x", cni, false},
		{"a pod list", replica, http.MethodGet, "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1", bulk, false},
		{"a wep list", replica, http.MethodGet, "/apis/cce.io/v1alpha1/workloadendpoints", bulk, false},
		{"a Lease in another namespace", replica, http.MethodPut, "/apis/coordination.k8s.io/v1/namespaces/default/leases/x", bulk, false},
		{"another user's wep create", "system:serviceaccount:" + ns + ":someone", http.MethodPost,
			"/apis/cce.io/v1alpha1/namespaces/default/workloadendpoints", cni, true},
	} {
		got := priorityLevelOf(t, ctx, tc.user, tc.method, tc.path)
		switch {
		case got == "":
			t.Errorf("%s: the API server named no priority level", tc.what)
		case tc.not && (got == cni || got == bulk):
			t.Errorf("%s went to the chart's level %s", tc.what, got)
		case !tc.not && got != tc.want:
			t.Errorf("%s went to priority level %s, want %s (cni %s, bulk %s)", tc.what, got, tc.want, cni, bulk)
		}
	}
}

// priorityLevelOf sends one request as user (impersonated: the test's admin
// may) and returns the priority level the API server classified it into.
// The request's outcome (403: the user has no RBAC here) does not matter:
// flow control runs before authorization.
func priorityLevelOf(t *testing.T, ctx context.Context, user, method, path string) types.UID {
	t.Helper()
	cfg := rest.CopyConfig(cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, method, cfg.Host+path, http.NoBody)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s as %s: %v", method, path, user, err)
	}
	_ = resp.Body.Close()
	return types.UID(resp.Header.Get("X-Kubernetes-PF-PriorityLevel-UID"))
}

func hasCondition(cs []flowcontrolv1.FlowSchemaCondition, typ flowcontrolv1.FlowSchemaConditionType,
	status flowcontrolv1.ConditionStatus) bool {
	for _, c := range cs {
		if c.Type == typ && c.Status == status {
			return true
		}
	}
	return false
}
