package bcesim

import (
	"slices"
	"sort"
	"strings"
	"time"
)

// eniAt renders e as a reader sees it at time t (now minus the replica lag).
// It reports false when the ENI did not exist at t.
func eniAt(e *eni, t time.Time, lagged bool) (ENIView, bool) {
	if !visibleAt(e, t, lagged) {
		return ENIView{}, false
	}
	st := statusAt(e, t, lagged)
	v := ENIView{
		ENIID: e.ID, Name: e.Name, ZoneName: e.Zone, Description: e.Description, InstanceID: st.Instance,
		MACAddress: e.MAC, VPCID: e.VPC, SubnetID: e.Subnet, Status: st.Status,
		PrivateIPSet: []PrivateIPView{}, IPv6PrivateIPSet: []PrivateIPView{},
		SecurityGroupIDs:           nonNil(e.SecurityGroups),
		EnterpriseSecurityGroupIDs: nonNil(e.EnterpriseSGs),
		CreatedTime:                rfc3339(e.Created), Tags: slices.Clone(e.Tags),
		NetworkInterfaceTrafficMode: e.TrafficMode,
	}
	add := func(ip *ipEntry) {
		pv := PrivateIPView{Primary: ip.Primary, PrivateIPAddress: ip.Addr.String()}
		if ip.Subnet != e.Subnet {
			pv.SubnetID = ip.Subnet
		}
		v.PrivateIPSet = append(v.PrivateIPSet, pv)
	}
	for _, ip := range e.IPs {
		if !lagged || !ip.Added.After(t) {
			add(ip)
		}
	}
	if lagged {
		for _, ip := range e.removed {
			if !ip.Added.After(t) && ip.Removed.After(t) {
				add(ip)
			}
		}
	}
	return v, true
}

// visibleAt reports whether e existed at t.
func visibleAt(e *eni, t time.Time, lagged bool) bool {
	return !lagged || (!e.Created.After(t) && (e.Deleted.IsZero() || e.Deleted.After(t)))
}

// statusAt is e's status (and instance) as of t.
func statusAt(e *eni, t time.Time, lagged bool) statusChange {
	if !lagged {
		return e.current()
	}
	st := e.history[0]
	for _, h := range e.history {
		if !h.At.After(t) {
			st = h
		}
	}
	return st
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return slices.Clone(s)
}

// GetENI returns one ENI as seen lag ago.
func (w *World) GetENI(now time.Time, lag time.Duration, id string) (ENIView, error) {
	w.advance(now)
	e := w.enis[id]
	if e == nil && lag > 0 {
		e = w.graveyard[id]
	}
	if e == nil {
		return ENIView{}, errENINotFound(id)
	}
	v, ok := eniAt(e, now.Add(-lag), lag > 0)
	if !ok {
		return ENIView{}, errENINotFound(id)
	}
	return v, nil
}

// ENIFilter is the list call's query: every non-empty field must match.
type ENIFilter struct {
	VPCID      string
	InstanceID string
	// Name matches as a substring, so the upstream's "<clusterID>/" prefix works.
	Name string
	// PrivateIPs: one entry is a suffix match, several are exact matches.
	PrivateIPs []string
}

// matchRaw checks the filters that need no rendering, so a list scans
// thousands of ENIs without building a view of each.
func (f ENIFilter) matchRaw(e *eni, t time.Time, lagged bool) bool {
	return visibleAt(e, t, lagged) &&
		(f.VPCID == "" || e.VPC == f.VPCID) &&
		(f.Name == "" || strings.Contains(e.Name, f.Name)) &&
		(f.InstanceID == "" || statusAt(e, t, lagged).Instance == f.InstanceID)
}

// matchIPs checks the address filter on a rendered view.
func (f ENIFilter) matchIPs(v *ENIView) bool {
	if len(f.PrivateIPs) == 0 {
		return true
	}
	for _, ip := range v.PrivateIPSet {
		for _, want := range f.PrivateIPs {
			if (len(f.PrivateIPs) == 1 && strings.HasSuffix(ip.PrivateIPAddress, want)) || ip.PrivateIPAddress == want {
				return true
			}
		}
	}
	return false
}

