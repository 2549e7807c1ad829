package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsjson "sigs.k8s.io/json"
)

// maxReviewBytes bounds a request body: an object is at most 3 MiB in etcd,
// and an UPDATE review carries two.
const maxReviewBytes = 7 << 20

// errBadReview marks a request that is not a well-formed AdmissionReview:
// the answer is HTTP 400.
var errBadReview = errors.New("bad AdmissionReview")

func badReview(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadReview, fmt.Sprintf(format, args...))
}

// decodeReview reads an admission.k8s.io/v1 AdmissionReview request. Every
// error wraps errBadReview.
func decodeReview(contentType string, body io.Reader) (*admissionv1.AdmissionReview, error) {
	if mt, _, err := mime.ParseMediaType(contentType); err != nil || mt != "application/json" {
		return nil, badReview("content type %q, want application/json", contentType)
	}
	data, err := io.ReadAll(io.LimitReader(body, maxReviewBytes+1))
	if err != nil {
		return nil, badReview("read body: %v", err)
	}
	if len(data) > maxReviewBytes {
		return nil, badReview("body larger than %d bytes", maxReviewBytes)
	}
	var review admissionv1.AdmissionReview
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(data, &review); err != nil {
		return nil, badReview("decode: %v", err)
	}
	if gvk := review.GroupVersionKind(); gvk != admissionv1.SchemeGroupVersion.WithKind("AdmissionReview") {
		return nil, badReview("apiVersion %q kind %q, want admission.k8s.io/v1 AdmissionReview", review.APIVersion, review.Kind)
	}
	req := review.Request
	switch {
	case req == nil:
		return nil, badReview("no request")
	case req.UID == "":
		return nil, badReview("request without uid")
	case len(req.Object.Raw) == 0 && req.Operation != admissionv1.Delete:
		return nil, badReview("request without object")
	}
	return &review, nil
}

// decodeObject decodes the request's object into out, a typed object of the
// expected group, version and kind.
func decodeObject(raw []byte, out any) error {
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw, out); err != nil {
		return badReview("decode object: %v", err)
	}
	return nil
}

// reviewFunc answers one admission request; an error wrapping errBadReview
// is a bad request, any other error is a refusal with its message.
type reviewFunc func(ctx context.Context, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, error)

// handler serves one webhook path: POST of an AdmissionReview, answered
// with an AdmissionReview, or 400 for a malformed one.
func (s *Server) handler(name string, review reviewFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "use POST with an AdmissionReview", http.StatusMethodNotAllowed)
			s.metrics.observe(name, resultBadRequest, start)
			return
		}
		in, err := decodeReview(r.Header.Get("Content-Type"), r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			s.metrics.observe(name, resultBadRequest, start)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), requestTimeout(r))
		defer cancel()
		resp, err := review(ctx, in.Request)
		switch {
		case errors.Is(err, errBadReview):
			http.Error(w, err.Error(), http.StatusBadRequest)
			s.metrics.observe(name, resultBadRequest, start)
			return
		case err != nil:
			resp = deny(err)
		}
		resp.UID = in.Request.UID
		s.metrics.observe(name, resultOf(resp), start)
		s.logResponse(name, in.Request, resp)
		out := admissionv1.AdmissionReview{TypeMeta: in.TypeMeta, Response: resp}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(&out); err != nil {
			s.log.Debug("webhook answer not sent", "webhook", name, "err", err)
		}
	})
}

func (s *Server) logResponse(name string, req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
	attrs := []any{"webhook", name, "operation", req.Operation, "namespace", req.Namespace, "name", req.Name}
	if !resp.Allowed && resp.Result != nil {
		s.log.Info("admission refused", append(attrs, "reason", resp.Result.Message)...)
		return
	}
	s.log.Debug("admission allowed", append(attrs, "patched", len(resp.Patch) > 0)...)
}

// requestTimeout is the API server's deadline for the call (its timeout
// query parameter) less a margin for the answer to travel back; 10s when it
// sent none.
func requestTimeout(r *http.Request) time.Duration {
	d, err := time.ParseDuration(r.URL.Query().Get("timeout"))
	if err != nil || d <= 0 || d > 30*time.Second {
		d = 10 * time.Second
	}
	return d - min(d/5, time.Second)
}

// refusal is an error whose message and HTTP code the API server passes to
// the client.
type refusal struct {
	code       int32
	reason     metav1.StatusReason
	retryAfter int32 // seconds; 0: not retryable
	msg        string
}

func (r *refusal) Error() string { return r.msg }

// invalid refuses an object that is wrong as written (HTTP 422).
func invalid(format string, args ...any) error {
	return &refusal{code: http.StatusUnprocessableEntity, reason: metav1.StatusReasonInvalid, msg: fmt.Sprintf(format, args...)}
}

// unavailable refuses for now: the same request may pass later (HTTP 503
// with a Retry-After).
func unavailable(format string, args ...any) error {
	return &refusal{code: http.StatusServiceUnavailable, reason: metav1.StatusReasonServiceUnavailable, retryAfter: 1,
		msg: fmt.Sprintf(format, args...)}
}

func allow() *admissionv1.AdmissionResponse { return &admissionv1.AdmissionResponse{Allowed: true} }

func deny(err error) *admissionv1.AdmissionResponse {
	st := &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden,
		Message: err.Error()}
	var r *refusal
	if errors.As(err, &r) {
		st.Code, st.Reason = r.code, r.reason
		if r.retryAfter > 0 {
			st.Details = &metav1.StatusDetails{RetryAfterSeconds: r.retryAfter}
		}
	}
	return &admissionv1.AdmissionResponse{Allowed: false, Result: st}
}
