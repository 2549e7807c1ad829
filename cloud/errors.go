package cloud

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/baidubce/bce-sdk-go/bce"
)

// Class is what a failed cloud call means to the IPAM.
type Class int

// Error classes. The first group carries the upstream IPAM's meaning (spec
// §3); the rest say why an unclassified call failed.
const (
	ClassUnknown Class = iota
	// ClassRateLimit: BCE throttled the call; back off and retry later.
	ClassRateLimit
	// ClassSubnetHasNoMoreIP: the subnet is exhausted; stop growing from it.
	ClassSubnetHasNoMoreIP
	// ClassVMMemoryCannotAttachMoreIP: the ENI is at its per-instance-memory
	// address cap; shrink the batch or use another ENI.
	ClassVMMemoryCannotAttachMoreIP
	// ClassPrivateIPInUse: the requested address is taken.
	ClassPrivateIPInUse
	// ClassPrivateIPNotFound: the address is not on the ENI; a release of it
	// has, in effect, succeeded.
	ClassPrivateIPNotFound
	// ClassENINotFound: the ENI does not exist.
	ClassENINotFound
	// ClassQuotaExceeded: an account or VPC quota is used up.
	ClassQuotaExceeded
	// ClassNotFound: another object (subnet, instance) does not exist.
	ClassNotFound
	// ClassAuth: the credentials were refused.
	ClassAuth
	// ClassInvalidRequest: BCE (or this client, before calling) refused the input.
	ClassInvalidRequest
	// ClassServer: BCE failed with 5xx even after the retries (SDKRetries).
	ClassServer
	// ClassTransport: no answer (connection refused, timeout).
	ClassTransport
	// ClassCanceled: the caller's context ended.
	ClassCanceled
)

var classNames = [...]string{"unknown", "rate_limit", "subnet_has_no_more_ip", "vm_memory_cannot_attach_more_ip",
	"private_ip_in_use", "private_ip_not_found", "eni_not_found", "quota_exceeded", "not_found", "auth",
	"invalid_request", "server", "transport", "canceled"}

// String is the class's metric label.
func (c Class) String() string {
	if c < 0 || int(c) >= len(classNames) {
		return fmt.Sprintf("class(%d)", int(c))
	}
	return classNames[c]
}

// Retryable reports whether the same call may succeed later unchanged.
func (c Class) Retryable() bool {
	return c == ClassRateLimit || c == ClassServer || c == ClassTransport
}

type classErr Class

func (e classErr) Error() string { return "cloud: " + Class(e).String() }

// Sentinels for errors.Is: errors.Is(err, cloud.ErrRateLimit) holds for
// every *Error of that class.
var (
	// ErrRateLimit matches ClassRateLimit.
	ErrRateLimit error = classErr(ClassRateLimit)
	// ErrSubnetHasNoMoreIP matches ClassSubnetHasNoMoreIP.
	ErrSubnetHasNoMoreIP error = classErr(ClassSubnetHasNoMoreIP)
	// ErrVMMemoryCannotAttachMoreIP matches ClassVMMemoryCannotAttachMoreIP.
	ErrVMMemoryCannotAttachMoreIP error = classErr(ClassVMMemoryCannotAttachMoreIP)
	// ErrPrivateIPInUse matches ClassPrivateIPInUse.
	ErrPrivateIPInUse error = classErr(ClassPrivateIPInUse)
	// ErrPrivateIPNotFound matches ClassPrivateIPNotFound.
	ErrPrivateIPNotFound error = classErr(ClassPrivateIPNotFound)
	// ErrENINotFound matches ClassENINotFound.
	ErrENINotFound error = classErr(ClassENINotFound)
	// ErrQuotaExceeded matches ClassQuotaExceeded.
	ErrQuotaExceeded error = classErr(ClassQuotaExceeded)
	// ErrNotFound matches ClassNotFound.
	ErrNotFound error = classErr(ClassNotFound)
	// ErrInvalidRequest matches ClassInvalidRequest.
	ErrInvalidRequest error = classErr(ClassInvalidRequest)
)

// Error is a failed cloud call. It carries BCE's code and request ID for
// logs, never credentials or SDK types.
type Error struct {
	Op         string // operation, e.g. "BatchAddPrivateIP"
	Resource   string // the ENI, subnet or instance ID the call was about
	Class      Class
	Code       string // BCE error code, if BCE answered
	StatusCode int    // HTTP status, if BCE answered
	RequestID  string
	Message    string
	cause      error // context error for ClassCanceled
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Op)
	if e.Resource != "" {
		b.WriteString(" " + e.Resource)
	}
	b.WriteString(": " + e.Class.String())
	if e.Code != "" {
		fmt.Fprintf(&b, " (%d %s)", e.StatusCode, e.Code)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.RequestID != "" {
		b.WriteString(" [request " + e.RequestID + "]")
	}
	return b.String()
}

