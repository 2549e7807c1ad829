package bcesim

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// ENIStatus is the lifecycle state BCE reports for an ENI.
type ENIStatus string

// ENI states as the upstream IPAM interprets them.
const (
	StatusAvailable ENIStatus = "available"
	StatusAttaching ENIStatus = "attaching"
	StatusInUse     ENIStatus = "inuse"
	StatusDetaching ENIStatus = "detaching"
)

// WorldConfig holds the knobs of the world model. Zero values get defaults in
// NewWorld.
type WorldConfig struct {
	// AttachDelay is how long an ENI stays "attaching" before it reads "inuse".
	// Defaults to 0 (the next read already sees inuse); must stay below 50 s,
	// the upstream's polling budget.
	AttachDelay time.Duration
	// DetachDelay is how long an ENI stays "detaching". Defaults to 0.
	DetachDelay time.Duration
	// MaxUnattachedENIsPerVPC caps ENIs without an instance per VPC
	// (QuotaLimitExceeded on create). Defaults to 500, the documented BCE quota.
	MaxUnattachedENIsPerVPC int
	// Seed makes IDs and MAC addresses reproducible.
	Seed uint64
	// CreateENIPrimaryOnly refuses (400 BadRequest) an ENI created with
	// secondary addresses in its privateIpSet: a BCE that takes only the
	// primary at creation, for clients that must fall back.
	CreateENIPrimaryOnly bool
}

// World is the pure model of one BCE region: VPCs, subnets, instances,
// security groups and ENIs. It does no I/O and reads no clock: every method
// that depends on time takes now. It is not safe for concurrent use; the
// HTTP layer serialises access.
type World struct {
	cfg       WorldConfig
	rng       *rand.Rand
	subnets   map[string]*subnet
	instances map[string]*instance
	sgs       map[string]*securityGroup
	enis      map[string]*eni
	eniIDs    []string // sorted, for marker pagination
	// graveyard keeps deleted ENIs for lagged reads until the lag passes.
	graveyard map[string]*eni
	// pending holds ENIs with a delayed status transition.
	pending map[string]struct{}
	// historic holds ENIs with history to prune (status changes or released
	// addresses kept for lagged reads), so advance does not scan every ENI.
	historic map[string]struct{}
	macs     map[string]struct{}
	// retention is how long history is kept for lagged reads.
	retention time.Duration
}

type subnet struct {
	ID, Name, Zone, VPC, Type, Description string
	Created                                time.Time
	pool                                   *ipPool
}

type instance struct {
	ID, Name, Zone, VPC, Subnet string
	CPU, MemoryGB               int
	InternalIP                  netip.Addr
	SecurityGroups              []string
	Created                     time.Time
}

type securityGroup struct {
	ID, Name, VPC string
	Created       time.Time
}

type ipEntry struct {
	Addr    netip.Addr
	Subnet  string
	Primary bool
	Added   time.Time
	Removed time.Time // zero while held; set on tombstones kept for lagged reads
}

type statusChange struct {
	At       time.Time
	Status   ENIStatus
	Instance string
}

type eni struct {
	ID, Name, Description, Zone, VPC, Subnet, MAC, TrafficMode string
	SecurityGroups, EnterpriseSGs                              []string
	Tags                                                       []Tag
	Created, Deleted                                           time.Time
	IPs                                                        []*ipEntry
	removed                                                    []*ipEntry
	history                                                    []statusChange // ordered by At; last entry is current
	transitionAt                                               time.Time      // when attaching/detaching completes
}

// Tag is a BCE resource tag.
type Tag struct {
	Key   string `json:"tagKey"`
	Value string `json:"tagValue"`
}

// NewWorld returns an empty world.
func NewWorld(cfg WorldConfig) *World {
	if cfg.MaxUnattachedENIsPerVPC == 0 {
		cfg.MaxUnattachedENIsPerVPC = 500
	}
	return &World{
		cfg:       cfg,
		rng:       rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		subnets:   map[string]*subnet{},
		instances: map[string]*instance{},
		sgs:       map[string]*securityGroup{},
		enis:      map[string]*eni{},
		graveyard: map[string]*eni{},
		pending:   map[string]struct{}{},
		historic:  map[string]struct{}{},
		macs:      map[string]struct{}{},
	}
}

