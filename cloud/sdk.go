package cloud

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/baidubce/bce-sdk-go/auth"
	"github.com/baidubce/bce-sdk-go/bce"
	"github.com/baidubce/bce-sdk-go/services/bcc"
	"github.com/baidubce/bce-sdk-go/services/eni"
	"github.com/baidubce/bce-sdk-go/services/vpc"
)

// sdkSet is one call's SDK clients.
//
// Why a fresh set per call: bce-sdk-go writes http.Client.Timeout on every
// request, so sharing one http.Client between goroutines is a data race, and
// its RequestBuilder has no context. A per-call BceClient with its own
// http.Client (over one shared Transport, so connections are still pooled)
// fixes both: nothing is shared mutably, and the http.Client's transport
// binds the caller's context to every attempt.
type sdkSet struct {
	eni *eni.Client
	vpc *vpc.Client
	bcc *bcc.Client
	rt  *ctxTransport
}

// newSDKConfig builds the SDK configuration shared (read-only) by all calls.
func newSDKConfig(cfg Config, ak, sk string) (*bce.BceClientConfiguration, error) {
	cred, err := auth.NewBceCredentials(ak, sk)
	if err != nil {
		return nil, err
	}
	return &bce.BceClientConfiguration{
		Endpoint:    cfg.endpoint(),
		Region:      cfg.Region,
		UserAgent:   bce.DEFAULT_USER_AGENT,
		Credentials: cred,
		SignOption: &auth.SignOptions{
			HeadersToSign: auth.DEFAULT_HEADERS_TO_SIGN,
			ExpireSeconds: auth.DEFAULT_EXPIRE_SECONDS,
		},
		// The SDK must not retry on its own: its retries re-sent a failed
		// request up to SDKRetries times on one token of the client-side
		// bucket, so BCE saw several requests per token under a 5xx storm
		// (I5). Client.do retries instead, one token per attempt.
		Retry:                     bce.NewNoRetryPolicy(),
		ConnectionTimeoutInMillis: int(cfg.Timeout.Milliseconds()),
	}, nil
}

func (c *Client) newSDKSet(ctx context.Context, signer auth.Signer) *sdkSet {
	rt := &ctxTransport{base: c.transport, ctx: ctx}
	bc := &bce.BceClient{Config: c.sdkConfig, Signer: signer, HTTPClient: &http.Client{Transport: rt}}
	return &sdkSet{eni: &eni.Client{BceClient: bc}, vpc: &vpc.Client{BceClient: bc}, bcc: &bcc.Client{BceClient: bc}, rt: rt}
}

// signer is the attempt's signer: bce-auth-v1, or the CCE gateway's with
// the current token (tok, to redact). A token that cannot be had fails the
// attempt with ClassAuth, which is not retried.
func (c *Client) signer(ctx context.Context, op, resource string) (_ auth.Signer, tok string, _ *Error) {
	if c.tokens == nil {
		return &auth.BceV1Signer{}, "", nil
	}
	t, err := c.tokens.token(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, "", &Error{Op: op, Resource: resource, Class: ClassCanceled, Message: ctx.Err().Error(), cause: ctx.Err()}
		}
		return nil, "", &Error{Op: op, Resource: resource, Class: ClassAuth, Message: "CCE gateway credentials: " + err.Error()}
	}
	return gatewaySigner{gateway: c.gateway, clusterID: c.cfg.ClusterID, token: t.Token}, t.Token, nil
}

// ctxTransport makes every attempt of one call end when the caller's context
// ends, without losing the deadline the http.Client put on the request.
type ctxTransport struct {
	base http.RoundTripper
	ctx  context.Context

	attempts atomic.Int32 // requests handed to the transport

	mu      sync.Mutex
	cleanup []func()
}

func (t *ctxTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.attempts.Add(1)
	if t.ctx.Done() == nil {
		return t.base.RoundTrip(r)
	}
	ctx, cancel := context.WithCancel(r.Context())
	stop := context.AfterFunc(t.ctx, cancel)
	t.mu.Lock()
	t.cleanup = append(t.cleanup, func() { stop(); cancel() })
	t.mu.Unlock()
	return t.base.RoundTrip(r.WithContext(ctx))
}

// sent reports whether the call handed a request to the transport.
func (t *ctxTransport) sent() bool { return t.attempts.Load() > 0 }

// close releases the per-attempt contexts; call it after the SDK has read
// the response body, i.e. when the SDK call returned.
func (t *ctxTransport) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, f := range t.cleanup {
		f()
	}
	t.cleanup = nil
}

// newClientToken returns a random idempotency token for one logical call.
// Every retry of the call (Client.do) re-sends the same token, so a retry
// after a 5xx cannot apply a mutation twice.
func newClientToken() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func fromSDKENI(e *eni.Eni) ENI {
	out := ENI{ID: e.EniId, Name: e.Name, Description: e.Description, ZoneName: e.ZoneName, InstanceID: e.InstanceId,
		MACAddress: e.MacAddress, VPCID: e.VpcId, SubnetID: e.SubnetId, Status: ENIStatus(e.Status),
		SecurityGroupIDs:           append([]string(nil), e.SecurityGroupIds...),
		EnterpriseSecurityGroupIDs: append([]string(nil), e.EnterpriseSecurityGroupIds...),
		PrivateIPs:                 make([]PrivateIP, 0, len(e.PrivateIpSet))}
	if t, err := time.Parse(time.RFC3339, e.CreatedTime); err == nil {
		out.CreatedTime = t
	}
	for _, ip := range e.PrivateIpSet {
		out.PrivateIPs = append(out.PrivateIPs, PrivateIP{Address: ip.PrivateIpAddress, Primary: ip.Primary, PublicIP: ip.PublicIpAddress})
	}
	return out
}

func fromSDKSubnet(s *vpc.Subnet) Subnet {
	return Subnet{ID: s.SubnetId, Name: s.Name, ZoneName: s.ZoneName, CIDR: s.Cidr, VPCID: s.VPCId,
		SubnetType: string(s.SubnetType), AvailableIP: s.AvailableIp}
}
