package operator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
	"github.com/cce-ipam/sharded/shard"
)

// The endpoints, on the metrics port.
const (
	PathAllocate = "/admin/allocate"
	PathRelease  = "/admin/release"
)

// Event reasons of operator calls, on the pod (on its WorkloadEndpoint when a
// release frees the IP of a pod that is gone).
const (
	ReasonAllocated = "IPAllocatedByOperator"
	ReasonReleased  = "IPReleasedByOperator"
	ReasonFailed    = "OperatorIPAMCallFailed"
)

// SyntheticContainerID is the sandbox an allocate names when the operator
// gives no container ID and the pod has no WorkloadEndpoint (with one, the
// call names the wep's container: a by-hand allocate of a pod that holds an
// IP is then a repeated ADD of its sandbox, which answers the same IP and
// changes nothing).
//
// What a later real CNI ADD of the pod does with it (ipam's Allocate): its
// sandbox is another container, so it is no repeated ADD; takeIP finds the
// address the node's store holds for the pod under the synthetic sandbox
// and moves that same address to the real sandbox, and the commit replaces
// the wep (the operator's, known to the owner) with one naming the real
// container and the same IP. So the pod keeps the operator's address, and
// the real sandbox's DEL frees it. A release of the synthetic sandbox after
// that is a stale DEL (the wep names another container) and frees nothing.
// cmd/cce-ipam's TestAdmin_AllocateRelease shows it.
const SyntheticContainerID = "ipamctl-operator"

// maxBody bounds a request body: a few names and a reason.
const maxBody = 64 << 10

// Request is the body of both calls.
type Request struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// ContainerID is the pod's sandbox; empty: allocate uses the wep's or
	// SyntheticContainerID, release the wep's.
	ContainerID string `json:"containerID,omitempty"`
	// User is who asked, as the caller asserts it (see the package doc).
	User   string `json:"user"`
	Reason string `json:"reason,omitempty"`
}

// Answer is the reply of a call that succeeded. A failed call is answered
// with a non-200 status and a text.
type Answer struct {
	Op          string `json:"op"` // "allocate" or "release"
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	ContainerID string `json:"containerID"`
	IP          string `json:"ip"`
	Node        string `json:"node,omitempty"`
	ENIID       string `json:"eniID,omitempty"`
	MAC         string `json:"mac,omitempty"`
	Gateway     string `json:"gateway,omitempty"`
	SubnetID    string `json:"subnetID,omitempty"`
	AnsweredBy  string `json:"answeredBy"`
	User        string `json:"user"`
	Reason      string `json:"reason,omitempty"`
}

// Deps are a Handler's connections.
type Deps struct {
	// Auth verifies the requests' signatures under the forward key.
	Auth *shard.Authenticator
	// CNI is the replica's gRPC CNI service, called in-process.
	CNI rpc.CNIBackendServer
	// Kube reads pods and creates Events; CCE reads WorkloadEndpoints.
	Kube kubernetes.Interface
	CCE  cceclient.Interface
	// Self is this replica's name, recorded as the answering replica.
	Self string
}

// Handler serves PathAllocate and PathRelease.
type Handler struct {
	deps Deps
	log  *slog.Logger
	now  func() time.Time
}

// NewHandler builds the handler; a nil log discards.
func NewHandler(deps Deps, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Handler{deps: deps, log: log, now: time.Now}
}

// callError is a failed call: the HTTP status and the text for the caller.
type callError struct {
	status int
	err    error
}

func (e *callError) Error() string { return e.err.Error() }
func (e *callError) Unwrap() error { return e.err }

