//go:build integration

package main_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/invariants"
	"github.com/cce-ipam/sharded/membership"
	"github.com/cce-ipam/sharded/operator"
	"github.com/cce-ipam/sharded/shard"
)

// ipamctl allocate/release by hand, through a replica that does not own the
// pod's node: the owner serves it (the call goes the CNI path, forwarded
// once), the pod gets Events naming the user and the reason, and a request
// without a valid signature changes nothing.
func TestAdmin_AllocateRelease(t *testing.T) {
	// No GC pass during the test: the release of a deleted pod's IP below
	// must find its wep still there.
	e := startShards(t, fleet.Options{Name: "admin", Replicas: 3, ReplicaArgs: []string{"--gc-period", "1h"}}, 6)
	holders, _ := e.settle(90 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	node := e.Nodes()[0]
	var entry, owner *fleet.Replica
	for _, r := range e.Replicas() {
		if e.memberName(r) == holders[node] {
			owner = r
		} else if entry == nil {
			entry = r
		}
	}
	if owner == nil || entry == nil {
		t.Fatalf("node %s: owner %q among no replica, or no other replica", node, holders[node])
	}
	review, err := e.Kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	user := review.Status.UserInfo.Username
	bin := filepath.Join(e.Options().BinDir, "ipamctl")
	ipamctl := func(args ...string) (operator.Answer, string, error) {
		base := []string{"--server", entry.MetricsAddr(), "--kubeconfig", e.Kubeconfig, "--namespace", e.ns, "-o", "json"}
		cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var ans operator.Answer
		if err == nil {
			err = json.Unmarshal(out, &ans)
		}
		return ans, stderr.String(), err
	}
	keyFile := e.ForwardKeyFile()

	// allocate through the entry replica: the owner commits the wep.
	pod, err := e.newPod(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	ans, stderr, err := ipamctl("--forward-key-file", keyFile, "allocate", e.ns+"/"+pod, "--reason", "stuck sandbox #1")
	if err != nil {
		t.Fatalf("ipamctl allocate: %v: %s", err, stderr)
	}
	t.Logf("ipamctl allocate: %+v", ans)
	if ans.IP == "" || ans.ContainerID != operator.SyntheticContainerID || ans.AnsweredBy != e.memberName(entry) || ans.Node != node {
		t.Errorf("allocate answered %+v; want an IP for container %s on %s, answered by %s", ans,
			operator.SyntheticContainerID, node, e.memberName(entry))
	}
	wep, err := e.CCE.CceV1alpha1().WorkloadEndpoints(e.ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("no wep after ipamctl allocate: %v", err)
	}
	if wep.Spec.IP != ans.IP || wep.Spec.ContainerID != operator.SyntheticContainerID || wep.Spec.Node != node {
		t.Errorf("wep %+v, want IP %s of container %s on %s", wep.Spec, ans.IP, operator.SyntheticContainerID, node)
	}
	if n := e.metric(owner, "cce_ipam_allocations_total", okResult); n != 1 {
		t.Errorf("the owner made %v allocations, want 1", n)
	}
	if n := e.metric(entry, "cce_ipam_allocations_total", okResult); n != 0 {
		t.Errorf("the entry replica made %v allocations itself, want 0", n)
	}
	if n := e.metric(entry, "cce_ipam_shard_forwarded_requests_total", okResult); n != 1 {
		t.Errorf("the entry replica forwarded %v calls, want 1", n)
	}
	e.wantEvent(ctx, pod, operator.ReasonAllocated, user, "stuck sandbox #1", ans.IP, operator.SyntheticContainerID, e.memberName(entry))

	// A release of another sandbox is a stale DEL: nothing freed, an error
	// and a Warning Event.
	if _, stderr, err := ipamctl("--forward-key-file", keyFile, "release", e.ns+"/"+pod, "--container-id", "other"); err == nil ||
		!strings.Contains(stderr, "nothing released") {
		t.Errorf("release of another sandbox: %v, %q; want an error saying nothing was released", err, stderr)
	}
	e.wantEvent(ctx, pod, operator.ReasonFailed, user, "nothing released")

	// The pod's real sandbox then ADDs (kubelet): it takes over the same
	// IP, and the wep names it (operator.SyntheticContainerID's comment).
	ip, err := e.allocate(ctx, e.Replicas()[0], pod)
	if err != nil {
		t.Fatal(err)
	}
	wep, err = e.CCE.CceV1alpha1().WorkloadEndpoints(e.ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ip != ans.IP || wep.Spec.IP != ans.IP || wep.Spec.ContainerID != "sandbox-"+pod {
		t.Errorf("the real sandbox's ADD got %s, wep %s of %s; want the operator's %s, of sandbox-%s", ip, wep.Spec.IP,
			wep.Spec.ContainerID, ans.IP, pod)
	}

	// release without a container ID frees the sandbox the wep names; the
	// key comes from a Secret read with the kubeconfig.
	key, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Kube.CoreV1().Secrets(e.ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "admin-keys"},
		Data:       map[string][]byte{membership.KeySecretForward: key},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rel, stderr, err := ipamctl("--key-secret", "admin-keys", "release", e.ns+"/"+pod, "--reason", "cleanup")
	if err != nil {
		t.Fatalf("ipamctl release: %v: %s", err, stderr)
	}
	if rel.IP != ans.IP || rel.ContainerID != "sandbox-"+pod {
		t.Errorf("release answered %+v; want %s of sandbox-%s", rel, ans.IP, pod)
	}
	// A DEL is answered once the wep's delete is marked; its finalizer and
	// the address follow within milliseconds (ipamcore/ipam/REQUESTS.md).
	var wepErr error
	var pool invariants.PoolCounts
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, wepErr = e.CCE.CceV1alpha1().WorkloadEndpoints(e.ns).Get(ctx, pod, metav1.GetOptions{})
		if pool, err = e.NodePool(ctx, node); err != nil {
			t.Fatal(err)
		}
		if (apierrors.IsNotFound(wepErr) && pool.Assigned == 0) || time.Now().After(deadline) {
			break
		}
	}
	if !apierrors.IsNotFound(wepErr) {
		t.Errorf("wep 10 s after ipamctl release: %v, want NotFound", wepErr)
	}
	if pool.Assigned != 0 {
		t.Errorf("node %s pool 10 s after the release: %+v, want nothing assigned", node, pool)
	}
	e.wantEvent(ctx, pod, operator.ReasonReleased, user, "cleanup", ans.IP, "sandbox-"+pod, e.memberName(entry))

	// The IP of a pod deleted without its DEL: the release's Event goes on
	// its wep, the object left.
	gone, err := e.newPod(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := ipamctl("--forward-key-file", keyFile, "allocate", e.ns+"/"+gone); err != nil {
		t.Fatalf("ipamctl allocate: %v: %s", err, stderr)
	}
	if err := e.Kube.CoreV1().Pods(e.ns).Delete(ctx, gone, *metav1.NewDeleteOptions(0)); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := ipamctl("--forward-key-file", keyFile, "release", e.ns+"/"+gone, "--reason", "pod gone"); err != nil {
		t.Fatalf("ipamctl release of a deleted pod's IP: %v: %s", err, stderr)
	}
	e.wantEvent(ctx, gone, operator.ReasonReleased, user, "pod gone")
	for _, ev := range e.events(ctx, gone) {
		if ev.Reason == operator.ReasonReleased && ev.InvolvedObject.Kind != "WorkloadEndpoint" {
			t.Errorf("the release of a deleted pod's IP is recorded on a %s, want its WorkloadEndpoint", ev.InvolvedObject.Kind)
		}
	}

	// Unsigned, forged or altered requests are refused and change nothing.
	pod2, err := e.newPod(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(operator.Request{Namespace: e.ns, Name: pod2, User: "mallory"})
	forgedKey := filepath.Join(t.TempDir(), "forged.key")
	if err := os.WriteFile(forgedKey, []byte(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("x"), 32))), 0o600); err != nil {
		t.Fatal(err)
	}
	forged, err := membership.LoadGossipKey(forgedKey)
	if err != nil {
		t.Fatal(err)
	}
	forgedSig, _ := shard.NewAuthenticator(forged).SignRequest(http.MethodPost, operator.PathAllocate, body)
	clusterKey, _ := membership.LoadGossipKey(keyFile)
	otherBody, _ := json.Marshal(operator.Request{Namespace: e.ns, Name: pod, User: "mallory"})
	realSig, _ := shard.NewAuthenticator(clusterKey).SignRequest(http.MethodPost, operator.PathAllocate, otherBody)
	for name, sig := range map[string]string{"unsigned": "", "forged": forgedSig, "signed for another body": realSig} {
		code, text := postAdmin(t, entry, operator.PathAllocate, body, sig)
		if code != http.StatusUnauthorized || !strings.Contains(text, "authentication") {
			t.Errorf("%s request: HTTP %d %q, want 401 failed authentication", name, code, text)
		}
	}
	if _, stderr, err := ipamctl("--forward-key-file", forgedKey, "allocate", e.ns+"/"+pod2); err == nil ||
		!strings.Contains(stderr, "401") {
		t.Errorf("ipamctl with another key: %v, %q; want a 401", err, stderr)
	}
	if _, err := e.CCE.CceV1alpha1().WorkloadEndpoints(e.ns).Get(ctx, pod2, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a refused request made a wep: %v", err)
	}
	if n := e.metric(owner, "cce_ipam_allocations_total", nil); n != 3 {
		t.Errorf("the owner counts %v allocations, want 3 (the operator's two and the sandbox's)", n)
	}
	if evs := e.events(ctx, pod2); len(evs) != 0 {
		t.Errorf("refused requests left Events on %s: %v", pod2, evs)
	}

	// A release of a pod that holds no IP: an error, a Warning Event if the
	// pod exists, none if not.
	if _, stderr, err := ipamctl("--forward-key-file", keyFile, "release", e.ns+"/"+pod2); err == nil ||
		!strings.Contains(stderr, "holds no IP") {
		t.Errorf("release of a pod without an IP: %v, %q; want an error saying it holds no IP", err, stderr)
	}
	e.wantEvent(ctx, pod2, operator.ReasonFailed, user, "holds no IP")
	if _, stderr, err := ipamctl("--forward-key-file", keyFile, "release", e.ns+"/ghost"); err == nil ||
		!strings.Contains(stderr, "holds no IP") {
		t.Errorf("release of a pod that does not exist: %v, %q; want an error saying it holds no IP", err, stderr)
	}
	if evs := e.events(ctx, "ghost"); len(evs) != 0 {
		t.Errorf("a release of a pod that does not exist left Events: %v", evs)
	}
	t.Logf("entry log tail:\n%s", entry.Logs(5))
}

// postAdmin posts body to a replica's operator endpoint with the signature
// header sig (none when empty) and returns the status and text.
func postAdmin(t *testing.T, r *fleet.Replica, path string, body []byte, sig string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+r.MetricsAddr()+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if sig != "" {
		req.Header.Set(shard.HeaderOperatorSignature, sig)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var text bytes.Buffer
	_, _ = text.ReadFrom(resp.Body)
	return resp.StatusCode, text.String()
}

// events returns the Events on the object named name in the test namespace.
func (e *shardFleet) events(ctx context.Context, name string) []corev1.Event {
	e.t.Helper()
	list, err := e.Kube.CoreV1().Events(e.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		e.t.Fatal(err)
	}
	return list.Items
}

// wantEvent checks the pod has an Event of reason whose message names
// every one of words.
func (e *shardFleet) wantEvent(ctx context.Context, pod, reason string, words ...string) {
	e.t.Helper()
	var seen []string
	for _, ev := range e.events(ctx, pod) {
		if ev.Reason != reason {
			seen = append(seen, ev.Reason+": "+ev.Message)
			continue
		}
		var missing []string
		for _, w := range words {
			if !strings.Contains(ev.Message, w) {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			e.t.Logf("event %s %s: %s", ev.Type, ev.Reason, ev.Message)
			return
		}
		seen = append(seen, ev.Reason+": "+ev.Message)
	}
	e.t.Errorf("pod %s: no %s Event naming %q; events: %q", pod, reason, words, seen)
}
