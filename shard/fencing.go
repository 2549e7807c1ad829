package shard

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

// Fencing enforced by the API server (DESIGN.md, "Fencing in the API
// server"). The wep writes carry the token of the claim
// they are made under (ipam/fencing.go); the fencing ValidatingAdmissionPolicy
// refuses a token that is not the partition's current claim.

// policyState is what the last look for the fencing policy found. The
// policy check writes it; the loop, the claims and /shard/status read it.
type policyState struct {
	mu      sync.Mutex
	present bool   // the fencing policy and its binding exist
	detail  string // why not
	checked bool
}

// get returns whether the policy is present, and why not.
func (s *policyState) get() (present bool, detail string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.present, s.detail
}

// set records a check's answer and returns the previous one.
func (s *policyState) set(detail string) (was bool, wasDetail string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	was, wasDetail = s.present, s.detail
	s.present, s.detail, s.checked = detail == "", detail, true
	return was, wasDetail
}

// describe is the answer for /shard/status and /readyz: "" when the policy
// is present, else why not.
func (s *policyState) describe() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.checked {
		return "not checked yet"
	}
	return s.detail
}

// fenceCatchUpMax bounds how long a takeover waits for the API server's
// fencing policy to refuse the old holder's token before serving anyway.
const fenceCatchUpMax = 10 * time.Second

// awaitFence runs after a claim CAS that replaced old with won. The policy
// reads the claims from the API server's own informer, which may not have
// seen the CAS yet: it would then still accept the old holder's writes (a
// takeover, or our own from before a lapse), and refuse ours. It returns
// once a dry-run write shows the informer has caught up: under the old
// holder's token it is refused, or, when the claim was free, under ours it is
// accepted (the informer delivers in order, so either proves the CAS is
// seen). At most fenceCatchUpMax; nothing to wait for without the policy.
func (c *Coordinator) awaitFence(ctx context.Context, p int, old, won Claim) {
	if present, _ := c.policy.get(); c.fenceProbe == nil || !present {
		return
	}
	// A takeover: the old holder's token must be refused. A free claim: ours
	// must be accepted.
	probed, wantRefused := old, true
	if old.Holder == "" {
		probed, wantRefused = won, false
	}
	tok := ipam.FenceToken{
		Partition: p,
		Holder:    probed.Holder,
		Epoch:     probed.Epoch,
	}
	start := c.clock.Now()
	var lastErr error
	for probes := 1; ; probes++ {
		refused, err := c.fenceProbe(ctx, tok)
		if err == nil && refused == wantRefused {
			took := c.clock.Since(start)
			c.metrics.fenceCatchUp.Observe(took.Seconds())
			if probes > 1 {
				c.log.Info("the API server's fencing policy caught up with the claim", "partition", p, "took", took, "probes", probes)
			}
			return
		}
		lastErr = err
		if c.clock.Since(start) >= fenceCatchUpMax || ctx.Err() != nil {
			c.metrics.fenceCatchUp.Observe(c.clock.Since(start).Seconds())
			c.log.Warn("the API server's fencing policy has not caught up with the claim; serving anyway",
				"partition", p, "probe", tok.String(), "want_refused", wantRefused, "waited", c.clock.Since(start), "err", lastErr)
			return
		}
		select {
		case <-ctx.Done():
		case <-c.clock.After(20 * time.Millisecond):
		}
	}
}

// policyCheckPeriod is how often a replica looks for the fencing policy.
const policyCheckPeriod = time.Minute

// policyLoop checks for the fencing policy and its binding at start and
// then every policyCheckPeriod.
func (c *Coordinator) policyLoop(ctx context.Context) {
	for {
		c.checkPolicy(ctx)
		select {
		case <-ctx.Done():
			return
		case <-c.clock.After(policyCheckPeriod):
		}
	}
}

// checkPolicy GETs the fencing ValidatingAdmissionPolicies and bindings
// (named after cfg.FencingPolicy) and records whether they exist.
func (c *Coordinator) checkPolicy(ctx context.Context) {
	name := c.cfg.FencingPolicy
	detail := ""
	if name == "" {
		detail = "fencing policy disabled (--shard-fencing-policy=\"\")"
	} else {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		// The chart's objects (templates/fencing-policy.yaml): the policies
		// <name>-g<group>, one per group of ipam.FenceGroupSize partitions,
		// and <name>-token, the binding <name>-token and one binding
		// <name>-<p> per partition (the first and last are looked at).
		adm := c.kube.AdmissionregistrationV1()
		var err error
		lastGroup := (c.cfg.Ring.Partitions - 1) / ipam.FenceGroupSize
		for _, n := range []string{name + "-g0", fmt.Sprintf("%s-g%d", name, lastGroup), name + "-token"} {
			if err == nil {
				_, err = adm.ValidatingAdmissionPolicies().Get(ctx, n, metav1.GetOptions{})
			}
		}
		for _, n := range []string{name + "-token", name + "-0", fmt.Sprintf("%s-%d", name, c.cfg.Ring.Partitions-1)} {
			if err == nil {
				_, err = adm.ValidatingAdmissionPolicyBindings().Get(ctx, n, metav1.GetOptions{})
			}
		}
		switch {
		case apierrors.IsNotFound(err):
			detail = fmt.Sprintf("fencing policy %s or one of its bindings is missing: "+
				"the API server does not refuse wep writes of a replica that lost its partition", name)
		case err != nil:
			c.log.Warn("could not read the fencing policy; keeping the last answer", "policy", name, "err", err)
			return
		}
	}
	was, wasDetail := c.policy.set(detail)
	if detail == "" {
		c.metrics.policyPresent.Set(1)
		if !was {
			c.log.Info("fencing policy present: the API server refuses wep writes under a stale claim", "policy", name)
		}
		return
	}
	c.metrics.policyPresent.Set(0)
	if detail != wasDetail || was {
		c.log.Error("NOT FENCED BY THE API SERVER: " + detail)
	}
	c.Kick()
}

// FencingPolicy is what the last check found: "" when the policy and its
// binding exist, else why fencing is only by this replica's clock.
func (c *Coordinator) FencingPolicy() string { return c.policy.describe() }
