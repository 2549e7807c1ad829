package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
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
	var ns shard.NodeStatus
	return ns, r.getJSON(ctx, "/shard/node?name="+url.QueryEscape(node), &ns)
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

// WaitNodeOwner is NodeOwner once the node has one: it asks again every
// 200 ms while the node is between owners (a hand-over, a replica that just
// resumed), up to timeout, and returns the last error after it.
func (f *Fleet) WaitNodeOwner(ctx context.Context, node string, timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		idx, err := f.NodeOwner(ctx, node)
		if err == nil {
			return idx, nil
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("node %s has no owner after %s: %w", node, timeout, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
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

// ShardStatus reads this replica's /shard/status: its member name (Self),
// the members it sees with their ring and held partitions, and whether
// every node has an owner.
func (r *Replica) ShardStatus(ctx context.Context) (shard.Status, error) {
	var st shard.Status
	return st, r.getJSON(ctx, "/shard/status", &st)
}

// getJSON decodes the answer to GET path on the replica's metrics address.
func (r *Replica) getJSON(ctx context.Context, path string, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.metricsAddr+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("replica %d: %w", r.index, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("replica %d: %w", r.index, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("replica %d: %s: %s", r.index, path, resp.Status)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("replica %d: %s: %w", r.index, path, err)
	}
	return nil
}

// Running returns the replicas not removed whose process runs (a
// SIGSTOPped one does).
func (f *Fleet) Running() []*Replica {
	var out []*Replica
	for _, r := range f.Live() {
		if r.Running() {
			out = append(out, r)
		}
	}
	return out
}

// Settle waits until the running replicas agree on who serves what, and
// returns each node's holder (member name). Settled means: every running
// replica is ready, sees exactly the running replicas as live members and
// no node without an owner, and sees every live member hold the partitions
// the ring gives it (a join is settled only once its hand-overs are done);
// and the routes the first running replica gives for the fleet's nodes
// name a holder for every node and are the same on two looks in a row (a
// node whose new holder is still rebuilding it has no route yet). It polls
// every 200ms until ctx ends.
func (f *Fleet) Settle(ctx context.Context) (map[string]string, error) {
	var prev map[string]string // the routes as of the last settled look
	var last error
	for {
		running := f.Running()
		err := agreed(ctx, running)
		var routes map[string]string
		if err == nil {
			routes, err = running[0].routes(ctx, f.Nodes())
		}
		switch {
		case err != nil:
			prev, last = nil, err
		case prev != nil && maps.Equal(prev, routes):
			return routes, nil
		default:
			prev, last = routes, errors.New("the routes were complete on one look only")
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("fleet: replicas did not settle: %w; last: %w", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// agreed checks the membership part of Settle on the running replicas.
func agreed(ctx context.Context, running []*Replica) error {
	if len(running) == 0 {
		return errors.New("no replica is running")
	}
	for _, r := range running {
		st, err := r.ShardStatus(ctx)
		switch {
		case err != nil:
			return err
		case !r.Ready():
			return fmt.Errorf("replica %d not ready: %s", r.index, st.Ready)
		case st.UnownedNodes != 0:
			return fmt.Errorf("replica %d sees %d nodes without an owner", r.index, st.UnownedNodes)
		case st.BalancePending:
			return fmt.Errorf("replica %d has node counts to publish: the table is about to change", r.index)
		}
		liveMembers := 0
		for _, m := range st.Members {
			if m.Live {
				liveMembers++
			}
		}
		if liveMembers != len(running) {
			return fmt.Errorf("replica %d sees %d live members, want %d: %+v", r.index, liveMembers, len(running), st.Members)
		}
		for _, m := range st.Members {
			if m.Live && m.HeldPartitions != m.RingPartitions {
				return fmt.Errorf("replica %d: %s holds %d partitions, the ring gives it %d", r.index, m.Name,
					m.HeldPartitions, m.RingPartitions)
			}
		}
	}
	return nil
}

// routes asks this replica for the holder of every node; a node without
// one is an error.
func (r *Replica) routes(ctx context.Context, nodes []string) (map[string]string, error) {
	out := make(map[string]string, len(nodes))
	for _, n := range nodes {
		ns, err := r.NodeStatus(ctx, n)
		if err != nil {
			return nil, err
		}
		if ns.Holder == "" {
			return nil, fmt.Errorf("node %s has no route yet", n)
		}
		out[n] = ns.Holder
	}
	return out, nil
}
