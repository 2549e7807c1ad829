// Package admissionretry retries a write that the API server refused only
// because it could not evaluate a ValidatingAdmissionPolicy: the policy's
// binding or param could not be loaded in time ("failed to configure
// binding: Get …/leases/cce-ipam-partition-229: context deadline exceeded"
// from an overloaded server, or a param Lease its informer has not seen yet).
//
// Such a refusal says nothing about the request: with failurePolicy Fail the
// server fails closed, and the same write is admitted a moment later. The
// fencing policy (charts/cce-ipam/templates/fencing-policy.yaml) is where a
// replica meets it, on its wep writes, and without a retry the CNI call
// fails and kubelet backs off for seconds. Admission runs before storage, so
// a refused write did nothing and re-sending it is safe whatever its verb.
// A refusal by the policy itself ("fenced: …") is never retried. Only a
// JSON Status is read (a CRD's answer, as for weps); a protobuf one is passed
// on as it came.
package admissionretry

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

// Defaults of Transport.
const (
	// FirstBackoff is the wait before the first retry; each next wait
	// doubles, up to MaxBackoff.
	FirstBackoff = 20 * time.Millisecond
	MaxBackoff   = 500 * time.Millisecond
	// MaxElapsed bounds the retries of a request whose context has no
	// deadline (a CNI call's has one: its own, or the fence's).
	MaxElapsed = 5 * time.Second
)

// maxStatusBody is how much of a refusal is read to classify it; an
// admission refusal is a small Status, a larger body is passed on unread.
const maxStatusBody = 64 << 10

// Retried describes one retried refusal, for the caller's metric and log.
type Retried struct {
	Method, Path string
	Attempt      int    // the attempt that was refused, from 1
	Message      string // the API server's message
}

// Transport re-sends a write (POST, PUT, PATCH, DELETE) that the API server
// refused because a ValidatingAdmissionPolicy could not be configured, after
// a backoff, until it is answered otherwise or the request's context (or
// MaxElapsed, without a deadline) leaves no room for another attempt; the
// last refusal is then returned as the server sent it.
type Transport struct {
	Next http.RoundTripper
	// OnRetry, if set, is called before each retry.
	OnRetry func(Retried)
	// sleep waits d or until the request's context ends, and maxElapsed
	// replaces MaxElapsed when set (tests).
	sleep      func(req *http.Request, d time.Duration) bool
	maxElapsed time.Duration
}

// Wrap makes cfg's clients retry such refusals, calling onRetry (may be nil)
// before each retry.
func Wrap(cfg *rest.Config, onRetry func(Retried)) {
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &Transport{Next: rt, OnRetry: onRetry}
	})
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !isWrite(req.Method) || req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return t.Next.RoundTrip(req) // nothing admission checks, or a body we could not send again
	}
	start := time.Now()
	backoff := FirstBackoff
	send := req
	for attempt := 1; ; attempt++ {
		resp, err := t.Next.RoundTrip(send)
		if err != nil || !mayBeAdmissionRefusal(resp.StatusCode) {
			return resp, err
		}
		message, retry := peekRefusal(resp)
		if !retry || !t.roomFor(req, start, backoff) {
			return resp, nil
		}
		next, err := again(req)
		if err != nil {
			return resp, nil //nolint:nilerr // the refusal stands: we cannot send the body again
		}
		if !t.wait(req, backoff) {
			return resp, nil // the context ended: the refusal stands
		}
		if t.OnRetry != nil {
			t.OnRetry(Retried{Method: req.Method, Path: req.URL.Path, Attempt: attempt, Message: message})
		}
		_ = resp.Body.Close()
		send = next
		backoff = min(2*backoff, MaxBackoff)
	}
}

func isWrite(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// mayBeAdmissionRefusal: a ValidatingAdmissionPolicy refuses with the
// reason of its validation (Forbidden, 403) or, for a configuration error,
// with no reason, which the API server answers Invalid (422).
func mayBeAdmissionRefusal(code int) bool {
	return code == http.StatusForbidden || code == http.StatusUnprocessableEntity
}

// unconfigured is what the API server's ValidatingAdmissionPolicy
// dispatcher writes when it could not load a policy or binding (its param
// among them): "<resource> \"<name>\" is forbidden: ValidatingAdmissionPolicy
// '<p>' with binding '<b>' denied request: failed to configure binding:
// <cause>", answered 422.
const unconfigured = "denied request: failed to configure "

// peekRefusal reads resp's body, puts it back for the caller, and reports
// whether it is a Status refusing the request only because a
// ValidatingAdmissionPolicy could not be configured. Only the first denial
// is in the message; every cause must be such a one, so that a write some
// other policy refused is not retried.
func peekRefusal(resp *http.Response) (string, bool) {
	head, err := io.ReadAll(io.LimitReader(resp.Body, maxStatusBody+1))
	// The caller reads the body as it came: the part read, then the rest.
	resp.Body = readCloser{Reader: io.MultiReader(bytes.NewReader(head), resp.Body), Closer: resp.Body}
	if err != nil || len(head) > maxStatusBody {
		return "", false
	}
	var status struct {
		Kind    string `json:"kind"`
		Message string `json:"message"`
		Details *struct {
			Causes []struct {
				Message string `json:"message"`
			} `json:"causes"`
		} `json:"details"`
	}
	if json.Unmarshal(head, &status) != nil || status.Kind != "Status" || !isUnconfigured(status.Message) {
		return "", false
	}
	if status.Details != nil {
		for _, c := range status.Details.Causes {
			if !isUnconfigured(c.Message) {
				return "", false
			}
		}
	}
	return status.Message, true
}

func isUnconfigured(message string) bool {
	return strings.Contains(message, "ValidatingAdmissionPolicy '") && strings.Contains(message, unconfigured)
}

// roomFor reports whether a retry after backoff can still be answered
// within the request's deadline (or MaxElapsed without one).
func (t *Transport) roomFor(req *http.Request, start time.Time, backoff time.Duration) bool {
	deadline, ok := req.Context().Deadline()
	if !ok {
		bound := MaxElapsed
		if t.maxElapsed > 0 {
			bound = t.maxElapsed
		}
		deadline = start.Add(bound)
	}
	return time.Now().Add(backoff).Before(deadline)
}

// again is req with its body ready to be sent again.
func again(req *http.Request) (*http.Request, error) {
	next := req.Clone(req.Context())
	if req.GetBody != nil {
		body, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		next.Body = body
	}
	return next, nil
}

func (t *Transport) wait(req *http.Request, d time.Duration) bool {
	if t.sleep != nil {
		return t.sleep(req, d)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-req.Context().Done():
		return false
	}
}

type readCloser struct {
	io.Reader
	io.Closer
}
