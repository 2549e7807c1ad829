package shard

import (
	"crypto/hmac"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Operator calls (ipamctl allocate/release, served on the metrics port by
// package operator) change state on a port that has no other
// authentication. Each carries one header, "X-Cce-Ipam-Signature: <unix
// ms>;<mac>", where mac is the forwarded calls' HMAC-SHA256 under the same
// forward key, over "HTTP <method> <path>" in place of the gRPC method, the
// sender "operator", the time and the whole body. A gRPC method always
// starts with "/", so no operator signature passes for a forwarded call's
// or the other way round. The timestamp bounds a replay to forwardSkew, as
// for forwarded calls.
const (
	// HeaderOperatorSignature is the header of a signed operator request.
	HeaderOperatorSignature = "X-Cce-Ipam-Signature"
	operatorSender          = "operator"
)

// Refusals of operator requests.
var (
	// ErrNoForwardKey refuses every operator request of a replica without a
	// forward key: nothing could tell an operator from anyone else.
	ErrNoForwardKey = errors.New("no forward key: operator calls are off")
	// ErrOperatorAuth refuses a request whose signature is missing or does
	// not verify.
	ErrOperatorAuth = errors.New("operator request failed authentication")
)

// Keyed tells whether the authenticator has a key: without one, forwarded
// calls go unsigned (development) and operator calls are refused.
func (a *Authenticator) Keyed() bool { return len(a.key) > 0 }

func operatorMethod(method, path string) string { return "HTTP " + method + " " + path }

// SignRequest returns the HeaderOperatorSignature value of an HTTP request
// of method to path (the URL path without the query) with body.
func (a *Authenticator) SignRequest(method, path string, body []byte) (string, error) {
	if !a.Keyed() {
		return "", ErrNoForwardKey
	}
	ms := a.now().UnixMilli()
	return strconv.FormatInt(ms, 10) + ";" + a.mac(operatorMethod(method, path), operatorSender, ms, body), nil
}

// VerifyRequest checks the HeaderOperatorSignature value of a request:
// ErrNoForwardKey without a key, ErrOperatorAuth for a missing, malformed,
// stale or wrong signature (the method, the path and every byte of the body
// are covered).
func (a *Authenticator) VerifyRequest(method, path string, body []byte, header string) error {
	if !a.Keyed() {
		return ErrNoForwardKey
	}
	if header == "" {
		return fmt.Errorf("%w: no %s header (sign the request with the forward key)", ErrOperatorAuth, HeaderOperatorSignature)
	}
	msText, mac, ok := strings.Cut(header, ";")
	if !ok {
		return fmt.Errorf("%w: malformed %s header", ErrOperatorAuth, HeaderOperatorSignature)
	}
	ms, err := strconv.ParseInt(msText, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: malformed time", ErrOperatorAuth)
	}
	if d := a.now().Sub(time.UnixMilli(ms)); d > forwardSkew || d < -forwardSkew {
		return fmt.Errorf("%w: stale or future timestamp (%s off, at most %s accepted)", ErrOperatorAuth,
			d.Round(time.Second), forwardSkew)
	}
	if !hmac.Equal([]byte(a.mac(operatorMethod(method, path), operatorSender, ms, body)), []byte(mac)) {
		return fmt.Errorf("%w: bad signature (another key, or the request was changed)", ErrOperatorAuth)
	}
	return nil
}
