package ipam

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/podip"
)

// Fencing tokens on weps. Every wep a replica writes
// (create, update, patch, and the update that precedes a delete of a wep
// whose stored token is not the current one: deleteKnownFirst) carries the
// token of the partition claim it acts under: the partition (a label), the claim's
// holder and the claim's epoch (its Lease's spec.leaseTransitions, which
// every claim CAS increments). The fencing ValidatingAdmissionPolicy
// (charts/cce-ipam/templates/fencing-policy.yaml) refuses, inside the API
// server, a write whose token is not the partition's current claim, so a
// replica that lost the partition cannot write whatever its clock says.
//
// The partition's group (partition / FenceGroupSize) is a label as well: the
// chart has one policy per group, selecting on it, with the group's
// partitions' bindings under it, because the API server parses every
// binding's label selector on every write of a matching policy (the cost of
// one policy over all partitions, shard/DESIGN.md). The policy refuses a
// write whose group is not its partition's.
const (
	LabelFencePartition = "cce.io/fence-partition"
	LabelFenceGroup     = "cce.io/fence-group"
	AnnoFenceHolder     = "cce.io/fence-holder"
	AnnoFenceEpoch      = "cce.io/fence-epoch"

	// FenceGroupSize is how many partitions share a group: the chart's
	// fencing-policy.yaml ($groupSize) must say the same.
	FenceGroupSize = 16
)

// FenceToken names the partition claim a write is made under.
type FenceToken struct {
	Partition int
	Holder    string
	Epoch     int64
}

func (t FenceToken) String() string {
	return fmt.Sprintf("partition %d, holder %q, epoch %d", t.Partition, t.Holder, t.Epoch)
}

// Stamp writes the token into the wep: the partition and its group as labels
// (the policy of the group and the binding of the partition select on them),
// the holder and the epoch as annotations (a member name can be longer than a
// label value).
func (t FenceToken) Stamp(w *cce.WorkloadEndpoint) {
	if w.Labels == nil {
		w.Labels = map[string]string{}
	}
	if w.Annotations == nil {
		w.Annotations = map[string]string{}
	}
	w.Labels[LabelFencePartition] = strconv.Itoa(t.Partition)
	w.Labels[LabelFenceGroup] = strconv.Itoa(t.Partition / FenceGroupSize)
	w.Annotations[AnnoFenceHolder] = t.Holder
	w.Annotations[AnnoFenceEpoch] = strconv.FormatInt(t.Epoch, 10)
}

// tokenOf is the fencing token a wep carries, as one comparable string (the
// four parts Stamp writes), or "" when it carries none. A wep written before
// groups existed has no group label: its token is none, so it is stamped
// before it is deleted (the policy would refuse deleting it as stored).
func tokenOf(w *cce.WorkloadEndpoint) string {
	p, g, h, e := w.Labels[LabelFencePartition], w.Labels[LabelFenceGroup], w.Annotations[AnnoFenceHolder], w.Annotations[AnnoFenceEpoch]
	if p == "" || g == "" || h == "" || e == "" {
		return ""
	}
	return p + "\x00" + g + "\x00" + h + "\x00" + e
}

// stampedToken is tokenOf of a wep stamped with tok.
func stampedToken(tok FenceToken) string {
	var w cce.WorkloadEndpoint
	tok.Stamp(&w)
	return tokenOf(&w)
}

// TokenFence is a Fence that also names the claim its permission rests on
// (shard.Coordinator implements it). With one, every wep write is stamped.
type TokenFence interface {
	Fence
	// FenceToken answers as MayAct does, and names the claim.
	FenceToken(node string) (tok FenceToken, until time.Time, err error)
}

// fenceFor asks the fence whether a write for the node may go ahead, until
// when (zero: no deadline), and under which token (nil: none to stamp, a
// fence without tokens or no fence at all).
func (i *IPAM) fenceFor(node string) (*FenceToken, time.Time, error) {
	tf, ok := i.deps.Fence.(TokenFence)
	if !ok {
		until, err := i.mayActUntil(node)
		return nil, until, err
	}
	tok, until, err := tf.FenceToken(node)
	if err != nil {
		i.metrics.fencedByReplica.Inc()
		// The fence's reason is text: callers branch on ErrFenced, and the
		// shard layer's own errors do not leak through the IPAM.
		return nil, time.Time{}, fmt.Errorf("%w %s: %v", ErrFenced, node, err) //nolint:errorlint // see above
	}
	return &tok, until, nil
}

// fencingDenial is what a refusal by the fencing policy carries: the API
// server answers Forbidden with "ValidatingAdmissionPolicy '<policy>' with
// binding '<binding>' denied request: <message>", and both of the chart's
// policies' messages start with "fenced:" (fencing-policy.yaml).
const fencingDenial = "denied request: fenced:"

// refusedByFencingPolicy reports whether the API server's fencing policy
// refused a write: a Forbidden carrying the policy's denial. A wep write
// without a claim Lease to check (the binding's parameterNotFoundAction) is
// refused with another text, and not counted: replicas write only under a
// claim, which exists.
func refusedByFencingPolicy(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), fencingDenial)
}