// MaxIPsPerENI is the per-ENI address cap (primary included) for an instance
// with memGB of memory, after the BCE documentation the upstream follows.
func MaxIPsPerENI(memGB int) int {
	switch {
	case memGB <= 0:
		return 0
	case memGB < 2:
		return 2
	case memGB <= 8:
		return 8
	case memGB <= 32:
		return 16
	case memGB <= 64:
		return 30
	default:
		return 40
	}
}

// MaxENIsPerInstance is the number of ENIs an instance with cpu vCPUs can hold.
func MaxENIsPerInstance(cpu int) int {
	return max(0, min(cpu, 8))
}

const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

func (w *World) newID(prefix string, exists func(string) bool) string {
	for {
		b := make([]byte, 10)
		for i := range b {
			b[i] = idAlphabet[w.rng.IntN(len(idAlphabet))]
		}
		id := prefix + string(b)
		if !exists(id) {
			return id
		}
	}
}

func (w *World) newMAC() string {
	for {
		mac := fmt.Sprintf("fa:26:00:%02x:%02x:%02x", w.rng.IntN(256), w.rng.IntN(256), w.rng.IntN(256))
		if _, dup := w.macs[mac]; !dup {
			w.macs[mac] = struct{}{}
			return mac
		}
	}
}

// SubnetSpec describes a subnet to create through the admin API.
type SubnetSpec struct {
	ID          string `json:"subnetId"`
	Name        string `json:"name"`
	ZoneName    string `json:"zoneName"`
	CIDR        string `json:"cidr"`
	VPCID       string `json:"vpcId"`
	SubnetType  string `json:"subnetType"`
	Description string `json:"description"`
}

// AddSubnet creates a subnet. An empty ID gets a generated one.
func (w *World) AddSubnet(now time.Time, s SubnetSpec) (string, error) {
	if s.ZoneName == "" || s.VPCID == "" {
		return "", errBadParam("subnet needs zoneName and vpcId")
	}
	p, err := netip.ParsePrefix(s.CIDR)
	if err != nil {
		return "", errBadParam("subnet cidr %q: %v", s.CIDR, err)
	}
	pool, err := newIPPool(p)
	if err != nil {
		return "", errBadParam("%v", err)
	}
	for _, o := range w.subnets {
		if o.VPC == s.VPCID && o.pool.prefix.Overlaps(pool.prefix) {
			return "", errBadParam("cidr %s overlaps subnet %s", pool.prefix, o.ID)
		}
	}
	if s.ID == "" {
		s.ID = w.newID("sbn-", func(id string) bool { return w.subnets[id] != nil })
	} else if w.subnets[s.ID] != nil {
		return "", errBadParam("subnet %q already exists", s.ID)
	}
	if s.SubnetType == "" {
		s.SubnetType = "BCC"
	}
	if s.Name == "" {
		s.Name = s.ID
	}
	w.subnets[s.ID] = &subnet{ID: s.ID, Name: s.Name, Zone: s.ZoneName, VPC: s.VPCID, Type: s.SubnetType,
		Description: s.Description, Created: now, pool: pool}
	return s.ID, nil
}

// SecurityGroupSpec describes a security group to create through the admin API.
type SecurityGroupSpec struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	VPCID string `json:"vpcId"`
}

// AddSecurityGroup creates a security group.
func (w *World) AddSecurityGroup(now time.Time, s SecurityGroupSpec) (string, error) {
	if s.VPCID == "" {
		return "", errBadParam("security group needs vpcId")
	}
	if s.ID == "" {
		s.ID = w.newID("g-", func(id string) bool { return w.sgs[id] != nil })
	} else if w.sgs[s.ID] != nil {
		return "", errBadParam("security group %q already exists", s.ID)
	}
	w.sgs[s.ID] = &securityGroup{ID: s.ID, Name: s.Name, VPC: s.VPCID, Created: now}
	return s.ID, nil
}

// InstanceSpec describes a BCC instance to create through the admin API.
type InstanceSpec struct {
	ID               string   `json:"id"`
	Name             string   `json:"name"`
	SubnetID         string   `json:"subnetId"`
	CPUCount         int      `json:"cpuCount"`
	MemoryGB         int      `json:"memoryCapacityInGB"`
	SecurityGroupIDs []string `json:"securityGroupIds"`
}

