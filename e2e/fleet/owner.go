package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cce-ipam/sharded/e2e/invariants"
	"github.com/cce-ipam/sharded/shard"
)

// NodeStatus asks the running replicas, in index order until one answers,
// for /shard/node?name=node: the node's holder and, passed on to the holder,
// its pool.
func (f *Fleet) NodeStatus(ctx context.Context, node string) (shard.NodeStatus, error) {
	var errs []error
	for _, r := range f.Live() {
		if !r.Running() {
			continue
		}
		ns, err := r.NodeStatus(ctx, node)
		if err == nil {
			return ns, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return shard.NodeStatus{}, errors.New("fleet: no replica is running")
	}
	return shard.NodeStatus{}, errors.Join(errs...)
}

// NodeStatus asks this replica for /shard/node?name=node.
func (r *Replica) NodeStatus(ctx context.Context, node string) (shard.NodeStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		"http://"+r.metricsAddr+"/shard/node?name="+url.QueryEscape(node), nil)
	if err != nil {
		return shard.NodeStatus{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return shard.NodeStatus{}, fmt.Errorf("replica %d: %w", r.index, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return shard.NodeStatus{}, fmt.Errorf("replica %d: %w", r.index, err)
	}
	if resp.StatusCode != http.StatusOK {
		return shard.NodeStatus{}, fmt.Errorf("replica %d: /shard/node: %s", r.index, resp.Status)
	}
	var ns shard.NodeStatus
	if err := json.Unmarshal(body, &ns); err != nil {
		return shard.NodeStatus{}, fmt.Errorf("replica %d: /shard/node: %w", r.index, err)
	}
	return ns, nil
}

var leadingDigits = regexp.MustCompile(`^[0-9]+`)

// NodeOwner returns the index of the replica holding node (-1 and an error
// when nobody holds it or no replica answers). Member names start with
// <name>-r<index> (--memberlist-name-prefix).
func (f *Fleet) NodeOwner(ctx context.Context, node string) (int, error) {
	ns, err := f.NodeStatus(ctx, node)
	if err != nil {
		return -1, err
	}
	return f.holderIndex(ns.Holder)
}

func (f *Fleet) holderIndex(holder string) (int, error) {
	rest, ok := strings.CutPrefix(holder, f.opts.Name+"-r")
	if d := leadingDigits.FindString(rest); ok && d != "" {
		return strconv.Atoi(d)
	}
	return -1, fmt.Errorf("fleet: holder %q is no replica of fleet %s", holder, f.opts.Name)
}

// NodePool returns the counts the node's owner keeps for it (its datastore),
// for the invariant checker's (f) check. An answer not from the owner
// (the node not served, or the hop to its holder failed) is an error.
func (f *Fleet) NodePool(ctx context.Context, node string) (invariants.PoolCounts, error) {
	ns, err := f.NodeStatus(ctx, node)
	if err != nil {
		return invariants.PoolCounts{}, err
	}
	if !ns.Served || ns.Pool == nil || ns.Error != "" {
		return invariants.PoolCounts{}, fmt.Errorf("fleet: node %s: no pool from its owner (holder %q, served %v): %s",
			node, ns.Holder, ns.Served, ns.Error)
	}
	data, err := json.Marshal(ns.Pool)
	if err != nil {
		return invariants.PoolCounts{}, err
	}
	var pc invariants.PoolCounts
	return pc, json.Unmarshal(data, &pc)
}
