package bcesim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
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
	reqID := s.newRequestID()
	bad := func(err error) {
		var ae *APIError
		if !errors.As(err, &ae) {
			ae = errBadParam("%v", err)
		}
		writeError(w, reqID, ae)
	}
	decodeBody := func(v any) bool {
		body, err := io.ReadAll(io.LimitReader(r.Body, s.cfg.MaxBodyBytes))
		if err == nil {
			err = json.Unmarshal(body, v)
		}
		if err != nil {
			writeError(w, reqID, apiErr(http.StatusBadRequest, CodeMalformedJSON, "admin body: %v", err))
			return false
		}
		return true
	}
	created := func(id string, err error) {
		if err != nil {
			bad(err)
			return
		}
		writeJSON(w, reqID, http.StatusOK, map[string]string{"id": id})
	}
	switch r.Method + " " + r.URL.Path {
	case "GET /admin/world":
		writeJSON(w, reqID, http.StatusOK, s.Dump())
	case "GET /admin/check":
		if err := s.Check(); err != nil {
			writeJSON(w, reqID, http.StatusInternalServerError, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, reqID, http.StatusOK, map[string]bool{"ok": true})
	case "POST /admin/subnets":
		var spec SubnetSpec
		if decodeBody(&spec) {
			created(s.AddSubnet(spec))
		}
	case "POST /admin/instances":
		var spec InstanceSpec
		if decodeBody(&spec) {
			created(s.AddInstance(spec))
		}
	case "POST /admin/securitygroups":
		var spec SecurityGroupSpec
		if decodeBody(&spec) {
			created(s.AddSecurityGroup(spec))
		}
	case "GET /admin/stats":
		writeJSON(w, reqID, http.StatusOK, s.Stats())
	case "GET /admin/faults":
		writeJSON(w, reqID, http.StatusOK, s.Faults())
	case "PUT /admin/faults":
		var f Faults
		if decodeBody(&f) {
			if err := s.SetFaults(f); err != nil {
				bad(err)
				return
			}
			writeJSON(w, reqID, http.StatusOK, s.Faults())
		}
	case "GET /admin/ratelimits":
		writeJSON(w, reqID, http.StatusOK, s.RateLimits())
	case "PUT /admin/ratelimits":
		var m map[Op]RateLimit
		if decodeBody(&m) {
			if err := s.SetRateLimits(m); err != nil {
				bad(err)
				return
			}
			writeJSON(w, reqID, http.StatusOK, s.RateLimits())
		}
	case "GET /admin/ops":
		ops := make([]string, len(AllOps))
		for i, o := range AllOps {
			ops[i] = string(o)
		}
		sort.Strings(ops)
		writeJSON(w, reqID, http.StatusOK, ops)
	default:
		writeError(w, reqID, apiErr(http.StatusNotFound, CodeInvalidURI, "no admin endpoint %s %s", r.Method, r.URL.Path))
	}
}
