package bcesim

import (
	"crypto/subtle"
	"net/http"
	"strings"
	"sync"
)

// GatewayConfig turns on the CCE gateway mode: the simulator also plays the
// gateway in front of BCE that CCE clusters authenticate to with a token
// (cloud/gateway.go is the client side).
type GatewayConfig struct {
	// Tokens are the accepted cce-token values. Empty: gateway mode off.
	Tokens []string
	// RemoteHosts are the BCE hosts the gateway forwards to (this
	// simulator): a request whose cce-remote-host (or, without one, its
	// Host) is not listed is refused. Empty: every host is served.
	RemoteHosts []string
}

// Gateway header names (the wire facts of the spec's appendix).
const (
	headerCCEToken      = "cce-token"
	headerCCECluster    = "cce-cluster"
	headerCCERemoteHost = "cce-remote-host"
)

// Codes of the gateway's refusals. AccessDenied is BCE's own code for a
// refused credential; the others are neutral.
const (
	CodeAccessDenied      = "AccessDenied"
	CodeUnknownRemoteHost = "UnknownRemoteHost"
)

// GatewayStats is what the gateway saw: counts by outcome and by cluster
// and remote host, and the gateway headers of the last accepted request
// (token included: this is a simulator), so tests can assert the wire from
// the server's side.
type GatewayStats struct {
	Accepted    int64             `json:"accepted"`
	Refused     int64             `json:"refused"`
	Clusters    map[string]int64  `json:"clusters"`
	RemoteHosts map[string]int64  `json:"remoteHosts"`
	LastHeaders map[string]string `json:"lastHeaders"`
	// Reasons counts refusals by error code.
	Reasons map[string]int64 `json:"reasons"`
}

// gatewayState is the gateway mode's configuration and record.
type gatewayState struct {
	tokens [][]byte
	hosts  map[string]bool

	mu    sync.Mutex
	stats GatewayStats
}

func newGatewayState(cfg GatewayConfig) *gatewayState {
	g := &gatewayState{stats: GatewayStats{Clusters: map[string]int64{}, RemoteHosts: map[string]int64{},
		Reasons: map[string]int64{}}}
	for _, t := range cfg.Tokens {
		g.tokens = append(g.tokens, []byte(t))
	}
	if len(cfg.RemoteHosts) > 0 {
		g.hosts = map[string]bool{}
		for _, h := range cfg.RemoteHosts {
			g.hosts[strings.ToLower(h)] = true
		}
	}
	return g
}

func (g *gatewayState) enabled() bool { return g != nil && len(g.tokens) > 0 }

// isGatewayRequest: a request with a cce-token header, or without a
// bce-auth-v1 Authorization while gateway mode is on, is the gateway's.
func (g *gatewayState) isGatewayRequest(r *http.Request) bool {
	if _, ok := r.Header[http.CanonicalHeaderKey(headerCCEToken)]; ok {
		return true
	}
	return g.enabled() && r.Header.Get("Authorization") == ""
}

// verify authenticates a gateway request and records it. It returns the
// principal (for idempotency keys) or the refusal.
func (g *gatewayState) verify(r *http.Request) (string, *APIError) {
	aerr := g.check(r)
	remote := r.Header.Get(headerCCERemoteHost)
	if remote == "" {
		remote = r.Host
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if aerr != nil {
		g.stats.Refused++
		g.stats.Reasons[aerr.Code]++
		return "", aerr
	}
	cluster := r.Header.Get(headerCCECluster)
	g.stats.Accepted++
	g.stats.Clusters[cluster]++
	g.stats.RemoteHosts[remote]++
	g.stats.LastHeaders = map[string]string{}
	for _, h := range []string{headerCCEToken, headerCCECluster, headerCCERemoteHost, "Content-Type", "X-Bce-Request-Id",
		"Authorization"} {
		if v := r.Header.Get(h); v != "" {
			g.stats.LastHeaders[strings.ToLower(h)] = v
		}
	}
	g.stats.LastHeaders["host"] = r.Host
	return "gateway:" + cluster, nil
}

func (g *gatewayState) check(r *http.Request) *APIError {
	if !g.enabled() {
		return apiErr(http.StatusUnauthorized, CodeAccessDenied, "this endpoint is not a CCE gateway: sign the request with bce-auth-v1")
	}
	tok := r.Header.Get(headerCCEToken)
	if tok == "" {
		return apiErr(http.StatusUnauthorized, CodeAccessDenied, "gateway request without a cce-token header")
	}
	ok := false
	for _, t := range g.tokens {
		ok = ok || subtle.ConstantTimeCompare(t, []byte(tok)) == 1
	}
	if !ok {
		return apiErr(http.StatusForbidden, CodeAccessDenied, "the cce-token was refused by the gateway")
	}
	if r.Header.Get(headerCCECluster) == "" {
		return apiErr(http.StatusBadRequest, CodeInvalidParameter, "gateway request without a cce-cluster header")
	}
	if r.Header.Get("Authorization") != "" {
		return apiErr(http.StatusBadRequest, CodeInvalidAuthHeader,
			"gateway request carries an Authorization header: the gateway authenticates the token only")
	}
	remote := r.Header.Get(headerCCERemoteHost)
	if remote == "" {
		remote = r.Host
	}
	if g.hosts != nil && !g.hosts[strings.ToLower(remote)] {
		return apiErr(http.StatusNotFound, CodeUnknownRemoteHost, "the gateway does not forward to %q", remote)
	}
	return nil
}

// snapshot copies the stats.
func (g *gatewayState) snapshot() GatewayStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := GatewayStats{Accepted: g.stats.Accepted, Refused: g.stats.Refused, Clusters: map[string]int64{},
		RemoteHosts: map[string]int64{}, Reasons: map[string]int64{}, LastHeaders: map[string]string{}}
	for k, v := range g.stats.Clusters {
		out.Clusters[k] = v
	}
	for k, v := range g.stats.RemoteHosts {
		out.RemoteHosts[k] = v
	}
	for k, v := range g.stats.Reasons {
		out.Reasons[k] = v
	}
	for k, v := range g.stats.LastHeaders {
		out.LastHeaders[k] = v
	}
	return out
}

// GatewayStats returns what the gateway mode saw.
func (s *Server) GatewayStats() GatewayStats { return s.gateway.snapshot() }