// AddInstance creates an instance in a subnet; its primary NIC takes one
// address of that subnet, as on BCE.
func (w *World) AddInstance(now time.Time, s InstanceSpec) (string, error) {
	sn := w.subnets[s.SubnetID]
	if sn == nil {
		return "", errNoSuchObject("subnet", s.SubnetID)
	}
	if s.CPUCount <= 0 || s.CPUCount > 512 || s.MemoryGB <= 0 || s.MemoryGB > 16384 {
		return "", errBadParam("instance needs cpuCount in [1,512] and memoryCapacityInGB in [1,16384]")
	}
	for _, g := range s.SecurityGroupIDs {
		if sg := w.sgs[g]; sg == nil || sg.VPC != sn.VPC {
			return "", errNoSuchObject("security group", g)
		}
	}
	if s.ID == "" {
		s.ID = w.newID("i-", func(id string) bool { return w.instances[id] != nil })
	} else if w.instances[s.ID] != nil {
		return "", errBadParam("instance %q already exists", s.ID)
	}
	addr, err := sn.pool.allocAny()
	if err != nil {
		return "", apiErr(http.StatusBadRequest, CodeSubnetNoMoreIP, "subnet %s has no free address", sn.ID)
	}
	if s.Name == "" {
		s.Name = s.ID
	}
	w.instances[s.ID] = &instance{ID: s.ID, Name: s.Name, Zone: sn.Zone, VPC: sn.VPC, Subnet: sn.ID,
		CPU: s.CPUCount, MemoryGB: s.MemoryGB, InternalIP: addr,
		SecurityGroups: slices.Clone(s.SecurityGroupIDs), Created: now}
	return s.ID, nil
}

// Check verifies the world's invariants: no address held twice in a subnet,
// every held address marked in its subnet's pool and nothing else marked,
// availableIp equal to the free count, and the per-ENI and per-instance caps.
func (w *World) Check() error {
	held := map[string]map[netip.Addr]string{} // subnet -> addr -> holder
	hold := func(subnetID string, a netip.Addr, who string) error {
		m := held[subnetID]
		if m == nil {
			m = map[netip.Addr]string{}
			held[subnetID] = m
		}
		if prev, dup := m[a]; dup {
			return fmt.Errorf("address %s in subnet %s held twice: by %s and %s", a, subnetID, prev, who)
		}
		m[a] = who
		return nil
	}
	for _, in := range w.instances {
		if err := hold(in.Subnet, in.InternalIP, in.ID); err != nil {
			return err
		}
	}
	perInstance := map[string]int{}
	for _, e := range w.enis {
		primaries := 0
		for _, ip := range e.IPs {
			if ip.Primary {
				primaries++
			}
			if err := hold(ip.Subnet, ip.Addr, e.ID); err != nil {
				return err
			}
		}
		if primaries != 1 {
			return fmt.Errorf("eni %s has %d primary addresses", e.ID, primaries)
		}
		if inst := e.instance(); inst != "" {
			perInstance[inst]++
			in := w.instances[inst]
			if in == nil {
				return fmt.Errorf("eni %s attached to unknown instance %s", e.ID, inst)
			}
			if limit := MaxIPsPerENI(in.MemoryGB); len(e.IPs) > limit {
				return fmt.Errorf("eni %s holds %d addresses, cap %d", e.ID, len(e.IPs), limit)
			}
		}
	}
	for inst, n := range perInstance {
		if limit := MaxENIsPerInstance(w.instances[inst].CPU); n > limit {
			return fmt.Errorf("instance %s has %d enis, cap %d", inst, n, limit)
		}
	}
	for id, sn := range w.subnets {
		used := sn.pool.usedAddrs()
		if len(used) != len(held[id]) {
			return fmt.Errorf("subnet %s: pool marks %d addresses, %d are held", id, len(used), len(held[id]))
		}
		for _, a := range used {
			if _, ok := held[id][a]; !ok {
				return fmt.Errorf("subnet %s: %s marked used but held by nobody", id, a)
			}
		}
		if want := int(sn.pool.size) - 3 - len(used); sn.pool.free != want {
			return fmt.Errorf("subnet %s: availableIp %d, free addresses %d", id, sn.pool.free, want)
		}
	}
	for id := range held {
		if w.subnets[id] == nil {
			return fmt.Errorf("addresses held in unknown subnet %s", id)
		}
	}
	return nil
}

func (e *eni) current() statusChange { return e.history[len(e.history)-1] }
func (e *eni) status() ENIStatus     { return e.current().Status }
func (e *eni) instance() string      { return e.current().Instance }

func validName(s string) bool {
	return s != "" && len(s) <= 256 && !strings.ContainsAny(s, "\x00\n\r")
}
