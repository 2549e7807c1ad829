package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/cce-ipam/sharded/cloud"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	ccelisters "github.com/cce-ipam/sharded/ipamcore/generated/listers/cce/v1alpha1"
)

// world is what a test Server's listers hold.
type world struct {
	psts    []*cce.PodSubnetTopologySpread
	subnets []*cce.Subnet
	pools   []*cce.IPPool
	cloud   *fakeCloud
}

// newTestServer is a Server over listers of w, with no clients: enough for
// the reviews that only read caches (pods, the PSTS checks).
func newTestServer(t testing.TB, w world) *Server {
	t.Helper()
	index := func(objs ...any) cache.Indexer {
		i := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
		for _, o := range objs {
			if err := i.Add(o); err != nil {
				t.Fatal(err)
			}
		}
		return i
	}
	var ps, ss []any
	for _, p := range w.psts {
		ps = append(ps, p)
	}
	for _, s := range w.subnets {
		ss = append(ss, s)
	}
	cfg := DefaultConfig()
	cfg.Enabled, cfg.Namespace = true, "kube-system"
	s := &Server{cfg: cfg, log: slog.New(slog.DiscardHandler), metrics: newMetrics(nil),
		pstsLister:   ccelisters.NewPodSubnetTopologySpreadLister(index(ps...)),
		subnetLister: ccelisters.NewSubnetLister(index(ss...)),
	}
	s.listPools = func(context.Context) ([]*cce.IPPool, error) { return slices.Clone(w.pools), nil }
	if w.cloud != nil {
		s.cloud = w.cloud
	}
	return s
}

func subnetCR(id, zone string, exclusive, enabled, noMoreIP bool) *cce.Subnet {
	return &cce.Subnet{
		ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: cce.SubnetNamespace},
		Spec:       cce.SubnetSpec{ID: id, AvailabilityZone: zone, CIDR: "10.9.0.0/24", Exclusive: exclusive},
		Status:     cce.SubnetStatus{Enable: enabled, HasNoMoreIP: noMoreIP, AvailableIPNum: 100},
	}
}

func pstsObj(ns, name string, priority int32, match map[string]string, subnets map[string]cce.SubnetAllocation) *cce.PodSubnetTopologySpread {
	return &cce.PodSubnetTopologySpread{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: cce.PodSubnetTopologySpreadSpec{
			Subnets:  subnets,
			Selector: &metav1.LabelSelector{MatchLabels: match},
			Priority: priority,
		},
	}
}

// fakeCloud answers DescribeSubnet from a map; other methods are not
// called by the webhooks (the nil embedded Provider panics if they are).
type fakeCloud struct {
	cloud.Provider
	subnets map[string]cloud.Subnet
	err     error // returned for every call when set
}

func (f *fakeCloud) DescribeSubnet(_ context.Context, id string) (*cloud.Subnet, error) {
	if f.err != nil {
		return nil, f.err
	}
	if sn, ok := f.subnets[id]; ok {
		return &sn, nil
	}
	return nil, &cloud.Error{Op: "DescribeSubnet", Resource: id, Class: cloud.ClassNotFound, Code: "NoSuchObject"}
}

// applyPatch applies a JSON Patch of "add" and "test" operations (all the
// webhooks write) to doc, as the API server would.
func applyPatch(doc, patch []byte) ([]byte, error) {
	var root any
	if err := json.Unmarshal(doc, &root); err != nil {
		return nil, err
	}
	var ops []struct {
		Op    string          `json:"op"`
		Path  string          `json:"path"`
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(patch, &ops); err != nil {
		return nil, err
	}
	for _, op := range ops {
		var v any
		if err := json.Unmarshal(op.Value, &v); err != nil {
			return nil, fmt.Errorf("%s %s: value: %w", op.Op, op.Path, err)
		}
		var err error
		switch op.Op {
		case "add":
			root, err = addAt(root, pointer(op.Path), v)
		case "test":
			var got any
			got, err = getAt(root, pointer(op.Path))
			if err == nil && fmt.Sprint(got) != fmt.Sprint(v) {
				err = fmt.Errorf("test %s: %v is not %v", op.Path, got, v)
			}
		default:
			err = fmt.Errorf("unsupported op %q", op.Op)
		}
		if err != nil {
			return nil, err
		}
	}
	return json.Marshal(root)
}

func pointer(p string) []string {
	if p == "" {
		return nil
	}
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for i, s := range parts {
		parts[i] = strings.NewReplacer("~1", "/", "~0", "~").Replace(s)
	}
	return parts
}

func getAt(node any, path []string) (any, error) {
	for _, tok := range path {
		switch n := node.(type) {
		case map[string]any:
			v, ok := n[tok]
			if !ok {
				return nil, fmt.Errorf("no member %q", tok)
			}
			node = v
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(n) {
				return nil, fmt.Errorf("bad index %q", tok)
			}
			node = n[i]
		default:
			return nil, fmt.Errorf("%q: parent is not a container", tok)
		}
	}
	return node, nil
}

// addAt is RFC 6902 add: the parent must exist; a member is set (replaced),
// an array element inserted ("-" appends).
func addAt(root any, path []string, v any) (any, error) {
	if len(path) == 0 {
		return v, nil
	}
	parent, err := getAt(root, path[:len(path)-1])
	if err != nil {
		return nil, err
	}
	last := path[len(path)-1]
	switch p := parent.(type) {
	case map[string]any:
		p[last] = v
		return root, nil
	case []any:
		i := len(p)
		if last != "-" {
			if i, err = strconv.Atoi(last); err != nil || i < 0 || i > len(p) {
				return nil, fmt.Errorf("bad index %q", last)
			}
		}
		grown := append(p[:i:i], append([]any{v}, p[i:]...)...)
		return addAt(root, path[:len(path)-1], grown)
	}
	return nil, errors.New("add: parent is not a container")
}