// ListENIs returns one page of ENIs ordered by ID, starting at marker.
func (w *World) ListENIs(now time.Time, lag time.Duration, f ENIFilter, marker string, maxKeys int) (ENIPage, error) {
	w.advance(now)
	if maxKeys <= 0 {
		return ENIPage{}, errBadParam("maxKeys must be positive")
	}
	ids := w.eniIDs
	if lag > 0 && len(w.graveyard) > 0 {
		ids = slices.Clone(ids)
		for id := range w.graveyard {
			ids = append(ids, id)
		}
		slices.Sort(ids)
	}
	t := now.Add(-lag)
	page := ENIPage{ENIs: []ENIView{}, Marker: marker, MaxKeys: maxKeys}
	start := sort.SearchStrings(ids, marker)
	for _, id := range ids[start:] {
		e := w.enis[id]
		if e == nil {
			e = w.graveyard[id]
		}
		if !f.matchRaw(e, t, lag > 0) {
			continue
		}
		v, _ := eniAt(e, t, lag > 0)
		if !f.matchIPs(&v) {
			continue
		}
		if len(page.ENIs) == maxKeys {
			page.IsTruncated = true
			page.NextMarker = id
			break
		}
		page.ENIs = append(page.ENIs, v)
	}
	return page, nil
}

func (sn *subnet) view() SubnetView {
	return SubnetView{SubnetID: sn.ID, Name: sn.Name, ZoneName: sn.Zone, CIDR: sn.pool.prefix.String(),
		VPCID: sn.VPC, SubnetType: sn.Type, Description: sn.Description, CreatedTime: rfc3339(sn.Created),
		AvailableIP: sn.pool.free, AvailableUnreservedIP: sn.pool.free, Tags: []Tag{}}
}

// GetSubnet returns one subnet.
func (w *World) GetSubnet(id string) (SubnetView, error) {
	sn := w.subnets[id]
	if sn == nil {
		return SubnetView{}, errNoSuchObject("subnet", id)
	}
	return sn.view(), nil
}

// SubnetFilter is the subnet list query.
type SubnetFilter struct {
	VPCID, ZoneName, SubnetType string
	SubnetIDs                   []string
}

