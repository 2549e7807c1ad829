// Command ipamctl asks any cce-ipam replica about the sharded cluster: its
// members, the leader, the ring (partitions and nodes per replica), the owner
// of a node and that node's pool.
//
//	ipamctl --server http://10.0.0.5:9998 members
//	ipamctl ring
//	ipamctl owner node-10-0-1-7
//	ipamctl node node-10-0-1-7 --output json
//
// It reads the replica's /shard/status and /shard/node endpoints (on the
// metrics port); a node query is passed on to the node's owner.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/cce-ipam/sharded/shard"
)

const usage = `usage: ipamctl [flags] <command> [args]

commands:
  status          the replica's view: self, leader, lease, readiness, budget share
  members         replicas with their addresses, liveness and what each holds
  ring            partitions and nodes per replica (ring wish and held claims)
  owner NODE      the partition and owner of a node
  node NODE       the owner of a node and its pool (asked of the owner)
` + adminUsage + `
flags:
`

func main() {
	fs := pflag.NewFlagSet("ipamctl", pflag.ContinueOnError)
	server := fs.String("server", envOr("IPAMCTL_SERVER", "http://127.0.0.1:9998"), "any replica's metrics address (also $IPAMCTL_SERVER)")
	output := fs.StringP("output", "o", "table", "output format: table or json")
	timeout := fs.Duration("timeout", 10*time.Second, "request timeout")
	admin := registerAdminFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(os.Stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return
		}
		os.Exit(2)
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(os.Stderr, "ipamctl: --output must be table or json, not %q\n", *output)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := run(ctx, os.Stdout, newDirectClient(*server), *output, admin, fs.Args()); err != nil {
		fmt.Fprintf(os.Stderr, "ipamctl: %v\n", err)
		os.Exit(1)
	}
}

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

func run(ctx context.Context, w io.Writer, c *client, output string, admin *adminOptions, args []string) error {
	if len(args) == 0 {
		return errors.New("no command; see ipamctl --help")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "status", "members", "ring":
		if len(rest) != 0 {
			return fmt.Errorf("%s takes no arguments", cmd)
		}
		var st shard.Status
		if err := c.get(ctx, "/shard/status", &st); err != nil {
			return err
		}
		if output == "json" {
			return writeJSON(w, st)
		}
		return printStatus(w, cmd, st)
	case "owner", "node":
		if len(rest) != 1 {
			return fmt.Errorf("%s takes one node name", cmd)
		}
		var ns shard.NodeStatus
		if err := c.get(ctx, "/shard/node?name="+url.QueryEscape(rest[0]), &ns); err != nil {
			return err
		}
		if cmd == "owner" {
			ns.Pool = nil
		}
		if output == "json" {
			return writeJSON(w, ns)
		}
		return printNode(w, ns)
	case "allocate", "release":
		return runAdmin(ctx, w, c, output, admin, cmd, rest)
	}
	return fmt.Errorf("unknown command %q; see ipamctl --help", cmd)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printStatus(w io.Writer, cmd string, st shard.Status) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	leader := st.Leader
	if leader == "" {
		leader = "(unknown)"
	}
	switch cmd {
	case "status":
		fmt.Fprintf(tw, "replica\t%s\n", st.Self)
		fmt.Fprintf(tw, "leader\t%s\n", leader)
		fmt.Fprintf(tw, "lease valid\t%v\n", st.LeaseValid)
		fmt.Fprintf(tw, "ready\t%s\n", st.Ready)
		fmt.Fprintf(tw, "budget share\t%.2f calls/s, burst %d\n", st.Budget.Rate, st.Budget.Burst)
		fmt.Fprintf(tw, "partitions\t%d (%d without an owner; %d nodes without an owner)\n", st.Partitions, st.Unowned, st.UnownedNodes)
	case "members":
		fmt.Fprintf(tw, "MEMBER\tLIVE\tLEADER\tGRPC\tHTTP\tHELD PARTITIONS\tNODES\n")
		for _, m := range st.Members {
			live := fmt.Sprint(m.Live)
			if m.Leaving {
				live = "leaving"
			}
			fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\t%d\t%d\n", m.Name, live, m.Name == st.Leader, m.GRPC, m.HTTP, m.HeldPartitions, m.Nodes)
		}
	case "ring":
		fmt.Fprintf(tw, "MEMBER\tRING PARTITIONS\tHELD PARTITIONS\tNODES\n")
		for _, m := range st.Members {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", m.Name, m.RingPartitions, m.HeldPartitions, m.Nodes)
		}
		fmt.Fprintf(tw, "(no owner)\t\t%d\t%d\n", st.Unowned, st.UnownedNodes)
	}
	return nil
}

func printNode(w io.Writer, ns shard.NodeStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	holder := ns.Holder
	if holder == "" {
		holder = "(none: being handed over)"
	}
	fmt.Fprintf(tw, "node\t%s\n", ns.Node)
	fmt.Fprintf(tw, "partition\t%d\n", ns.Partition)
	fmt.Fprintf(tw, "owner\t%s\n", holder)
	fmt.Fprintf(tw, "ring owner\t%s\n", ns.RingOwner)
	fmt.Fprintf(tw, "answered by\t%s\n", ns.AnsweredBy)
	if ns.Error != "" {
		fmt.Fprintf(tw, "error\t%s\n", ns.Error)
	}
	if ns.Pool != nil {
		pool, _ := json.Marshal(ns.Pool)
		var m map[string]any
		if json.Unmarshal(pool, &m) == nil {
			for _, k := range slices.Sorted(maps.Keys(m)) {
				fmt.Fprintf(tw, "pool %s\t%v\n", k, m[k])
			}
		}
	}
	return nil
}
