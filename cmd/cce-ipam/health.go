package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// Readiness as named checks: /readyz answers with the first that fails,
// /readyz?verbose lists them all (as kube-apiserver does), and the gRPC
// health service (grpc.health.v1) follows the same answer, so that a probe
// or an operator can tell *which* part holds a replica back.

// readyCheck is one named part of readiness.
type readyCheck struct {
	name string
	err  func() error
}

func (r *replica) readyChecks() []readyCheck {
	return []readyCheck{
		{"caches", func() error {
			select {
			case <-r.core.Ready():
				return nil
			default:
				return errors.New("the IPAM's informer caches are not synced")
			}
		}},
		{"ipclaims", func() error {
			if !r.psts.ledger.HasSynced() {
				return errors.New("the IPClaim cache is not synced")
			}
			return nil
		}},
		{"gossip", func() error {
			select {
			case <-r.members.Started():
				return nil
			default:
				return errors.New("gossip has not started")
			}
		}},
		// The lease, the ownership loop and the builds of the owned nodes.
		{"shard", r.coord.Ready},
	}
}

// ready is nil when every check passes, else the first failure, named.
func (r *replica) ready() error {
	for _, c := range r.readyChecks() {
		if err := c.err(); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	return nil
}

// readyz: 200 once every check passes; a replica fenced by its own clock
// says so in the body. ?verbose lists every check.
func (r *replica) readyz(w http.ResponseWriter, req *http.Request) {
	if _, verbose := req.URL.Query()["verbose"]; verbose {
		var b strings.Builder
		failed := false
		for _, c := range r.readyChecks() {
			if err := c.err(); err != nil {
				failed = true
				fmt.Fprintf(&b, "[-]%s failed: %v\n", c.name, err)
			} else {
				fmt.Fprintf(&b, "[+]%s ok\n", c.name)
			}
		}
		if detail := r.coord.FencingPolicy(); detail != "" {
			fmt.Fprintf(&b, "WARNING: %s\n", detail)
		}
		if failed {
			b.WriteString("readyz check failed\n")
			http.Error(w, b.String(), http.StatusServiceUnavailable)
			return
		}
		b.WriteString("readyz check passed\n")
		_, _ = w.Write([]byte(b.String()))
		return
	}
	if err := r.ready(); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	if detail := r.coord.FencingPolicy(); detail != "" {
		_, _ = w.Write([]byte("ok; WARNING: " + detail))
		return
	}
	_, _ = w.Write([]byte("ok"))
}

// Services the gRPC health service reports: the server as a whole ("") and
// the CNI backend.
var healthServices = []string{"", rpc.CNIBackend_ServiceDesc.ServiceName}

// healthPeriod is how often the gRPC health status follows readiness.
const healthPeriod = time.Second

// runHealth keeps the gRPC health service's status equal to readiness until
// ctx ends, then reports NOT_SERVING for good (a draining replica).
func (r *replica) runHealth(ctx context.Context, hs *health.Server) {
	t := time.NewTicker(healthPeriod)
	defer t.Stop()
	for {
		st := healthpb.HealthCheckResponse_SERVING
		if r.ready() != nil {
			st = healthpb.HealthCheckResponse_NOT_SERVING
		}
		for _, s := range healthServices {
			hs.SetServingStatus(s, st)
		}
		select {
		case <-ctx.Done():
			hs.Shutdown()
			return
		case <-t.C:
		}
	}
}
