package webhook

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"unicode"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	sigsjson "sigs.k8s.io/json"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/psts"
)

// reviewPod answers the pod webhook: a new pod that falls under a PSTS gets
// the PSTS annotation (unless it names one already), a required affinity to
// the zones of the PSTS's usable subnets and one cce.baidubce.com/ip. Every
// other pod passes unchanged. It reads only informer caches.
func (s *Server) reviewPod(_ context.Context, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, error) {
	if req.Operation != admissionv1.Create || req.Resource.Resource != "pods" || req.SubResource != "" {
		return allow(), nil // a rule wider than the chart's; nothing to do
	}
	var pod corev1.Pod
	if err := decodeObject(req.Object.Raw, &pod); err != nil {
		return nil, err
	}
	if err := checkPodShape(req.Object.Raw); err != nil {
		return nil, err
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	if pod.Spec.HostNetwork {
		return allow(), nil // no IP from the IPAM
	}
	p, annotate := s.pstsOf(&pod)
	if p == nil {
		return allow(), nil
	}
	m := mutation{zoneLabel: s.cfg.ZoneLabel, zones: s.zonesOf(p), spread: spreadOf(p, s.cfg.ZoneLabel)}
	if annotate {
		m.annotate = p.Name
	}
	ops := m.patch(&pod)
	if len(ops) == 0 {
		return allow(), nil
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return nil, err
	}
	pt := admissionv1.PatchTypeJSONPatch
	return &admissionv1.AdmissionResponse{Allowed: true, PatchType: &pt, Patch: patch}, nil
}

// checkPodShape makes sure the objects the patch adds into are there:
// metadata, spec and the first container (the API server always sends
// them; a hand-made review may not).
func checkPodShape(raw []byte) error {
	var shape struct {
		Metadata map[string]json.RawMessage `json:"metadata"`
		Spec     *struct {
			Containers []map[string]json.RawMessage `json:"containers"`
		} `json:"spec"`
	}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw, &shape); err != nil {
		return badReview("decode object: %v", err)
	}
	if shape.Metadata == nil || shape.Spec == nil || (len(shape.Spec.Containers) > 0 && shape.Spec.Containers[0] == nil) {
		return badReview("the object is not a pod: metadata, spec or its first container is missing")
	}
	return nil
}

// pstsOf is the PSTS of a new pod: the one its annotation names (annotate
// false), else the one psts.Match picks (annotate true); nil for none.
func (s *Server) pstsOf(pod *corev1.Pod) (p *cce.PodSubnetTopologySpread, annotate bool) {
	lister := s.pstsLister.PodSubnetTopologySpreads(pod.Namespace)
	if name := pod.Annotations[cce.AnnotationPodSubnetTopologySpread]; name != "" {
		p, err := lister.Get(name)
		if err != nil {
			return nil, false // the allocator reports a PSTS that does not exist
		}
		return p, false
	}
	list, err := lister.List(labels.Everything())
	if err != nil {
		return nil, false
	}
	return psts.Match(pod, list), true
}

// zonesOf are the zone label values of p's usable subnets (a Subnet that is
// enabled and not exhausted), sorted. Subnets without a Subnet resource yet
// count for nothing: the validating webhook creates them with the PSTS.
func (s *Server) zonesOf(p *cce.PodSubnetTopologySpread) []string {
	var zones []string
	for id := range p.Spec.Subnets {
		sn, err := s.subnetLister.Subnets(cce.SubnetNamespace).Get(id)
		if err != nil || !sn.Status.Enable || sn.Status.HasNoMoreIP {
			continue
		}
		z := zoneValue(sn.Spec.AvailabilityZone, s.cfg.ZoneFormat)
		if len(validation.IsValidLabelValue(z)) == 0 && z != "" && !slices.Contains(zones, z) {
			zones = append(zones, z)
		}
	}
	slices.Sort(zones)
	return zones
}

// zoneValue is the node label value of BCE zone name in format: for
// ZoneFormatCCE "cn-bj-a" is "zoneA" (a name of another shape is kept).
func zoneValue(zone, format string) string {
	if format != ZoneFormatCCE {
		return zone
	}
	i := strings.LastIndexByte(zone, '-')
	if i <= 0 || i == len(zone)-1 {
		return zone
	}
	suffix := zone[i+1:]
	for _, r := range suffix {
		if r > unicode.MaxASCII || !unicode.IsLetter(r) {
			return zone
		}
	}
	return "zone" + strings.ToUpper(suffix)
}

// spreadOf is the zone spread constraint of a PSTS that enables it, with
// the defaults the API server requires (maxSkew ≥ 1, a known action).
func spreadOf(p *cce.PodSubnetTopologySpread, zoneLabel string) *corev1.TopologySpreadConstraint {
	if !p.Spec.EnablePodTopologySpread {
		return nil
	}
	action := corev1.DoNotSchedule
	if p.Spec.WhenUnsatisfiable == cce.ScheduleAnyway {
		action = corev1.ScheduleAnyway
	}
	return &corev1.TopologySpreadConstraint{
		MaxSkew:           max(p.Spec.MaxSkew, 1),
		TopologyKey:       zoneLabel,
		WhenUnsatisfiable: action,
		LabelSelector:     p.Spec.Selector.DeepCopy(),
	}
}

