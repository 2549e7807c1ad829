package webhook

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
)

// Whatever the body, decodeReview never panics, and it either accepts a
// review with a request, a uid and (but for DELETE) an object, or refuses
// with errBadReview (HTTP 400).
//
//	go test -run=^$ -fuzz=FuzzDecodeReview ./ipamcore/webhook/
func FuzzDecodeReview(f *testing.F) {
	for _, seed := range []string{
		reviewJSON(`{"uid":"u","operation":"CREATE","object":{"metadata":{"name":"p"}}}`),
		reviewJSON(`{"uid":"u","operation":"DELETE"}`),
		reviewJSON(`{"uid":"","object":{}}`),
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":null}`,
		`[]`, `null`, `{`, ``, `{"request":{"uid":"u","object":1e999}}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		review, err := decodeReview("application/json", bytes.NewReader([]byte(body)))
		if err != nil {
			if !errors.Is(err, errBadReview) {
				t.Fatalf("error %v does not mark a bad review", err)
			}
			return
		}
		if review.Request == nil || review.Request.UID == "" ||
			(len(review.Request.Object.Raw) == 0 && review.Request.Operation != admissionv1.Delete) {
			t.Fatalf("accepted an incomplete review: %s", body)
		}
	})
}

// Whatever pod object a well-formed review carries, the pod webhook answers
// 200 or 400, never panics, and a patch it returns applies to the object
// and yields an object that still decodes as a pod.
//
//	go test -run=^$ -fuzz=FuzzReviewPod ./ipamcore/webhook/
func FuzzReviewPod(f *testing.F) {
	for _, seed := range []string{
		`{"metadata":{"name":"p","labels":{"app":"web"}},"spec":{"containers":[{"name":"c"}]}}`,
		`{"metadata":{"labels":{"app":"web"},"annotations":null},"spec":{"containers":[]}}`,
		`{"metadata":{"labels":{"app":"web","tier":"gold"}},"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{},{"matchExpressions":null}]}}},"containers":[{"resources":{"limits":null}}]}}`,
		`{"metadata":{"labels":{"app":"spread"}},"spec":{"topologySpreadConstraints":null,"containers":[{}]}}`,
		`{"metadata":{"labels":{"app":"web"},"annotations":{"cce.baidubce.com/PodSubnetTopologySpread":"web-high"}},"spec":{"containers":[{}]}}`,
		`{"spec":null}`, `7`, `{"metadata":{"labels":{"app":"web"}}}`,
	} {
		f.Add(seed)
	}
	s := newTestServer(f, podWorld())
	f.Fuzz(func(t *testing.T, pod string) {
		if !json.Valid([]byte(pod)) {
			return // the review itself would not decode: FuzzDecodeReview's ground
		}
		w := post(t, s, "application/json", reviewJSON(`{"uid":"u","operation":"CREATE","namespace":"apps",`+
			`"resource":{"version":"v1","resource":"pods"},"object":`+pod+`}`))
		if w.Code == http.StatusBadRequest {
			return
		}
		if w.Code != http.StatusOK {
			t.Fatalf("HTTP %d %s", w.Code, w.Body)
		}
		var out admissionv1.AdmissionReview
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Response == nil || !out.Response.Allowed {
			t.Fatalf("answer %s (%v)", w.Body, err)
		}
		if len(out.Response.Patch) == 0 {
			return
		}
		patched, err := applyPatch([]byte(pod), out.Response.Patch)
		if err != nil {
			t.Fatalf("patch %s does not apply to %s: %v", out.Response.Patch, pod, err)
		}
		if err := decodeObject(patched, &corev1.Pod{}); err != nil {
			t.Fatalf("patched pod %s: %v", patched, err)
		}
	})
}