func fail(status int, format string, args ...any) *callError {
	return &callError{status: status, err: fmt.Errorf(format, args...)}
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var op string
	switch r.URL.Path {
	case PathAllocate:
		op = "allocate"
	case PathRelease:
		op = "release"
	default:
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "use POST", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if len(body) > maxBody {
		http.Error(w, fmt.Sprintf("body over %d bytes", maxBody), http.StatusRequestEntityTooLarge)
		return
	}
	if err := h.deps.Auth.VerifyRequest(r.Method, r.URL.Path, body, r.Header.Get(shard.HeaderOperatorSignature)); err != nil {
		status := http.StatusUnauthorized
		if errors.Is(err, shard.ErrNoForwardKey) {
			status = http.StatusForbidden
		}
		h.log.Warn("refused an operator call", "op", op, "remote", r.RemoteAddr, "err", err)
		http.Error(w, err.Error(), status)
		return
	}
	var req Request
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		http.Error(w, "bad request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if req.Namespace == "" || req.Name == "" || req.User == "" {
		http.Error(w, "namespace, name and user are required", http.StatusBadRequest)
		return
	}
	var ans Answer
	if op == "allocate" {
		ans, err = h.allocate(r.Context(), req)
	} else {
		ans, err = h.release(r.Context(), req)
	}
	if err != nil {
		status := http.StatusInternalServerError
		if ce := (*callError)(nil); errors.As(err, &ce) {
			status = ce.status
		}
		http.Error(w, err.Error(), status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(ans)
}

// allocate is a CNI ADD for the pod, on the node it is bound to.
func (h *Handler) allocate(ctx context.Context, req Request) (Answer, error) {
	ans := h.answer("allocate", req)
	pod, err := h.deps.Kube.CoreV1().Pods(req.Namespace).Get(ctx, req.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ans, h.failed(ctx, nil, ans, fail(http.StatusNotFound, "pod %s/%s not found", req.Namespace, req.Name))
	}
	if err != nil {
		return ans, h.failed(ctx, nil, ans, fail(http.StatusInternalServerError, "read pod %s/%s: %w", req.Namespace, req.Name, err))
	}
	target := podRef(pod)
	if ans.ContainerID == "" {
		wep, err := h.wep(ctx, req)
		if err != nil {
			return ans, h.failed(ctx, target, ans, err)
		}
		ans.ContainerID = SyntheticContainerID
		if wep != nil {
			ans.ContainerID = wep.Spec.ContainerID
		}
	}
	ans.Node = pod.Spec.NodeName
	reply, err := h.deps.CNI.AllocateIP(ctx, &rpc.AllocateIPRequest{
		K8SPodName:             req.Name,
		K8SPodNamespace:        req.Namespace,
		K8SPodInfraContainerID: ans.ContainerID,
		K8SNodeName:            pod.Spec.NodeName,
		IPType:                 rpc.IPType_BCCMultiENIMultiIPType,
	})
	if err == nil && !reply.GetIsSuccess() {
		err = errors.New(reply.GetErrMsg())
	}
	if err != nil {
		return ans, h.failed(ctx, target, ans, fail(http.StatusInternalServerError, "allocate: %w", err))
	}
	ans.fill(reply.GetENIMultiIP())
	h.succeeded(ctx, target, ans, corev1.EventTypeNormal, ReasonAllocated, "allocated")
	return ans, nil
}

// release is a CNI DEL of the pod's sandbox, on the node its wep names.
// Unlike a DEL, a call that frees nothing is an error: the operator meant
// to free something.
func (h *Handler) release(ctx context.Context, req Request) (Answer, error) {
	ans := h.answer("release", req)
	pod, err := h.deps.Kube.CoreV1().Pods(req.Namespace).Get(ctx, req.Name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return ans, h.failed(ctx, nil, ans, fail(http.StatusInternalServerError, "read pod %s/%s: %w", req.Namespace, req.Name, err))
	}
	var target *corev1.ObjectReference
	if err == nil {
		target = podRef(pod)
	}
	wep, err := h.wep(ctx, req)
	if err != nil {
		return ans, h.failed(ctx, target, ans, err)
	}
	if wep == nil {
		return ans, h.failed(ctx, target, ans, fail(http.StatusNotFound,
			"pod %s/%s holds no IP: it has no WorkloadEndpoint", req.Namespace, req.Name))
	}
	if target == nil {
		// The pod is gone and its wep still holds an IP: the audit goes
		// on the wep, the object the release is about.
		target = &corev1.ObjectReference{Kind: "WorkloadEndpoint", APIVersion: cce.SchemeGroupVersion.String(),
			Namespace: wep.Namespace, Name: wep.Name, UID: wep.UID}
	}
	if ans.ContainerID == "" {
		ans.ContainerID = wep.Spec.ContainerID
	}
	ans.Node, ans.IP = wep.Spec.Node, wep.Spec.IP
	reply, err := h.deps.CNI.ReleaseIP(ctx, &rpc.ReleaseIPRequest{
		K8SPodName:             req.Name,
		K8SPodNamespace:        req.Namespace,
		K8SPodInfraContainerID: ans.ContainerID,
		K8SNodeName:            wep.Spec.Node,
		IPType:                 rpc.IPType_BCCMultiENIMultiIPType,
	})
	if err == nil && !reply.GetIsSuccess() {
		err = errors.New(reply.GetErrMsg())
	}
	if err != nil {
		return ans, h.failed(ctx, target, ans, fail(http.StatusInternalServerError, "release: %w", err))
	}
	if reply.GetENIMultiIP() == nil {
		// A DEL of a sandbox the wep does not name is stale: the IPAM
		// ignores it, as it must for kubelet.
		return ans, h.failed(ctx, target, ans, fail(http.StatusConflict,
			"nothing released: the WorkloadEndpoint of %s/%s names container %s (IP %s), not %s",
			req.Namespace, req.Name, wep.Spec.ContainerID, wep.Spec.IP, ans.ContainerID))
	}
	ans.fill(reply.GetENIMultiIP())
	h.succeeded(ctx, target, ans, corev1.EventTypeNormal, ReasonReleased, "released")
	return ans, nil
}

// wep reads the pod's WorkloadEndpoint; nil when it has none.
func (h *Handler) wep(ctx context.Context, req Request) (*cce.WorkloadEndpoint, error) {
	wep, err := h.deps.CCE.CceV1alpha1().WorkloadEndpoints(req.Namespace).Get(ctx, req.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fail(http.StatusInternalServerError, "read WorkloadEndpoint %s/%s: %w", req.Namespace, req.Name, err)
	}
	return wep, nil
}

func (h *Handler) answer(op string, req Request) Answer {
	return Answer{Op: op, Namespace: req.Namespace, Name: req.Name, ContainerID: req.ContainerID,
		AnsweredBy: h.deps.Self, User: req.User, Reason: req.Reason}
}

func (a *Answer) fill(ep *rpc.ENIMultiIPReply) {
	a.IP, a.ENIID, a.MAC, a.Gateway, a.SubnetID = ep.GetIP(), ep.GetENIID(), ep.GetMac(), ep.GetGw(), ep.GetSubnetID()
	if ep.GetNode() != "" {
		a.Node = ep.GetNode()
	}
}

// succeeded audits a call that did what was asked.
func (h *Handler) succeeded(ctx context.Context, target *corev1.ObjectReference, ans Answer, typ, reason, verb string) {
	h.log.Info("operator IPAM call", "op", ans.Op, "result", "ok", "pod", ans.Namespace+"/"+ans.Name,
		"user", ans.User, "reason", ans.Reason, "ip", ans.IP, "container", ans.ContainerID, "node", ans.Node)
	h.event(ctx, target, typ, reason, fmt.Sprintf("IP %s %s by operator %q (reason: %q); container %s, node %s, answered by replica %s",
		ans.IP, verb, ans.User, ans.Reason, ans.ContainerID, ans.Node, h.deps.Self))
}

// failed audits a failed call (a Warning Event when there is an object to
// put it on) and returns its error.
func (h *Handler) failed(ctx context.Context, target *corev1.ObjectReference, ans Answer, err error) error {
	h.log.Warn("operator IPAM call", "op", ans.Op, "result", "failed", "pod", ans.Namespace+"/"+ans.Name,
		"user", ans.User, "reason", ans.Reason, "ip", ans.IP, "container", ans.ContainerID, "node", ans.Node, "err", err)
	h.event(ctx, target, corev1.EventTypeWarning, ReasonFailed, fmt.Sprintf("%s by operator %q (reason: %q) failed: %v; "+
		"container %q, IP %q, answered by replica %s", ans.Op, ans.User, ans.Reason, err, ans.ContainerID, ans.IP, h.deps.Self))
	return err
}

// event writes one Event, synchronously (not through a recorder's queue):
// the audit is there when the call is answered, and an Event that cannot be
// written is logged. It does not end with the caller's request: a client
// that hangs up does not lose the record.
func (h *Handler) event(ctx context.Context, target *corev1.ObjectReference, typ, reason, msg string) {
	if target == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	now := metav1.NewTime(h.now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s.%x", target.Name, now.UnixNano()),
			Namespace: target.Namespace,
		},
		InvolvedObject:      *target,
		Reason:              reason,
		Message:             msg,
		Type:                typ,
		Source:              corev1.EventSource{Component: "cce-ipam"},
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
		ReportingController: "cce-ipam",
		ReportingInstance:   h.deps.Self,
	}
	if _, err := h.deps.Kube.CoreV1().Events(target.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		h.log.Error("could not record the Event of an operator call", "reason", reason, "object",
			target.Namespace+"/"+target.Name, "message", msg, "err", err)
	}
}

func podRef(p *corev1.Pod) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name, UID: p.UID,
		ResourceVersion: p.ResourceVersion}
}