// wepWritten takes the error of every wep write this replica sends (create,
// update, patch, delete) and counts a refusal by the API server's fencing
// policy in cce_ipam_fenced_writes_total{by="apiserver"}: the replica
// wrote for a partition it had lost without its own fence noticing, the
// case the counter's alert is for.
func (i *IPAM) wepWritten(err error) {
	if refusedByFencingPolicy(err) {
		i.metrics.fencedByAPIServer.Inc()
	}
}

// fencedContext bounds ctx by the fence's deadline, when there is one.
func fencedContext(ctx context.Context, until time.Time) (context.Context, context.CancelFunc) {
	if until.IsZero() {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, until)
}

// deleteWEP deletes a wep under the fence of its node. With fencing tokens
// the delete is two writes: an update that stamps the current token and
// removes the finalizer (the fenced write: the policy checks the token it
// carries), then the delete, preconditioned on that update's
// resourceVersion (the policy checks the stored token, which is the one just
// written, so a delete sent after the partition moved is refused too).
// Without tokens: the finalizer (kept on our weps for compatibility) is
// removed if present, then the wep is deleted, guarded by its
// resourceVersion. Both writes carry the lease deadline as their context
// deadline.
func (i *IPAM) deleteWEP(ctx context.Context, wep *cce.WorkloadEndpoint) error {
	tok, until, err := i.fenceFor(wep.Spec.Node)
	if err != nil {
		return err
	}
	ctx, cancel := fencedContext(ctx, until)
	defer cancel()
	client := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(wep.Namespace)
	if tok != nil || slices.Contains(wep.Finalizers, cce.WorkloadEndpointFinalizer) {
		upd := wep.DeepCopy()
		upd.Finalizers = slices.DeleteFunc(upd.Finalizers, func(f string) bool { return f == cce.WorkloadEndpointFinalizer })
		if tok != nil {
			tok.Stamp(upd)
		}
		wep, err = client.Update(ctx, upd, metav1.UpdateOptions{})
		i.wepWritten(err)
		if err != nil {
			return fmt.Errorf("stamp and remove finalizer of WorkloadEndpoint: %w", err)
		}
	}
	err = client.Delete(ctx, wep.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{
			UID:             &wep.UID,
			ResourceVersion: &wep.ResourceVersion,
		},
	})
	i.wepWritten(err)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete WorkloadEndpoint: %w", err)
	}
	return nil
}

// deleteKnownWEP is deleteWEP for a wep this replica knows (known.go), with
// the same two writes and no read: a merge patch that drops our finalizer and
// stamps the token, carrying the known resourceVersion (the API server
// refuses it with Conflict if the wep changed since: the caller then reads
// it), then the delete preconditioned on the patch's result. The patch is an
// UPDATE to admission, so the fencing policy checks it as it does the update.
func (i *IPAM) deleteKnownWEP(ctx context.Context, ref podip.PodRef, rec knownWEP, tok *FenceToken, until time.Time) error {
	ctx, cancel := fencedContext(ctx, until)
	defer cancel()
	client := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(ref.Namespace)
	rv, uid := rec.rv, rec.uid
	if tok != nil || slices.Contains(rec.finalizers, cce.WorkloadEndpointFinalizer) {
		rest := slices.DeleteFunc(slices.Clone(rec.finalizers), func(f string) bool { return f == cce.WorkloadEndpointFinalizer })
		w, err := client.Patch(ctx, ref.Name, types.MergePatchType, wepPatch(rec.rv, "", tok, rest, nil), metav1.PatchOptions{})
		i.wepWritten(err)
		if err != nil {
			return err
		}
		rv, uid = w.ResourceVersion, w.UID
	}
	err := client.Delete(ctx, ref.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv},
	})
	i.wepWritten(err)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete WorkloadEndpoint: %w", err)
	}
	return nil
}

// stampKnownWEP is keepOnRelease for a fixed-IP wep this replica knows: one
// merge patch that stamps UpdateAt and the token, carrying the known
// resourceVersion. It returns the wep as written.
func (i *IPAM) stampKnownWEP(ctx context.Context, ref podip.PodRef, rec knownWEP, tok *FenceToken,
	until time.Time) (*cce.WorkloadEndpoint, error) {
	ctx, cancel := fencedContext(ctx, until)
	defer cancel()
	now := metav1.NewTime(i.deps.Clock.Now())
	w, err := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(ref.Namespace).Patch(ctx, ref.Name, types.MergePatchType,
		wepPatch(rec.rv, "", tok, nil, &now), metav1.PatchOptions{})
	i.wepWritten(err)
	return w, err
}

