// Command ipamctl asks any cce-ipam replica about the sharded cluster: its
// members, the leader, the ring (partitions and nodes per replica), the owner
// of a node and that node's pool; `check` is the health verdict of the
// chart's helm test hook.
//
//	ipamctl --server http://10.0.0.5:9998 members
//	ipamctl ring                                # through the API server
//	kubectl ipam ring -n kube-system            # the same, as a kubectl plugin
//	ipamctl owner node-10-0-1-7
//	ipamctl node node-10-0-1-7 --output json
//	ipamctl check --replicas 3
//
// It reads the replica's /shard/status and /shard/node endpoints (on the
// metrics port); a node query is passed on to the node's owner. With
// --server it reaches that replica directly; without, it goes through the
// API server's service proxy to the release's peers Service, with the
// kubeconfig kubectl would use (client.go).
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
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cce-ipam/sharded/shard"
)

// usage is the help text; %[1]s is the name the command was called by
// ("ipamctl", or "kubectl ipam" as a kubectl plugin).
const usage = `usage: %[1]s [flags] <command> [args]

commands:
  status          the replica's view: self, leader, lease, readiness, budget share
  members         replicas with their addresses, liveness and what each holds
  ring            partitions and nodes per replica (ring wish and held claims)
  owner NODE      the partition and owner of a node
  node NODE       the owner of a node and its pool (asked of the owner)
  check           exit 0 iff all replicas are live members and every partition is held
                  (--replicas N: the number of replicas that must be live members)
` + adminUsage + `
Without --server (or $IPAMCTL_SERVER), %[1]s goes through the API server's service
proxy, with the kubeconfig kubectl would use (--kubeconfig, $KUBECONFIG, ~/.kube/config,
else the pod's in-cluster config), to the metrics port of the chart's peers Service
(<release fullname>-peers; the default matches a release named cce-ipam). It needs RBAC
get on services/proxy of that Service (create for commands that POST).

As a kubectl plugin: copy or link the binary as kubectl-ipam on your PATH, then
  kubectl ipam ring -n kube-system --service my-release-cce-ipam-peers

flags:
`

// defaultService is the peers Service of a release named cce-ipam (the
// chart's fullname is then "cce-ipam").
const defaultService = "cce-ipam-peers"

func main() {
	name := commandName(os.Args[0])
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	server := fs.String("server", os.Getenv("IPAMCTL_SERVER"),
		"a replica's metrics address, e.g. http://10.0.0.5:9998, reached directly (also $IPAMCTL_SERVER); "+
			"empty: through the API server")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else in-cluster)")
	kubeContext := fs.String("context", "", "the kubeconfig context to use (default: its current context)")
	namespace := fs.StringP("namespace", "n", "kube-system", "the namespace of the cce-ipam release")
	service := fs.String("service", defaultService,
		"the release's peers Service: <fullname>-peers, where fullname is the release name if it contains "+
			"\"cce-ipam\", else <release>-cce-ipam (or fullnameOverride)")
	output := fs.StringP("output", "o", "table", "output format: table or json")
	timeout := fs.Duration("timeout", 10*time.Second, "request timeout")
	admin := registerAdminFlags(fs)
	replicas := fs.Int("replicas", 0, "check: the number of replicas that must be live members (0: as many as the answering replica knows)")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, usage, name)
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return
		}
		os.Exit(2)
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(os.Stderr, "%s: --output must be table or json, not %q\n", name, *output)
		os.Exit(2)
	}
	var c *client
	if *server != "" {
		c = newDirectClient(*server)
	} else {
		cfg, err := loadKubeconfig(*kubeconfig, *kubeContext)
		if err == nil {
			c, err = newProxyClient(cfg, *namespace, *service)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			os.Exit(1)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	err := run(ctx, os.Stdout, c, *output, *replicas, admin, fs.Args())
	if errors.Is(err, errCheckFailed) {
		os.Exit(1) // the failed conditions are printed already
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// commandName is the name for usage and errors: "kubectl ipam" when kubectl
// runs this binary as its plugin kubectl-ipam.
func commandName(argv0 string) string {
	base := filepath.Base(argv0)
	if rest, ok := strings.CutPrefix(base, "kubectl-"); ok {
		return "kubectl " + strings.ReplaceAll(rest, "_", "-")
	}
	return base
}

// loadKubeconfig finds the API server as kubectl does: an explicit file,
// else $KUBECONFIG, else ~/.kube/config, else the in-cluster config of a pod
// (the helm test hook); kubeContext picks a context other than the current.
func loadKubeconfig(path, kubeContext string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	overrides := &clientcmd.ConfigOverrides{CurrentContext: kubeContext}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, errors.New("no kubeconfig found (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not in a pod; " +
			"give one, or reach a replica directly with --server http://HOST:9998")
	}
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

func run(ctx context.Context, w io.Writer, c *client, output string, replicas int, admin *adminOptions, args []string) error {
	if len(args) == 0 {
		return errors.New("no command; see ipamctl --help")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "check":
		if len(rest) != 0 {
			return errors.New("check takes no arguments (--replicas N)")
		}
		var st shard.Status
		if err := c.get(ctx, "/shard/status", &st); err != nil {
			return err
		}
		return printCheck(w, checkRing(st, replicas), st)
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