// mutation is what a PSTS pod gets.
type mutation struct {
	annotate  string // the PSTS name to annotate, "" to leave the annotation
	zoneLabel string
	zones     []string // empty: no zone affinity (no usable subnet known)
	spread    *corev1.TopologySpreadConstraint
}

// patchOp is one JSON Patch (RFC 6902) operation.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// patch is the JSON Patch that applies m to pod. It adds at the deepest
// path that exists, so fields this code does not know survive, and adds
// nothing the pod already has: applied to its own result it is empty (the
// webhook may be invoked again after other webhooks).
func (m mutation) patch(pod *corev1.Pod) []patchOp {
	var ops []patchOp
	if m.annotate != "" {
		ops = append(ops, addToMap("/metadata/annotations", pod.Annotations, cce.AnnotationPodSubnetTopologySpread, m.annotate)...)
	}
	if len(m.zones) > 0 {
		ops = append(ops, m.affinityOps(pod)...)
	}
	if m.spread != nil && !slices.ContainsFunc(pod.Spec.TopologySpreadConstraints, func(c corev1.TopologySpreadConstraint) bool {
		return c.TopologyKey == m.spread.TopologyKey
	}) {
		ops = append(ops, appendTo("/spec/topologySpreadConstraints", len(pod.Spec.TopologySpreadConstraints), *m.spread))
	}
	return append(ops, resourceOps(pod)...)
}

// affinityOps AND the zone requirement into every required node selector
// term, or add a term. An empty term matches no node and stays empty.
func (m mutation) affinityOps(pod *corev1.Pod) []patchOp {
	req := corev1.NodeSelectorRequirement{Key: m.zoneLabel, Operator: corev1.NodeSelectorOpIn, Values: m.zones}
	term := corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{req}}
	required := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{term}}
	a := pod.Spec.Affinity
	switch {
	case a == nil:
		return []patchOp{add("/spec/affinity", corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: required}})}
	case a.NodeAffinity == nil:
		return []patchOp{add("/spec/affinity/nodeAffinity", corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: required})}
	case a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil:
		return []patchOp{add("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution", required)}
	}
	const terms = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"
	have := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(have) == 0 {
		return []patchOp{add(terms, []corev1.NodeSelectorTerm{term})}
	}
	var ops []patchOp
	for i, t := range have {
		if len(t.MatchExpressions) == 0 && len(t.MatchFields) == 0 {
			continue
		}
		if slices.ContainsFunc(t.MatchExpressions, func(e corev1.NodeSelectorRequirement) bool {
			return equality.Semantic.DeepEqual(e, req)
		}) {
			continue
		}
		ops = append(ops, appendTo(terms+"/"+strconv.Itoa(i)+"/matchExpressions", len(t.MatchExpressions), req))
	}
	return ops
}

// resourceOps request and limit one cce.baidubce.com/ip on the first
// container, unless a container already asks for the resource.
func resourceOps(pod *corev1.Pod) []patchOp {
	name := corev1.ResourceName(cce.ResourceIP)
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		if _, ok := c.Resources.Requests[name]; ok {
			return nil
		}
		if _, ok := c.Resources.Limits[name]; ok {
			return nil
		}
	}
	if len(pod.Spec.Containers) == 0 {
		return nil // invalid anyway
	}
	one := resource.MustParse("1")
	r := pod.Spec.Containers[0].Resources
	const path = "/spec/containers/0/resources"
	if r.Requests == nil && r.Limits == nil {
		r.Requests = corev1.ResourceList{name: one}
		r.Limits = corev1.ResourceList{name: one}
		return []patchOp{add(path, r)}
	}
	return append(addToResourceList(path+"/requests", r.Requests, name, one), addToResourceList(path+"/limits", r.Limits, name, one)...)
}

func add(path string, value any) patchOp { return patchOp{Op: "add", Path: path, Value: value} }

// addToMap sets key in the object at path, creating the object when m is
// nil (absent or null in the pod).
func addToMap(path string, m map[string]string, key, value string) []patchOp {
	if m == nil {
		return []patchOp{add(path, map[string]string{key: value})}
	}
	return []patchOp{add(path+"/"+escapePointer(key), value)}
}

// addToResourceList is addToMap for a resource list.
func addToResourceList(path string, m corev1.ResourceList, key corev1.ResourceName, value resource.Quantity) []patchOp {
	if m == nil {
		return []patchOp{add(path, corev1.ResourceList{key: value})}
	}
	return []patchOp{add(path+"/"+escapePointer(string(key)), value)}
}

// appendTo appends value to the array at path, which has n elements (0:
// absent or null, then the array is created).
func appendTo(path string, n int, value any) patchOp {
	if n == 0 {
		return add(path, []any{value})
	}
	return add(path+"/-", value)
}

var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// escapePointer escapes a JSON Pointer (RFC 6901) reference token.
func escapePointer(s string) string { return pointerEscaper.Replace(s) }