// ListSubnets returns one page of subnets ordered by ID.
func (w *World) ListSubnets(f SubnetFilter, marker string, maxKeys int) (SubnetPage, error) {
	if maxKeys <= 0 {
		return SubnetPage{}, errBadParam("maxKeys must be positive")
	}
	ids := make([]string, 0, len(w.subnets))
	for id := range w.subnets {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	page := SubnetPage{Subnets: []SubnetView{}, Marker: marker, MaxKeys: maxKeys}
	for _, id := range ids[sort.SearchStrings(ids, marker):] {
		sn := w.subnets[id]
		if (f.VPCID != "" && sn.VPC != f.VPCID) || (f.ZoneName != "" && sn.Zone != f.ZoneName) ||
			(f.SubnetType != "" && sn.Type != f.SubnetType) || (len(f.SubnetIDs) > 0 && !slices.Contains(f.SubnetIDs, id)) {
			continue
		}
		if len(page.Subnets) == maxKeys {
			page.IsTruncated, page.NextMarker = true, id
			break
		}
		page.Subnets = append(page.Subnets, sn.view())
	}
	return page, nil
}

func (in *instance) view() InstanceView {
	return InstanceView{ID: in.ID, Name: in.Name, InstanceType: "N5", Status: "Running", CPUCount: in.CPU,
		MemoryCapacityInGB: in.MemoryGB, ZoneName: in.Zone, SubnetID: in.Subnet, VPCID: in.VPC,
		InternalIP: in.InternalIP.String(), ENIQuota: MaxENIsPerInstance(in.CPU), CreateTime: rfc3339(in.Created)}
}

// GetInstance returns one instance.
func (w *World) GetInstance(id string) (InstanceView, error) {
	in := w.instances[id]
	if in == nil {
		return InstanceView{}, errNoSuchObject("instance", id)
	}
	return in.view(), nil
}

// ENIQuota answers /v1/eni/quota: ENIs per instance, or addresses per ENI.
func (w *World) ENIQuota(now time.Time, instanceID, eniID string) (QuotaView, error) {
	w.advance(now)
	switch {
	case instanceID != "":
		in := w.instances[instanceID]
		if in == nil {
			return QuotaView{}, errNoSuchObject("instance", instanceID)
		}
		n := 0
		for _, e := range w.enis {
			if e.instance() == instanceID {
				n++
			}
		}
		total := MaxENIsPerInstance(in.CPU)
		return QuotaView{TotalQuantity: total, AvailableQuantity: max(0, total-n)}, nil
	case eniID != "":
		e := w.enis[eniID]
		if e == nil {
			return QuotaView{}, errENINotFound(eniID)
		}
		total := maxIPsUnattached
		if inst := e.instance(); inst != "" {
			total = MaxIPsPerENI(w.instances[inst].MemoryGB)
		}
		return QuotaView{TotalQuantity: total, AvailableQuantity: max(0, total-len(e.IPs))}, nil
	}
	return QuotaView{}, errBadParam("give instanceId or eniId")
}

// ListSecurityGroups lists the groups of an instance, or of a VPC.
func (w *World) ListSecurityGroups(instanceID, vpcID, marker string, maxKeys int) (SecurityGroupPage, error) {
	if maxKeys <= 0 {
		return SecurityGroupPage{}, errBadParam("maxKeys must be positive")
	}
	var ids []string
	if instanceID != "" {
		in := w.instances[instanceID]
		if in == nil {
			return SecurityGroupPage{}, errNoSuchObject("instance", instanceID)
		}
		ids = slices.Clone(in.SecurityGroups)
	} else {
		for id, sg := range w.sgs {
			if vpcID == "" || sg.VPC == vpcID {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	page := SecurityGroupPage{SecurityGroups: []SecurityGroupView{}, Marker: marker, MaxKeys: maxKeys}
	for _, id := range ids[sort.SearchStrings(ids, marker):] {
		if len(page.SecurityGroups) == maxKeys {
			page.IsTruncated, page.NextMarker = true, id
			break
		}
		sg := w.sgs[id]
		page.SecurityGroups = append(page.SecurityGroups, SecurityGroupView{ID: sg.ID, Name: sg.Name, VPCID: sg.VPC,
			Rules: []any{}, Tags: []Tag{}, CreatedTime: rfc3339(sg.Created)})
	}
	return page, nil
}

// Dump returns the whole current world, sorted by ID.
func (w *World) Dump(now time.Time) WorldDump {
	w.advance(now)
	d := WorldDump{Subnets: []SubnetView{}, Instances: []InstanceView{}, SecurityGroups: []SecurityGroupView{}, ENIs: []ENIView{}}
	for _, sn := range w.subnets {
		d.Subnets = append(d.Subnets, sn.view())
	}
	for _, in := range w.instances {
		d.Instances = append(d.Instances, in.view())
	}
	for _, sg := range w.sgs {
		d.SecurityGroups = append(d.SecurityGroups, SecurityGroupView{ID: sg.ID, Name: sg.Name, VPCID: sg.VPC,
			Rules: []any{}, Tags: []Tag{}, CreatedTime: rfc3339(sg.Created)})
	}
	for _, id := range w.eniIDs {
		v, _ := eniAt(w.enis[id], now, false)
		d.ENIs = append(d.ENIs, v)
	}
	slices.SortFunc(d.Subnets, func(a, b SubnetView) int { return strings.Compare(a.SubnetID, b.SubnetID) })
	slices.SortFunc(d.Instances, func(a, b InstanceView) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(d.SecurityGroups, func(a, b SecurityGroupView) int { return strings.Compare(a.ID, b.ID) })
	return d
}
