package membership

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
)

// Member is one live replica as gossip sees it.
type Member struct {
	// Name is the unique member name (name prefix + random suffix).
	Name string
	// Addr is the gossip address, host:port.
	Addr string
	// Meta is the replica's advertised meta.
	Meta Meta
}

// Membership is one replica's view of the gossip cluster. Build it with New,
// drive it with Run; Members and Events are safe to use from any goroutine.
type Membership struct {
	cfg     Config
	key     []byte
	name    string
	log     *slog.Logger
	metrics *metrics

	meta    atomic.Pointer[[]byte] // encoded local meta, read by memberlist goroutines
	started chan struct{}          // closed once the listener is up
	running atomic.Bool
	abandon atomic.Bool                     // tests: end Run without Leave, like a crash
	seeds   atomic.Pointer[func() []string] // SetSeedSource
	events  chan Event
	queue   eventQueue

	// memberlist's Members() hands out pointers that it keeps writing, so
	// the live set is kept here instead, copied in the event callbacks
	// (which memberlist calls under its node lock).
	mu        sync.Mutex
	members   map[string]Member
	localAddr string
}

// ErrAlreadyRunning is returned by a second call of Run.
var ErrAlreadyRunning = errors.New("membership: Run called twice")

// New checks cfg, loads the gossip key and picks the member name. It starts
// nothing; Run does. startTime is advertised in the meta (the process start).
// A nil log discards logs; a nil reg leaves the metrics unregistered.
func New(cfg Config, startTime time.Time, log *slog.Logger, reg prometheus.Registerer) (*Membership, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("membership config: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	key := cfg.GossipKey
	if key == nil && cfg.GossipKeyFile != "" {
		k, err := LoadGossipKey(cfg.GossipKeyFile)
		if err != nil {
			return nil, err
		}
		key = k
	}
	meta, err := EncodeMeta(Meta{GRPCAddr: cfg.GRPCAddr, Version: cfg.Version, StartTime: startTime})
	if err != nil {
		return nil, err
	}
	var suffix [4]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return nil, fmt.Errorf("member name suffix: %w", err)
	}
	m := &Membership{
		cfg:     cfg,
		key:     key,
		name:    cfg.NamePrefix + "-" + hex.EncodeToString(suffix[:]),
		log:     log,
		metrics: newMetrics(reg),
		started: make(chan struct{}),
		events:  make(chan Event),
		members: map[string]Member{},
	}
	m.meta.Store(&meta)
	m.queue.signal = make(chan struct{}, 1)
	m.queue.length = m.metrics.queue
	return m, nil
}

// Name is this replica's unique member name (also its leader-election
// identity).
func (m *Membership) Name() string { return m.name }

// Started is closed once Run listens for gossip; LocalAddr and Members
// answer from then on. It stays open if Run fails to start (Run returns the
// error).
func (m *Membership) Started() <-chan struct{} { return m.started }

// LocalAddr is the advertised gossip address (host:port) once Started is
// closed, "" before. With BindPort 0 this tells the port that was picked.
func (m *Membership) LocalAddr() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.localAddr
}

// Events delivers membership changes, in the order memberlist saw them, to a
// single consumer. Event.Seq counts 1, 2, 3, … without gaps. The first event
// is this replica's own join. The channel is closed when Run returns; changes
// that happen after the Run context ends are not delivered. The consumer must
// keep reading: changes queue up (in memory) while it does not.
func (m *Membership) Events() <-chan Event { return m.events }

// Members is a snapshot of the live members, this replica included, sorted
// by name, as of the latest change memberlist reported (it may be ahead of
// what the Events consumer has read). It is empty before Run has started
// and after it has returned.
func (m *Membership) Members() []Member {
	m.mu.Lock()
	out := make([]Member, 0, len(m.members))
	for _, mem := range m.members {
		out = append(out, mem)
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// liveAddrs is the set of live members' gossip addresses.
func (m *Membership) liveAddrs() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]bool, len(m.members))
	for _, mem := range m.members {
		out[mem.Addr] = true
	}
	return out
}

// track applies one change to the live set and reports whether it is one
// to deliver: a leave of a member never admitted is not, and an update that
// first admits a member becomes a join. Called under memberlist's lock.
func (m *Membership) track(t *EventType, mem Member) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, known := m.members[mem.Name]
	switch {
	case *t == EventLeave && !known:
		return false
	case *t == EventLeave:
		delete(m.members, mem.Name)
	case *t == EventUpdate && !known:
		*t = EventJoin // first admitted by this update
		fallthrough
	default:
		m.members[mem.Name] = mem
	}
	m.metrics.members.Set(float64(len(m.members)))
	return true
}

// Run joins the cluster and keeps it whole until ctx ends, then leaves
// gracefully (bounded by LeaveTimeout) and shuts gossip down. It returns
// after every goroutine it started has exited; the error is non-nil only if
// gossip could not start.
func (m *Membership) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer close(m.events)

	if m.key == nil {
		m.log.Warn("gossip is not encrypted; set a gossip key file to encrypt it")
	}
	ml, err := memberlist.Create(m.memberlistConfig())
	if err != nil {
		return fmt.Errorf("start gossip on %s:%d: %w", m.cfg.BindAddr, m.cfg.BindPort, err)
	}
	m.mu.Lock()
	m.localAddr = ml.LocalNode().Address() // before anything else can touch our node
	m.mu.Unlock()
	close(m.started)
	m.log.Info("gossip started", "member", m.name, "addr", m.LocalAddr(), "encrypted", m.key != nil)

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); m.dispatch(ctx) }()
	go func() { defer wg.Done(); m.joinLoop(ctx, ml) }()

	<-ctx.Done()
	if !m.abandon.Load() {
		m.leave(ml)
	}
	if err := ml.Shutdown(); err != nil {
		m.log.Warn("gossip shutdown", "err", err)
	}
	wg.Wait()
	m.mu.Lock()
	clear(m.members)
	m.mu.Unlock()
	m.metrics.members.Set(0)
	return nil
}

