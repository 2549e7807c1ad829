package shard

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
	"github.com/spf13/pflag"
)

// RingConfig shapes the consistent-hash ring. Every replica of a cluster
// must use the same values. RegisterFlags sets the defaults; DefaultRingConfig
// returns them.
type RingConfig struct {
	// Partitions is the number of partitions nodes hash into; a prime
	// spreads keys evenly. Default 271 (--shard-partitions). Changing it
	// moves most nodes.
	Partitions int
	// ReplicationFactor is the number of virtual points per member.
	// Default 200; not a flag.
	ReplicationFactor int
	// Load bounds a member's share at Load × the average (bounded-load
	// consistent hashing); must be above 1. Default 1.05; not a flag.
	Load float64
	// NodeLoad bounds a member's share of the nodes (see Ring.Balanced) at
	// NodeLoad × the mean, and from below at the mean / NodeLoad; must be
	// above 1. Default 1.05; not a flag.
	NodeLoad float64
}

// RegisterFlags binds Partitions to --shard-partitions and sets the other
// fields, which are not flags, to their defaults. A tight bound and many
// virtual points keep the replicas' shares of nodes even, at the price of a
// few more partitions moved by a join or a leave (DESIGN.md, "Ring
// parameters").
func (c *RingConfig) RegisterFlags(fs *pflag.FlagSet) {
	fs.IntVar(&c.Partitions, "shard-partitions", 271, "partitions the nodes hash into (a prime; the same on every replica)")
	c.ReplicationFactor = 200
	c.Load = 1.05
	c.NodeLoad = 1.05
}

// DefaultRingConfig is the ring of a cce-ipam started without flags.
func DefaultRingConfig() RingConfig {
	var c RingConfig
	c.RegisterFlags(pflag.NewFlagSet("ring", pflag.ContinueOnError))
	return c
}

// Validate reports a configuration the ring cannot use. consistent panics on
// some of them; we refuse them first.
func (c RingConfig) Validate() error {
	switch {
	case c.Partitions < 1 || !big.NewInt(int64(c.Partitions)).ProbablyPrime(20):
		return fmt.Errorf("ring: partition count %d must be a prime", c.Partitions)
	case c.ReplicationFactor < 1:
		return fmt.Errorf("ring: replication factor %d must be positive", c.ReplicationFactor)
	case c.Load <= 1:
		// consistent rounds the average down: at exactly 1 the bounds
		// add up to fewer than the partitions and it panics.
		return fmt.Errorf("ring: load %.2f must be above 1 or partitions cannot all be placed", c.Load)
	case c.NodeLoad <= 1:
		return fmt.Errorf("ring: node load %.2f must be above 1", c.NodeLoad)
	}
	return nil
}

// ErrNoMembers is returned when a ring is built over no members: then no
// node has an owner and callers must wait rather than guess.
var ErrNoMembers = errors.New("ring: no members")

// Ring maps node names to owners for one member set. It is immutable: build a
// new Ring when the member set changes.
type Ring struct {
	cfg     RingConfig
	hash    *consistent.Consistent
	members []string // sorted
	owners  []string // partition → owner, cached for Table and lookups
}

type member string

func (m member) String() string { return string(m) }

type xxHasher struct{}

func (xxHasher) Sum64(b []byte) uint64 { return xxhash.Sum64(b) }

// NewRing builds the ring over members (unique, non-empty names).
func NewRing(cfg RingConfig, members []string) (*Ring, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(members) == 0 {
		return nil, ErrNoMembers
	}
	sorted := slices.Clone(members)
	slices.Sort(sorted)
	for i, m := range sorted {
		if m == "" {
			return nil, errors.New("ring: empty member name")
		}
		if i > 0 && sorted[i-1] == m {
			return nil, fmt.Errorf("ring: member %q listed twice", m)
		}
	}
	// Members are added in sorted order so that, should two virtual points
	// ever collide, the same member wins on every replica.
	ms := make([]consistent.Member, len(sorted))
	for i, m := range sorted {
		ms[i] = member(m)
	}
	c := consistent.New(ms, consistent.Config{
		Hasher:            xxHasher{},
		PartitionCount:    cfg.Partitions,
		ReplicationFactor: cfg.ReplicationFactor,
		Load:              cfg.Load,
	})
	owners := make([]string, cfg.Partitions)
	for p := range owners {
		owners[p] = c.GetPartitionOwner(p).String()
	}
	return &Ring{
		cfg:     cfg,
		hash:    c,
		members: sorted,
		owners:  owners,
	}, nil
}