// deleteKnownFirst is the DEL's first write when the wep this replica knows
// already carries the node's current token: the delete itself, with the
// known UID and resourceVersion as preconditions. The fencing policy checks a
// DELETE against the stored token, and the preconditions say the stored wep
// is this replica's own write, so the delete is fenced without a stamp before
// it: a replica that lost the partition carries a token that is no longer
// the claim's, and a wep the new holder wrote since has another
// resourceVersion. With our finalizer on the wep the delete only marks it
// (deletionTimestamp), which nothing undoes: the release is decided, and
// dropFinalizer completes it.
func (i *IPAM) deleteKnownFirst(ctx context.Context, ref podip.PodRef, rec knownWEP, until time.Time) error {
	ctx, cancel := fencedContext(ctx, until)
	defer cancel()
	err := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(ref.Namespace).Delete(ctx, ref.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &rec.uid, ResourceVersion: &rec.rv},
	})
	i.wepWritten(err)
	return err
}

// dropFinalizer removes our finalizer from a wep whose delete is marked
// (rest: the finalizers that stay), which lets the API server remove it: a
// merge patch stamping tok, fenced like every wep write, that names the wep's
// UID (a later wep of the same name is refused: the UID cannot change). It
// carries no resourceVersion: the delete changed it, and its answer does not
// say to what. NotFound: the wep is gone already.
func (i *IPAM) dropFinalizer(ctx context.Context, ref podip.PodRef, uid types.UID, rest []string, tok *FenceToken,
	until time.Time) error {
	ctx, cancel := fencedContext(ctx, until)
	defer cancel()
	_, err := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(ref.Namespace).Patch(ctx, ref.Name, types.MergePatchType,
		wepPatch("", uid, tok, rest, nil), metav1.PatchOptions{})
	i.wepWritten(err)
	return err
}

// wepPatch is a JSON merge patch (RFC 7386) whose preconditions are the
// resourceVersion rv and the UID uid, each when set: the token's label and
// annotations when tok is set, the finalizers when finalizers is not nil (an
// empty list removes them all), spec.updateAt when updateAt is set.
func wepPatch(rv string, uid types.UID, tok *FenceToken, finalizers []string, updateAt *metav1.Time) []byte {
	type meta struct {
		ResourceVersion string            `json:"resourceVersion,omitempty"`
		UID             types.UID         `json:"uid,omitempty"`
		Labels          map[string]string `json:"labels,omitempty"`
		Annotations     map[string]string `json:"annotations,omitempty"`
		Finalizers      *[]string         `json:"finalizers,omitempty"`
	}
	type spec struct {
		UpdateAt *metav1.Time `json:"updateAt,omitempty"`
	}
	p := struct {
		Metadata meta  `json:"metadata"`
		Spec     *spec `json:"spec,omitempty"`
	}{Metadata: meta{ResourceVersion: rv, UID: uid}}
	if tok != nil {
		var w cce.WorkloadEndpoint
		tok.Stamp(&w)
		p.Metadata.Labels, p.Metadata.Annotations = w.Labels, w.Annotations
	}
	if finalizers != nil {
		p.Metadata.Finalizers = &finalizers
	}
	if updateAt != nil {
		p.Spec = &spec{UpdateAt: updateAt}
	}
	b, err := json.Marshal(p)
	if err != nil {
		panic(fmt.Sprintf("marshal a wep patch: %v", err)) // plain strings and a time: cannot fail
	}
	return b
}

// ProbeFence asks the API server whether its fencing policy already refuses
// a wep write under tok (the claim a takeover just replaced): a dry-run
// Create, which runs admission but stores nothing, of a wep named after the
// partition in namespace. refused is true when admission denied it.
func (i *IPAM) ProbeFence(ctx context.Context, namespace, node string, tok FenceToken) (refused bool, err error) {
	return ProbeFence(ctx, i.deps.CCE, i.deps.Clock.Now(), namespace, node, tok)
}

// ProbeFence is IPAM.ProbeFence with a client of the caller's (a takeover's
// probes then do not spend the CNI path's client-side rate limit).
func ProbeFence(ctx context.Context, client cceclient.Interface, now time.Time, namespace, node string,
	tok FenceToken) (refused bool, err error) {
	w := &cce.WorkloadEndpoint{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("cce-ipam-fence-probe-%d", tok.Partition),
			Namespace: namespace,
		},
		Spec: cce.WorkloadEndpointSpec{
			ContainerID: "fence-probe", IP: "127.0.0.1", Type: cce.WorkloadEndpointTypePod, Node: node,
			UpdateAt: metav1.NewTime(now),
		},
	}
	tok.Stamp(w)
	_, err = client.CceV1alpha1().WorkloadEndpoints(namespace).Create(ctx, w, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case err == nil, apierrors.IsAlreadyExists(err):
		return false, nil
	case (apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy"):
		return true, nil
	default:
		return false, err
	}
}

// holdsNode reports, without counting a refusal, whether the fence lets
// this replica write for the node (always, without a fence).
func (i *IPAM) holdsNode(node string) bool {
	if i.deps.Fence == nil {
		return true
	}
	_, err := i.deps.Fence.MayAct(node)
	return err == nil
}
