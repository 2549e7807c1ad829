package bcesim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"time"
)

// The admin API is plain JSON without authentication: it is for the local
// operator, tests and benchmarks, never for the IPAM. Every endpoint has a Go
// method of the same meaning for in-process use.
//
//	GET  /admin/world            WorldDump
//	GET  /admin/check            {"ok":true} or 500 {"error":...}
//	POST /admin/subnets          SubnetSpec        -> {"id":...}
//	POST /admin/instances        InstanceSpec      -> {"id":...}
//	POST /admin/securitygroups   SecurityGroupSpec -> {"id":...}
//	GET  /admin/stats            Stats
//	GET  /admin/gateway          GatewayStats
//	GET|PUT /admin/faults        Faults
//	GET|PUT /admin/ratelimits    map[Op]RateLimit (PUT merges; qps 0 removes a limit)

// AddSubnet creates a subnet.
func (s *Server) AddSubnet(spec SubnetSpec) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.world.AddSubnet(s.cfg.Now(), spec)
}

// AddInstance creates an instance.
func (s *Server) AddInstance(spec InstanceSpec) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.world.AddInstance(s.cfg.Now(), spec)
}

// AddSecurityGroup creates a security group.
func (s *Server) AddSecurityGroup(spec SecurityGroupSpec) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.world.AddSecurityGroup(s.cfg.Now(), spec)
}

// Dump returns the current world.
func (s *Server) Dump() WorldDump {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.world.Dump(s.cfg.Now())
}

// Check verifies the world's invariants (see World.Check).
func (s *Server) Check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.world.Check()
}

// Stats returns the per-operation call counters.
func (s *Server) Stats() Stats { return s.counts.snapshot(s.cfg.Now()) }

// SetFaults replaces the injected faults.
func (s *Server) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return err
	}
	// Copy the map the server decrements so the caller's value stays theirs.
	if f.FailAfterMutation != nil {
		m := make(map[Op]int, len(f.FailAfterMutation))
		for k, v := range f.FailAfterMutation {
			m[k] = v
		}
		f.FailAfterMutation = m
	}
	s.faults.set(f)
	return nil
}

// Faults returns the faults still armed.
func (s *Server) Faults() Faults { return s.faults.get() }

// SetRateLimits merges per-operation limits; QPS 0 removes an operation's limit.
func (s *Server) SetRateLimits(limits map[Op]RateLimit) error {
	for op, rl := range limits {
		if !knownOp(op) {
			return fmt.Errorf("unknown operation %q", op)
		}
		if rl.QPS < 0 || rl.Burst < 0 {
			return fmt.Errorf("rate limit of %s must not be negative", op)
		}
	}
	s.limits.set(limits)
	return nil
}

// RateLimits returns the current limits.
func (s *Server) RateLimits() map[Op]RateLimit { return s.limits.get() }

func knownOp(op Op) bool {
	for _, o := range AllOps {
		if o == op {
			return true
		}
	}
	return false
}

func (s *Server) serveAdmin(w http.ResponseWriter, r *http.Request) {
	a := &adminCall{w: w, r: r, reqID: s.newRequestID(), maxBody: s.cfg.MaxBodyBytes}
	switch r.Method + " " + r.URL.Path {
	case "GET /admin/world":
		a.ok(s.Dump())
	case "GET /admin/check":
		if err := s.Check(); err != nil {
			writeJSON(w, a.reqID, http.StatusInternalServerError, map[string]string{"error": err.Error()})
			return
		}
		a.ok(map[string]bool{"ok": true})
	case "POST /admin/subnets":
		adminCreate(a, s.AddSubnet)
	case "POST /admin/instances":
		adminCreate(a, s.AddInstance)
	case "POST /admin/securitygroups":
		adminCreate(a, s.AddSecurityGroup)
	case "GET /admin/stats":
		a.ok(s.Stats())
	case "GET /admin/gateway":
		a.ok(s.GatewayStats())
	case "GET /admin/faults":
		a.ok(s.Faults())
	case "PUT /admin/faults":
		adminSet(a, s.SetFaults, func() any { return s.Faults() })
	case "GET /admin/ratelimits":
		a.ok(s.RateLimits())
	case "PUT /admin/ratelimits":
		adminSet(a, s.SetRateLimits, func() any { return s.RateLimits() })
	case "GET /admin/ops":
		ops := make([]string, len(AllOps))
		for i, o := range AllOps {
			ops[i] = string(o)
		}
		sort.Strings(ops)
		a.ok(ops)
	default:
		writeError(w, a.reqID, apiErr(http.StatusNotFound, CodeInvalidURI, "no admin endpoint %s %s", r.Method, r.URL.Path))
	}
}

// adminCall is one request to the admin API.
type adminCall struct {
	w       http.ResponseWriter
	r       *http.Request
	reqID   string
	maxBody int64
}

func (a *adminCall) ok(v any) { writeJSON(a.w, a.reqID, http.StatusOK, v) }

// fail answers an error: an APIError as it is, anything else as a bad
// parameter.
func (a *adminCall) fail(err error) {
	var ae *APIError
	if !errors.As(err, &ae) {
		ae = errBadParam("%v", err)
	}
	writeError(a.w, a.reqID, ae)
}

// decode reads the JSON body into v, or answers MalformedJSON and reports
// false.
func (a *adminCall) decode(v any) bool {
	body, err := io.ReadAll(io.LimitReader(a.r.Body, a.maxBody))
	if err == nil {
		err = json.Unmarshal(body, v)
	}
	if err != nil {
		writeError(a.w, a.reqID, apiErr(http.StatusBadRequest, CodeMalformedJSON, "admin body: %v", err))
		return false
	}
	return true
}

// adminCreate decodes a spec, adds it to the world and answers its ID.
func adminCreate[T any](a *adminCall, add func(T) (string, error)) {
	var spec T
	if !a.decode(&spec) {
		return
	}
	id, err := add(spec)
	if err != nil {
		a.fail(err)
		return
	}
	a.ok(map[string]string{"id": id})
}

// adminSet decodes a setting, applies it and answers the setting now in
// force.
func adminSet[T any](a *adminCall, set func(T) error, current func() any) {
	var v T
	if !a.decode(&v) {
		return
	}
	if err := set(v); err != nil {
		a.fail(err)
		return
	}
	a.ok(current())
}

// SetAttachDelay changes how long an ENI attached from now on stays
// "attaching" (WorldConfig.AttachDelay's bounds apply), so one test or bench
// run can compare attach latencies against one world.
func (s *Server) SetAttachDelay(d time.Duration) error {
	if d < 0 || d >= 50*time.Second {
		return fmt.Errorf("attach delay %s: must be in [0,50s)", d)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.world.cfg.AttachDelay = d
	return nil
}