// Unwrap exposes the class sentinel and, when canceled, the context error.
func (e *Error) Unwrap() []error {
	out := []error{classErr(e.Class)}
	if e.cause != nil {
		out = append(out, e.cause)
	}
	return out
}

// ClassOf returns the class of err; ClassUnknown for nil or foreign errors.
func ClassOf(err error) Class {
	var e *Error
	if errors.As(err, &e) {
		return e.Class
	}
	return ClassUnknown
}

// codeClasses maps BCE error codes to classes. Matching the code exactly
// comes first, so a message that happens to mention another code cannot
// misclassify a call (the upstream only matched substrings of the whole text).
var codeClasses = map[string]Class{
	"privateipnotexistexception":          ClassPrivateIPNotFound,
	"eniidexception":                      ClassENINotFound,
	"subnethasnomoreipexception":          ClassSubnetHasNoMoreIP,
	"ratelimit":                           ClassRateLimit,
	"ratelimitexceeded":                   ClassRateLimit,
	"vmmemorycannotattachmoreipexception": ClassVMMemoryCannotAttachMoreIP,
	"exceedlimitexception":                ClassVMMemoryCannotAttachMoreIP, // BBC's per-ENI cap
	"privateipinuseexception":             ClassPrivateIPInUse,
	"quotalimitexceeded":                  ClassQuotaExceeded,
	"nosuchobject":                        ClassNotFound,
	"invalidaccesskeyid":                  ClassAuth,
	"signaturedoesnotmatch":               ClassAuth,
	"accessdenied":                        ClassAuth,
	"invalidhttpauthheader":               ClassAuth,
	"requestexpired":                      ClassAuth,
}

// substringRules is the fallback for codes we do not know, in the
// upstream's order (first match wins). The upstream's broad rules ("is
// invalid", "BadRequest") are left out: they misclassify unrelated errors.
var substringRules = []struct {
	needle string
	class  Class
}{
	{"privateipnotexistexception", ClassPrivateIPNotFound},
	{"eniidexception", ClassENINotFound},
	{"subnethasnomoreipexception", ClassSubnetHasNoMoreIP},
	{"ratelimit", ClassRateLimit},
	{"nosuchobject", ClassNotFound},
	{"vmmemorycannotattachmoreipexception", ClassVMMemoryCannotAttachMoreIP},
	{"exceedlimitexception", ClassVMMemoryCannotAttachMoreIP},
	{"privateipinuseexception", ClassPrivateIPInUse},
	{"quotalimitexceeded", ClassQuotaExceeded},
}

// classifyService classifies a BCE answer by code, then status, then text.
func classifyService(code, message string, status int) Class {
	if c, ok := codeClasses[strings.ToLower(code)]; ok {
		return c
	}
	if status == http.StatusTooManyRequests {
		return ClassRateLimit
	}
	text := strings.ToLower(code + " " + message)
	for _, r := range substringRules {
		if strings.Contains(text, r.needle) {
			return r.class
		}
	}
	switch {
	case status >= 500:
		return ClassServer
	case status >= 400:
		return ClassInvalidRequest
	}
	return ClassUnknown
}

// classify turns whatever the SDK returned into an *Error. ctx is the call's
// context: a failure after it ended is a cancellation, whatever the SDK says.
func classify(ctx context.Context, op, resource string, err error) *Error {
	e := &Error{Op: op, Resource: resource}
	var se *bce.BceServiceError
	var ce *bce.BceClientError
	switch {
	case ctx.Err() != nil:
		e.Class, e.cause, e.Message = ClassCanceled, ctx.Err(), ctx.Err().Error()
	case errors.As(err, &se):
		e.Code, e.StatusCode, e.RequestID, e.Message = se.Code, se.StatusCode, se.RequestId, se.Message
		e.Class = classifyService(se.Code, se.Message, se.StatusCode)
	case errors.As(err, &ce):
		e.Class, e.Message = ClassTransport, ce.Message
	default:
		// The SDK's own argument checks and body decoding failures.
		e.Class, e.Message = ClassUnknown, err.Error()
	}
	return e
}

func invalid(op, resource, format string, args ...any) *Error {
	return &Error{Op: op, Resource: resource, Class: ClassInvalidRequest, Message: fmt.Sprintf(format, args...)}
}