// memberlistConfig is the LAN profile with this replica's settings.
func (m *Membership) memberlistConfig() *memberlist.Config {
	c := m.cfg
	conf := memberlist.DefaultLANConfig()
	conf.Name = m.name
	conf.BindAddr = c.BindAddr
	conf.BindPort = c.BindPort
	conf.AdvertiseAddr = c.AdvertiseAddr
	conf.AdvertisePort = c.AdvertisePort
	if conf.AdvertisePort == 0 {
		conf.AdvertisePort = c.BindPort // 0 with BindPort 0: memberlist fills in the picked port
	}
	conf.ProbeInterval = c.ProbeInterval
	conf.ProbeTimeout = c.ProbeTimeout
	conf.SuspicionMult = c.SuspicionMult
	conf.GossipInterval = c.GossipInterval
	conf.PushPullInterval = c.PushPullInterval
	conf.TCPTimeout = c.TCPTimeout
	conf.DeadNodeReclaimTime = c.DeadNodeReclaimTime
	conf.Label = c.ClusterLabel
	if m.key != nil {
		conf.SecretKey = m.key
		conf.GossipVerifyIncoming = true
		conf.GossipVerifyOutgoing = true
	}
	d := &delegate{m: m}
	conf.Delegate = d
	conf.Events = d
	conf.Alive = d
	conf.Logger = log.New(&logWriter{log: m.log.With("component", "memberlist")}, "", 0)
	return conf
}

// leave tells the others that this replica is going: first a meta update
// with Leaving set (so peers can tell a shutdown from a crash), then the
// leave message itself.
func (m *Membership) leave(ml *memberlist.Memberlist) {
	deadline := time.Now().Add(m.cfg.LeaveTimeout)
	cur, err := DecodeMeta(*m.meta.Load())
	if err == nil {
		cur.Leaving = true
		if b, err := EncodeMeta(cur); err == nil {
			m.meta.Store(&b)
			if err := ml.UpdateNode(m.cfg.LeaveTimeout / 2); err != nil {
				m.log.Warn("announce leaving", "err", err)
			}
		}
	}
	left := time.Until(deadline)
	if left < 100*time.Millisecond {
		left = 100 * time.Millisecond
	}
	if err := ml.Leave(left); err != nil {
		m.log.Warn("leave gossip cluster", "err", err)
		return
	}
	m.log.Info("left gossip cluster", "member", m.name)
}

// joinLoop joins every seed and DNS address that is not a live member, now
// and then every JoinInterval, for as long as ctx lives. Trying again even
// after a successful join heals islands from a cold start (an empty DNS
// answer, peers not yet listening) and from partitions.
func (m *Membership) joinLoop(ctx context.Context, ml *memberlist.Memberlist) {
	t := time.NewTicker(m.cfg.JoinInterval)
	defer t.Stop()
	for {
		m.joinMissing(ctx, ml)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *Membership) joinMissing(ctx context.Context, ml *memberlist.Memberlist) {
	targets := m.joinTargets(ctx)
	live := m.liveAddrs()
	self := m.LocalAddr()
	for _, addr := range targets {
		if live[addr] || addr == self || ctx.Err() != nil {
			continue
		}
		m.metrics.joinAttempts.Inc()
		if _, err := ml.Join([]string{addr}); err != nil {
			m.metrics.joinFailures.Inc()
			m.log.Debug("join failed; trying again later", "addr", addr, "err", err)
			continue
		}
		m.log.Info("joined", "addr", addr)
	}
}

// SetSeedSource adds a source of join addresses (host:port), asked on every
// join attempt besides the seeds and the DNS name: the replicas' Leases, so
// that a cold start forms one ring when DNS answers nothing (CoreDNS's own
// pods may be waiting for IPs from us). Safe to call while Run runs.
func (m *Membership) SetSeedSource(f func() []string) {
	m.seeds.Store(&f)
}

// joinTargets resolves the seeds and the DNS name into ip:port strings in
// memberlist's Address() form. A name that does not resolve counts as a
// failed join attempt.
func (m *Membership) joinTargets(ctx context.Context) []string {
	defPort := m.cfg.AdvertisePort
	if defPort == 0 {
		_, defPort, _ = splitHostPort(m.LocalAddr(), 0)
	}
	var out []string
	seen := map[string]bool{}
	add := func(spec string) {
		host, port, err := splitHostPort(spec, defPort)
		if err != nil {
			return // rejected by Validate
		}
		var ips []net.IP
		if ip := net.ParseIP(host); ip != nil {
			ips = []net.IP{ip}
		} else {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			addrs, err := net.DefaultResolver.LookupIPAddr(rctx, host)
			cancel()
			if err != nil {
				m.metrics.joinAttempts.Inc()
				m.metrics.joinFailures.Inc()
				m.log.Debug("resolve join address", "name", host, "err", err)
				return
			}
			for _, a := range addrs {
				ips = append(ips, a.IP)
			}
		}
		for _, ip := range ips {
			s := net.JoinHostPort(ip.String(), fmt.Sprint(port))
			if !seen[s] {
				seen[s] = true
				out = append(out, s)
			}
		}
	}
	for _, s := range m.cfg.JoinSeeds {
		add(s)
	}
	if m.cfg.JoinDNS != "" {
		add(m.cfg.JoinDNS)
	}
	if f := m.seeds.Load(); f != nil && *f != nil {
		for _, s := range (*f)() {
			add(s)
		}
	}
	return out
}
