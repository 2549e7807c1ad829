package fleet

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/cce-ipam/sharded/e2e/supervisor"
)

// netnsNet is the fleet's network when Options.NetNS is set: a bridge on
// the host with address .1 of a private /24, and per replica a network
// namespace joined to the bridge by a veth pair, with address .(10+index).
// The replicas reach kube-apiserver and bce-sim (loopback-only) through TCP
// proxies the fleet runs on the bridge address; the test process reaches
// the replicas over the bridge. Partition cuts a replica off from its peers
// with unreachable routes in both directions, while the bridge address
// (API server, bce-sim, the kubelet simulator) stays reachable.
type netnsNet struct {
	id      string // "<pid>"; names: bridge ce<id>b, netns cce-e2e-<id>-<i>, veths ce<id>h<i>/ce<id>n<i>
	prefix  string // "10.213.X."
	bridge  string
	proxies []*tcpProxy
	apiAddr string // proxy addresses on the bridge
	simAddr string
	kubecfg string // kubeconfig through the API proxy

	mu          sync.Mutex
	spaces      map[int]bool         // replica index -> namespace created
	partitioned map[int]map[int]bool // unreachable routes installed: in netns of i towards j
}

const netnsPrefix = "cce-e2e-"

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// checkNetNS fails clearly when network namespaces cannot be made here.
func checkNetNS() error {
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("fleet: NetNS needs the ip command (iproute2)")
	}
	probe := fmt.Sprintf("%sprobe-%d", netnsPrefix, os.Getpid())
	if err := ipCmd("netns", "add", probe); err != nil {
		return fmt.Errorf("fleet: NetNS needs `ip netns add` to work (root or CAP_SYS_ADMIN+CAP_NET_ADMIN): %w", err)
	}
	return ipCmd("netns", "del", probe)
}

// removeAbandonedNetNS deletes namespaces and bridges of earlier test
// processes that died before their Close.
func removeAbandonedNetNS() {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), netnsPrefix)
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
		if err == nil && !supervisor.Alive(pid) {
			_ = ipCmd("netns", "del", e.Name())
			_ = ipCmd("link", "del", "ce"+strconv.Itoa(pid)+"b")
		}
	}
}

func (f *Fleet) setupNetNS(apiHostPort, simHostPort string) error {
	if err := checkNetNS(); err != nil {
		return err
	}
	removeAbandonedNetNS()
	pid := os.Getpid()
	n := &netnsNet{
		id:          strconv.Itoa(pid),
		spaces:      map[int]bool{},
		partitioned: map[int]map[int]bool{},
	}
	n.bridge = "ce" + n.id + "b"
	f.netns = n
	// A /24 no interface of this host uses yet.
	used := map[int]bool{}
	if ifs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range ifs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip4 := ipn.IP.To4(); ip4 != nil && ip4[0] == 10 && ip4[1] == 213 {
					used[int(ip4[2])] = true
				}
			}
		}
	}
	x := 1 + pid%250
	for used[x] {
		x = 1 + rand.IntN(250)
	}
	n.prefix = fmt.Sprintf("10.213.%d.", x)
	if err := ipCmd("link", "add", n.bridge, "type", "bridge"); err != nil {
		return err
	}
	if err := ipCmd("addr", "add", n.prefix+"1/24", "dev", n.bridge); err != nil {
		return err
	}
	if err := ipCmd("link", "set", n.bridge, "up"); err != nil {
		return err
	}
	for _, target := range []string{apiHostPort, simHostPort} {
		p, err := newTCPProxy(n.prefix+"1:0", target)
		if err != nil {
			return fmt.Errorf("fleet: proxy to %s: %w", target, err)
		}
		n.proxies = append(n.proxies, p)
	}
	n.apiAddr, n.simAddr = n.proxies[0].addr(), n.proxies[1].addr()
	// The replicas' kubeconfig goes through the proxy; the certificate
	// still names 127.0.0.1.
	kc, err := clientcmd.LoadFromFile(f.Kubeconfig)
	if err != nil {
		return err
	}
	for _, c := range kc.Clusters {
		c.Server = "https://" + n.apiAddr
		c.TLSServerName = "127.0.0.1"
	}
	n.kubecfg = filepath.Join(f.Dir, "netns.kubeconfig")
	return clientcmd.WriteToFile(*kc, n.kubecfg)
}

func (n *netnsNet) space(i int) string { return fmt.Sprintf("%s%s-%d", netnsPrefix, n.id, i) }
func (n *netnsNet) addr(i int) string  { return n.prefix + strconv.Itoa(10+i) }

// ensureSpace creates replica i's namespace and veth once.
func (n *netnsNet) ensureSpace(i int) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.spaces[i] {
		return nil
	}
	if 10+i > 250 {
		return errors.New("fleet: NetNS supports replica indexes up to 240")
	}
	ns, host, peer := n.space(i), fmt.Sprintf("ce%sh%d", n.id, i), fmt.Sprintf("ce%sn%d", n.id, i)
	steps := [][]string{
		{"netns", "add", ns},
		{"link", "add", host, "type", "veth", "peer", "name", peer},
		{"link", "set", host, "master", n.bridge},
		{"link", "set", host, "up"},
		{"link", "set", peer, "netns", ns},
		{"-n", ns, "addr", "add", n.addr(i) + "/24", "dev", peer},
		{"-n", ns, "link", "set", peer, "up"},
		{"-n", ns, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			return err
		}
	}
	n.spaces[i] = true
	return nil
}

// cut installs (or with heal removes) the unreachable route in i's
// namespace towards j.
func (n *netnsNet) cut(i, j int, heal bool) error {
	verb := "add"
	if heal {
		verb = "del"
	}
	if err := ipCmd("-n", n.space(i), "route", verb, "unreachable", n.addr(j)+"/32"); err != nil {
		return err
	}
	if n.partitioned[i] == nil {
		n.partitioned[i] = map[int]bool{}
	}
	if heal {
		delete(n.partitioned[i], j)
	} else {
		n.partitioned[i][j] = true
	}
	return nil
}

func (n *netnsNet) close() error {
	var errs []error
	for _, p := range n.proxies {
		p.close()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for i := range n.spaces {
		errs = append(errs, ipCmd("netns", "del", n.space(i)))
	}
	errs = append(errs, ipCmd("link", "del", n.bridge))
	return errors.Join(errs...)
}

// Partition cuts replica r off from every other replica (both directions:
// gossip and forwarded calls) while it still reaches kube-apiserver and
// bce-sim, and the kubelet simulator still reaches it. Needs Options.NetNS.
func (f *Fleet) Partition(r *Replica) error { return f.partition(r, false) }

// Heal undoes Partition.
func (f *Fleet) Heal(r *Replica) error { return f.partition(r, true) }

func (f *Fleet) partition(r *Replica, heal bool) error {
	n := f.netns
	if n == nil {
		return errors.New("fleet: Partition needs Options.NetNS")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var errs []error
	for _, p := range f.Replicas() {
		if p == r || !n.spaces[p.index] {
			continue
		}
		for _, pair := range [][2]int{{r.index, p.index}, {p.index, r.index}} {
			if n.partitioned[pair[0]][pair[1]] == heal {
				errs = append(errs, n.cut(pair[0], pair[1], heal))
			}
		}
	}
	return errors.Join(errs...)
}

// Partitioned reports whether Partition cut r off and Heal did not undo it.
func (f *Fleet) Partitioned(r *Replica) bool {
	n := f.netns
	if n == nil {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.partitioned[r.index]) > 0
}
