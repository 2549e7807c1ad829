package cloud

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/baidubce/bce-sdk-go/bce"
)

func TestClassify_Table(t *testing.T) {
	svc := func(code, msg string, status int) error { return bce.NewBceServiceError(code, msg, "req-1", status) }
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name string
		ctx  context.Context
		err  error
		want Class
		is   error
	}{
		// Rate limit.
		{"RateLimit code", nil, svc("RateLimit", "slow down", 429), ClassRateLimit, ErrRateLimit},
		{"RateLimit code any case", nil, svc("ratelimit", "", 400), ClassRateLimit, ErrRateLimit},
		{"bare 429 TooManyRequests", nil, svc("TooManyRequests", "429 Too Many Requests", 429), ClassRateLimit, ErrRateLimit},
		{"RateLimit only in message", nil, svc("Throttled", "RateLimit exceeded for ENI", 400), ClassRateLimit, ErrRateLimit},
		// Subnet full.
		{"SubnetHasNoMoreIp code", nil, svc("SubnetHasNoMoreIpException", "", 400), ClassSubnetHasNoMoreIP, ErrSubnetHasNoMoreIP},
		{"SubnetHasNoMoreIp in message", nil, svc("Failed", "cause: SubnetHasNoMoreIpException", 400), ClassSubnetHasNoMoreIP, ErrSubnetHasNoMoreIP},
		// Per-ENI memory cap.
		{"VmMemory code", nil, svc("VmMemoryCanNotAttachMoreIpException", "", 400), ClassVMMemoryCannotAttachMoreIP, ErrVMMemoryCannotAttachMoreIP},
		{"BBC ExceedLimit code", nil, svc("ExceedLimitException", "", 400), ClassVMMemoryCannotAttachMoreIP, ErrVMMemoryCannotAttachMoreIP},
		// Address in use.
		{"PrivateIpInUse code", nil, svc("PrivateIpInUseException", "", 400), ClassPrivateIPInUse, ErrPrivateIPInUse},
		{"PrivateIpInUse in message", nil, svc("Conflict", "PrivateIpInUseException: 10.0.0.5", 409), ClassPrivateIPInUse, ErrPrivateIPInUse},
		// Address not on the ENI.
		{"PrivateIPNotExist code", nil, svc("PrivateIPNotExistException", "", 400), ClassPrivateIPNotFound, ErrPrivateIPNotFound},
		// ENI missing.
		{"EniId code", nil, svc("EniIdException", "The param eniId is invalid", 400), ClassENINotFound, ErrENINotFound},
		// Quota.
		{"QuotaLimitExceeded code", nil, svc("QuotaLimitExceeded", "", 400), ClassQuotaExceeded, ErrQuotaExceeded},
		{"QuotaLimitExceeded in message", nil, svc("Forbidden", "QuotaLimitExceeded for vpc", 403), ClassQuotaExceeded, ErrQuotaExceeded},
		// Other not-found.
		{"NoSuchObject code", nil, svc("NoSuchObject", "", 404), ClassNotFound, ErrNotFound},
		// The code decides even when the message names another class.
		{"code beats message", nil, svc("EniIdException", "RateLimit SubnetHasNoMoreIpException", 400), ClassENINotFound, ErrENINotFound},
		{"code beats an earlier substring rule", nil, svc("RateLimit", "while releasing: PrivateIPNotExistException", 400), ClassRateLimit, ErrRateLimit},
		{"quota code, message names an ENI error", nil, svc("QuotaLimitExceeded", "EniIdException eni-1", 400), ClassQuotaExceeded, ErrQuotaExceeded},
		{"code beats 429 status", nil, svc("PrivateIpInUseException", "", 429), ClassPrivateIPInUse, ErrPrivateIPInUse},
		// "is invalid" alone no longer means BBC-IP-not-found (upstream rule 5).
		{"is invalid is not a class", nil, svc("InvalidParameterValue", "the name is invalid", 400), ClassInvalidRequest, ErrInvalidRequest},
		// Auth, generic statuses, transport, cancellation.
		{"signature", nil, svc("SignatureDoesNotMatch", "", 400), ClassAuth, nil},
		{"5xx", nil, svc("InternalError", "boom", 500), ClassServer, nil},
		{"4xx", nil, svc("InvalidParameterValue", "bad", 400), ClassInvalidRequest, ErrInvalidRequest},
		{"transport", nil, bce.NewBceClientError("execute http request failed! dial tcp: refused"), ClassTransport, nil},
		{"canceled context", canceled, bce.NewBceClientError("context canceled"), ClassCanceled, context.Canceled},
		{"foreign error", nil, errors.New("EOF"), ClassUnknown, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			e := classify(ctx, "Op", "eni-1", tc.err)
			if e.Class != tc.want {
				t.Fatalf("class = %v, want %v (%v)", e.Class, tc.want, e)
			}
			if ClassOf(e) != tc.want || ClassOf(fmt.Errorf("wrapped: %w", e)) != tc.want {
				t.Fatalf("ClassOf disagrees")
			}
			if tc.is != nil && !errors.Is(fmt.Errorf("ctx: %w", e), tc.is) {
				t.Fatalf("errors.Is(%v, %v) = false", e, tc.is)
			}
			for _, other := range []error{ErrRateLimit, ErrENINotFound, ErrSubnetHasNoMoreIP} {
				if !errors.Is(other, tc.is) && errors.Is(e, other) {
					t.Fatalf("%v also matches %v", e, other)
				}
			}
			if !strings.HasPrefix(e.Error(), "Op eni-1: "+tc.want.String()) {
				t.Fatalf("Error() = %q", e.Error())
			}
		})
	}
}

func TestClass_StringAndRetryable(t *testing.T) {
	for c := ClassUnknown; c <= ClassCanceled; c++ {
		if s := c.String(); s == "" || strings.HasPrefix(s, "class(") {
			t.Fatalf("class %d has no name", c)
		}
	}
	if Class(99).String() != "class(99)" {
		t.Fatal("out-of-range class name")
	}
	if !ClassRateLimit.Retryable() || ClassSubnetHasNoMoreIP.Retryable() || ClassENINotFound.Retryable() {
		t.Fatal("retryable classes wrong")
	}
}

// FuzzClassifyService checks that any BCE answer classifies without
// panicking, that a known code always decides the class whatever the message
// says, and that an unknown code's 429 is a rate limit.
func FuzzClassifyService(f *testing.F) {
	f.Add("EniIdException", "The param eniId is invalid", 400)
	f.Add("RateLimit", "", 429)
	f.Add("TooManyRequests", "429 Too Many Requests", 429)
	f.Add("", "", 500)
	f.Add("Foo", "PrivateIpInUseException happened", 400)
	f.Add("SUBNETHASNOMOREIPEXCEPTION", "RateLimit", 400)
	f.Fuzz(func(t *testing.T, code, msg string, status int) {
		c := classifyService(code, msg, status)
		if strings.HasPrefix(c.String(), "class(") {
			t.Fatalf("invalid class %d", c)
		}
		if want, ok := codeClasses[strings.ToLower(code)]; ok && c != want {
			t.Fatalf("code %q classified %v, want %v", code, c, want)
		}
		if _, ok := codeClasses[strings.ToLower(code)]; !ok && status == 429 && c != ClassRateLimit {
			t.Fatalf("unknown code %q with 429 classified %v", code, c)
		}
		e := classify(context.Background(), "Op", "", bce.NewBceServiceError(code, msg, "r", status))
		if e.Class != c || e.Error() == "" {
			t.Fatalf("classify disagrees with classifyService")
		}
	})
}