// Members returns the sorted member names.
func (r *Ring) Members() []string { return slices.Clone(r.members) }

// Partition returns the partition a node hashes into. It depends only on the
// node name and the partition count, not on the members.
func (r *Ring) Partition(node string) int { return r.hash.FindPartitionID([]byte(node)) }

// Owner returns the member that owns the node's partition.
func (r *Ring) Owner(node string) string { return r.owners[r.Partition(node)] }

// Table returns the ownership of every partition.
func (r *Ring) Table() Table { return Table{Owners: slices.Clone(r.owners)} }

// Table is the owner of every partition, indexed by partition ID.
type Table struct {
	Owners []string
}

// Count returns how many partitions each member owns.
func (t Table) Count() map[string]int {
	n := map[string]int{}
	for _, o := range t.Owners {
		n[o]++
	}
	return n
}

// Move is one partition changing owner. From is empty for a partition that had
// no owner (first table); To is empty when the new table has none.
type Move struct {
	Partition int
	From, To  string
}

// Diff lists the partitions whose owner differs between two tables over the
// same partition count, in partition order.
func Diff(old, next Table) ([]Move, error) {
	if len(old.Owners) != 0 && len(old.Owners) != len(next.Owners) {
		return nil, fmt.Errorf("ring: cannot diff tables of %d and %d partitions", len(old.Owners), len(next.Owners))
	}
	var moves []Move
	for p, to := range next.Owners {
		var from string
		if len(old.Owners) != 0 {
			from = old.Owners[p]
		}
		if from != to {
			moves = append(moves, Move{
				Partition: p,
				From:      from,
				To:        to,
			})
		}
	}
	return moves, nil
}

// Balanced returns the ring's table with partitions moved between members so
// that each serves a near-even share of the nodes. weights[p] is the number
// of nodes in partition p; every replica must pass the same weights to agree
// on the table (the Coordinator passes the published counts, balance.go).
//
// The ring balances partitions, and nodes fall into partitions by hash: with
// 1,000 nodes in 271 partitions the busiest of 3 replicas served up to 38 %
// of them, and 4 replicas over 12 nodes left one with none in ~3 % of member
// sets. Balanced leaves the ring's choice alone while every member's node
// count is within NodeLoad of the mean, and otherwise moves partitions,
// lowest ID first, from the busiest members to the least busy until the
// bounds hold or no move narrows the gap. Empty partitions stay where the
// ring put them.
func (r *Ring) Balanced(weights []int) (Table, error) {
	if len(weights) != len(r.owners) {
		return Table{}, fmt.Errorf("ring: %d partition weights for %d partitions", len(weights), len(r.owners))
	}
	owners := slices.Clone(r.owners)
	idx := make(map[string]int, len(r.members))
	for i, m := range r.members {
		idx[m] = i
	}
	load := make([]int, len(r.members))
	total := 0
	for p, w := range weights {
		if w < 0 {
			return Table{}, fmt.Errorf("ring: partition %d has weight %d", p, w)
		}
		load[idx[owners[p]]] += w
		total += w
	}
	if total == 0 {
		return Table{Owners: owners}, nil
	}
	mean := float64(total) / float64(len(r.members))
	hi := int(math.Ceil(mean * r.cfg.NodeLoad))
	lo := int(math.Floor(mean / r.cfg.NodeLoad))
	// Each move narrows a gap, so the sum of squared loads falls with every
	// one; the cap is a guard, never reached in practice.
	for range len(owners) {
		// Members by load, busiest first; names break ties the same way on
		// every replica.
		order := make([]int, len(r.members))
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int { return load[b] - load[a] })
		least := order[len(order)-1]
		if load[order[0]] <= hi && load[least] >= lo {
			break
		}
		moved := false
		for _, donor := range order[:len(order)-1] {
			gap := load[donor] - load[least]
			for p, w := range weights {
				if w > 0 && w < gap && owners[p] == r.members[donor] {
					owners[p] = r.members[least]
					load[donor] -= w
					load[least] += w
					moved = true
					break
				}
			}
			if moved {
				break
			}
		}
		if !moved {
			break
		}
	}
	return Table{Owners: owners}, nil
}
