package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// client talks to one replica's HTTP endpoints (the metrics port). How a
// request reaches the replica is the transport's business: straight to its
// address, or through the API server's service proxy.
type client struct {
	// base is prepended to every path: "http://10.0.0.5:9998" when direct.
	base string
	http *http.Client
}

// newDirectClient reaches the replica at server ("host:port" or a URL).
func newDirectClient(server string) *client {
	if !strings.Contains(server, "://") {
		server = "http://" + server
	}
	return &client{base: strings.TrimSuffix(server, "/"), http: http.DefaultClient}
}

// get reads path and decodes the replica's JSON answer into out.
func (c *client) get(ctx context.Context, path string, out any) error {
	return c.do(ctx, http.MethodGet, path, nil, nil, out)
}

// do sends one request; body (nil for none) is sent as JSON, with header
// added. A non-200 answer is an error that carries the replica's text.
func (c *client) do(ctx context.Context, method, path string, body []byte, header http.Header, out any) error {
	u := c.base + path
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return err
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
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", method, u, resp.Status, strings.TrimSpace(string(data)))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s: not a replica's answer: %w", u, err)
	}
	return nil
}
