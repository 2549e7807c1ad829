package bench

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/cce-ipam/sharded/e2e/fleet"
)

// Item 8 counts API requests where they land: the kube-apiserver's own
// apiserver_request_total, summed by verb and resource. Counting at the
// server, not in a client RoundTripper, takes in every request a replica
// makes (informers, leases, retries), whichever client made it.

// reqKey groups apiserver_request_total's series: the verb as the server
// reports it (GET, LIST, POST, PUT, PATCH, DELETE, WATCH, APPLY) and the
// resource, with "/subresource" when there is one.
type reqKey struct {
	verb, resource string
}

func (k reqKey) String() string { return strings.ToLower(k.verb) + " " + k.resource }

// reqCounts is a scrape of apiserver_request_total by verb and resource.
type reqCounts map[reqKey]float64

// parseRequestCounts reads the Prometheus text format and sums
// apiserver_request_total by verb and resource (over codes, groups,
// versions, scopes and components). Text without that metric gives an
// empty map; text that is not the format gives an error.
func parseRequestCounts(r io.Reader) (reqCounts, error) {
	ss, err := fleet.ParseText(r)
	if err != nil {
		return nil, err
	}
	out := reqCounts{}
	for _, s := range ss {
		if s.Name != "apiserver_request_total" {
			continue
		}
		if math.IsNaN(s.Value) || math.IsInf(s.Value, 0) {
			return nil, fmt.Errorf("apiserver_request_total%v: value %v is not a count", s.Labels, s.Value)
		}
		res := s.Labels["resource"]
		if sub := s.Labels["subresource"]; sub != "" {
			res += "/" + sub
		}
		out[reqKey{verb: s.Labels["verb"], resource: res}] += s.Value
	}
	return out, nil
}

// minus returns c - before per key (keys of either).
func (c reqCounts) minus(before reqCounts) reqCounts {
	out := reqCounts{}
	for k, v := range c {
		out[k] = v - before[k]
	}
	for k, v := range before {
		if _, ok := c[k]; !ok {
			out[k] = -v
		}
	}
	return out
}

// scaled returns c × f.
func (c reqCounts) scaled(f float64) reqCounts {
	out := reqCounts{}
	for k, v := range c {
		out[k] = v * f
	}
	return out
}

// total sums the counts of keys for which keep is true.
func (c reqCounts) total(keep func(reqKey) bool) float64 {
	var sum float64
	for k, v := range c {
		if keep(k) {
			sum += v
		}
	}
	return sum
}

// keys returns the keys sorted by resource, then verb.
func (c reqCounts) keys() []reqKey {
	ks := make([]reqKey, 0, len(c))
	for k := range c {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b reqKey) int {
		return cmp.Or(strings.Compare(a.resource, b.resource), strings.Compare(a.verb, b.verb))
	})
	return ks
}

// isWrite reports whether the verb changes state.
func (k reqKey) isWrite() bool {
	switch k.verb {
	case "POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY", "CREATE", "UPDATE":
		return true
	}
	return false
}

// scrapeAPIServer reads the kube-apiserver's /metrics as the admin.
func (e *env) scrapeAPIServer(ctx context.Context) (reqCounts, error) {
	raw, err := e.kube.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("scrape kube-apiserver /metrics: %w", err)
	}
	return parseRequestCounts(bytes.NewReader(raw))
}
