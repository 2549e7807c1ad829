package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// client talks to one replica's HTTP endpoints (the metrics port). How a
// request reaches the replica is the transport's business: straight to its
// address, or through the API server's service proxy.
type client struct {
	// base is prepended to every path: "http://10.0.0.5:9998" when direct,
	// "https://apiserver/api/v1/namespaces/NS/services/http:SVC:metrics/proxy"
	// through the API server.
	base string
	http *http.Client
	// viaAPIServer: a non-200 answer may be the API server's own refusal
	// (a Status object: no RBAC, no endpoints), not the replica's.
	viaAPIServer bool
}

// newDirectClient reaches the replica at server ("host:port" or a URL).
func newDirectClient(server string) *client {
	if !strings.Contains(server, "://") {
		server = "http://" + server
	}
	return &client{base: strings.TrimSuffix(server, "/"), http: http.DefaultClient}
}

// newProxyClient reaches a replica behind the Service svc in namespace ns
// through the API server's service proxy, on the Service port named
// "metrics". The API server picks one endpoint of the Service per request;
// every replica answers for the whole ring (and passes node queries on to
// the owner), so any one will do. cfg brings the caller's credentials and
// TLS: the HTTP client is client-go's, as kubectl's.
func newProxyClient(cfg *rest.Config, ns, svc string) (*client, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for the API server %s: %w", cfg.Host, err)
	}
	host, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return nil, err
	}
	base := strings.TrimSuffix(host.String(), "/") + proxyPath(ns, svc)
	return &client{base: base, http: hc, viaAPIServer: true}, nil
}

// proxyPath is the service proxy's path for the metrics port of svc: the
// "http:" scheme prefix because the replicas serve plain HTTP there.
func proxyPath(ns, svc string) string {
	return "/api/v1/namespaces/" + url.PathEscape(ns) + "/services/http:" + url.PathEscape(svc) + ":metrics/proxy"
}

// get reads path and decodes the replica's JSON answer into out.
func (c *client) get(ctx context.Context, path string, out any) error {
	return c.do(ctx, http.MethodGet, path, nil, nil, out)
}

// do sends one request; body (nil for none) is sent as JSON, with header
// added. A non-200 answer is an error that carries the replica's text, or
// the API server's reason when it answered itself.
func (c *client) do(ctx context.Context, method, path string, body []byte, header http.Header, out any) error {
	u := c.base + path
	var (
		code int
		data []byte
		err  error
	)
	for attempt := 1; ; attempt++ {
		code, data, err = c.send(ctx, method, u, body, header)
		if err != nil {
			return err
		}
		// The service proxy picks one endpoint at random and does not try
		// another when it cannot reach it: a replica that died (its address
		// stays in the peers Service, which publishes not-ready addresses)
		// fails one request in N. Another try most likely picks a live
		// one; only GETs, which change nothing.
		if !c.viaAPIServer || method != http.MethodGet || attempt == proxyAttempts || !unreachableEndpoint(code, data) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	if code != http.StatusOK {
		if c.viaAPIServer {
			if err := apiServerRefusal(code, data); err != nil {
				return fmt.Errorf("%s %s: %w", method, u, err)
			}
		}
		return fmt.Errorf("%s %s: %d %s: %s", method, u, code, http.StatusText(code), strings.TrimSpace(string(data)))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s: not a replica's answer: %w", u, err)
	}
	return nil
}

// proxyAttempts bounds the tries of a GET through the service proxy whose
// picked endpoint did not answer.
const proxyAttempts = 6

// send makes one HTTP request and reads the answer.
func (c *client) send(ctx context.Context, method, u string, body []byte, header http.Header) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, nil, err
	}
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return resp.StatusCode, data, err
}

// unreachableEndpoint tells whether the API server answered that it could
// not reach the endpoint it picked (not that the Service has none: another
// try would not help then).
func unreachableEndpoint(code int, body []byte) bool {
	if code != http.StatusServiceUnavailable && code != http.StatusBadGateway {
		return false
	}
	var st metav1.Status
	return json.Unmarshal(body, &st) == nil && st.Kind == "Status" && !strings.Contains(st.Message, "no endpoints available")
}

// apiServerRefusal explains an answer the API server gave itself instead of
// passing on the replica's: a Status object. It is nil for anything else (a
// replica's own error text, passed through the proxy unchanged).
func apiServerRefusal(code int, body []byte) error {
	var st metav1.Status
	if json.Unmarshal(body, &st) != nil || st.Kind != "Status" {
		return nil
	}
	switch code {
	case http.StatusUnauthorized:
		return fmt.Errorf("the API server did not accept the credentials of the kubeconfig (401): %s", st.Message)
	case http.StatusForbidden:
		return fmt.Errorf("forbidden by the API server (403): %s; the user needs RBAC get on services/proxy "+
			"(create for commands that POST), with resourceNames naming the proxy path's http:<service>:metrics, "+
			"not the bare Service name", st.Message)
	case http.StatusNotFound:
		return fmt.Errorf("not found (404): %s; check --namespace", st.Message)
	case http.StatusServiceUnavailable:
		// The API server says "no endpoints available" for a Service that
		// does not exist as well as for one without replicas.
		if strings.Contains(st.Message, "no endpoints available") {
			return fmt.Errorf("no replica behind the Service (503): %s; check --namespace and --service "+
				"(the release's <fullname>-peers Service) and that the replicas run", st.Message)
		}
		return fmt.Errorf("the API server cannot reach a replica (503): %s", st.Message)
	}
	return fmt.Errorf("the API server refused (%d): %s", code, st.Message)
}
