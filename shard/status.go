package shard

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"
)

// Status is a replica's view of the cluster, served at /shard/status for
// ipamctl.
type Status struct {
	Self       string         `json:"self"`
	Leader     string         `json:"leader,omitempty"`
	IsLeader   bool           `json:"isLeader"`
	LeaseValid bool           `json:"leaseValid"`
	Ready      string         `json:"ready"` // "ok" or why not
	Budget     Share          `json:"budget"`
	Partitions int            `json:"partitions"`
	Members    []MemberStatus `json:"members"`
	// Unowned counts partitions no live replica holds right now.
	Unowned      int `json:"unownedPartitions"`
	UnownedNodes int `json:"unownedNodes"`
	// FencingPolicy is "ok" when the API server's fencing policy is in
	// place, else why wep writes are fenced by this replica's clock only.
	FencingPolicy string `json:"fencingPolicy"`
	// BalancePending is true on the replica that publishes the partitions'
	// node counts while it has counts to publish (none yet, or the shares
	// drifted): the table, and with it some nodes' owners, is about to
	// change.
	BalancePending bool `json:"balancePending,omitempty"`
}

// MemberStatus is one replica as this one sees it.
type MemberStatus struct {
	Name    string `json:"name"`
	GRPC    string `json:"grpc,omitempty"`
	HTTP    string `json:"http,omitempty"`
	Live    bool   `json:"live"`
	Leaving bool   `json:"leaving,omitempty"`
	// RingPartitions is what the ring wants this member to hold;
	// HeldPartitions what its claims say it holds; Nodes the BCC nodes in the
	// held partitions.
	RingPartitions int `json:"ringPartitions"`
	HeldPartitions int `json:"heldPartitions"`
	Nodes          int `json:"nodes"`
}

// NodeStatus answers "who serves this node, and what is its pool".
type NodeStatus struct {
	Node       string `json:"node"`
	Partition  int    `json:"partition"`
	RingOwner  string `json:"ringOwner,omitempty"`
	Holder     string `json:"holder,omitempty"` // the claim's holder
	Served     bool   `json:"served"`           // served by the replica that answered
	AnsweredBy string `json:"answeredBy"`
	Pool       any    `json:"pool,omitempty"`
	Error      string `json:"error,omitempty"`
}

// Status snapshots this replica's view. leader may be nil.
func (c *Coordinator) Status(leader func() (string, bool)) Status {
	now := c.clock.Now()
	nodes := c.servedNodes()
	s := c.fence.load()
	st := Status{
		Self:           c.self,
		LeaseValid:     now.Before(s.leaseValidUntil),
		Partitions:     c.cfg.Ring.Partitions,
		Ready:          "ok",
		BalancePending: c.balancePending.Load(),
	}
	if s.readyReason != "" {
		st.Ready = s.readyReason
	}
	if leader != nil {
		st.Leader, st.IsLeader = leader()
	}
	st.FencingPolicy = "ok"
	if c.cfg.FencingPolicy == "" {
		st.FencingPolicy = "not checked (--shard-fencing-policy=\"\")"
	} else if detail := c.policy.describe(); detail != "" {
		st.FencingPolicy = detail
	}
	members := c.memberStatus(s)
	holders := make([]string, c.cfg.Ring.Partitions)
	for p, cl := range s.claims {
		if cl.Holder == "" || s.expired(c.self, cl.Holder, now, c.cfg.LeaseDuration) {
			st.Unowned++
			continue
		}
		holders[p] = cl.Holder
		members.get(cl.Holder).HeldPartitions++
	}
	if s.claims == nil {
		st.Unowned = c.cfg.Ring.Partitions
	}
	for _, n := range nodes {
		if h := holders[PartitionOf(c.cfg.Ring.Partitions, n)]; h != "" {
			members.get(h).Nodes++
		} else {
			st.UnownedNodes++
		}
	}
	for _, m := range members {
		st.Members = append(st.Members, *m)
	}
	sort.Slice(st.Members, func(i, j int) bool { return st.Members[i].Name < st.Members[j].Name })
	st.Budget = c.budget.current()
	return st
}

// members collects MemberStatus by name.
type members map[string]*MemberStatus

func (ms members) get(name string) *MemberStatus {
	m, ok := ms[name]
	if !ok {
		m = &MemberStatus{Name: name}
		ms[name] = m
	}
	return m
}

// memberStatus lists this replica, the replicas it has seen and the ring
// members, with their addresses and the partitions the ring gives them.
func (c *Coordinator) memberStatus(s *snapshot) members {
	ms := members{}
	self := ms.get(c.self)
	self.GRPC, self.HTTP, self.Leaving = c.addrs.GRPC, c.addrs.HTTP, s.leaving
	for name, o := range s.peers {
		m := ms.get(name)
		m.GRPC, m.HTTP, m.Leaving = o.grpc, o.http, o.leaving
	}
	for _, name := range s.live {
		ms.get(name).Live = true
	}
	for _, owner := range s.owners {
		ms.get(owner).RingPartitions++
	}
	return ms
}

// nodeStatus is this replica's answer about one node.
func (c *Coordinator) nodeStatus(node string) NodeStatus {
	rt := c.fence.RouteOf(node)
	ns := NodeStatus{
		Node:       node,
		Partition:  rt.Partition,
		AnsweredBy: c.self,
		Served:     rt.Local,
	}
	if s := c.fence.load(); s.owners != nil {
		ns.RingOwner = s.owners[rt.Partition]
	}
	switch {
	case rt.Local:
		ns.Holder = c.self
	case rt.Owner != "":
		ns.Holder = rt.Owner
	}
	return ns
}

// StatusHandler serves /shard/status and /shard/node?name=N. A node query
// reaching a replica that does not serve the node is passed on, once, to the
// holder's HTTP address, so ipamctl can ask any replica.
func (c *Coordinator) StatusHandler(leader func() (string, bool), pool func(node string) (any, error)) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/shard/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, c.Status(leader))
	})
	mux.HandleFunc("/shard/node", func(w http.ResponseWriter, r *http.Request) {
		node := r.URL.Query().Get("name")
		if node == "" {
			http.Error(w, "name is required", http.StatusBadRequest)
			return
		}
		ns := c.nodeStatus(node)
		if ns.Served {
			p, err := pool(node)
			if err != nil {
				ns.Error = err.Error()
			}
			ns.Pool = p
			writeJSON(w, ns)
			return
		}
		if ns.Holder != "" && r.URL.Query().Get("hop") == "" {
			if addr := c.httpAddrOf(ns.Holder); addr != "" {
				if out, err := fetchNode(r.Context(), addr, node); err == nil {
					writeJSON(w, out)
					return
				} else {
					ns.Error = "asking the holder failed: " + err.Error()
				}
			}
		}
		writeJSON(w, ns)
	})
	return mux
}

func (c *Coordinator) httpAddrOf(member string) string {
	if member == c.self {
		return c.addrs.HTTP
	}
	return c.fence.load().peers[member].http
}

func fetchNode(ctx context.Context, addr, node string) (NodeStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	u := "http://" + addr + "/shard/node?hop=1&name=" + url.QueryEscape(node)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return NodeStatus{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return NodeStatus{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return NodeStatus{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return NodeStatus{}, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	var out NodeStatus
	return out, json.Unmarshal(body, &out)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
