package bcesim

import (
	"errors"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"
)

// MaxBatchIPs is the BCE limit of addresses per batchAdd call, listed or counted.
const MaxBatchIPs = 10

// maxIPsUnattached caps an ENI that has no instance (so no memory-based cap):
// the largest per-ENI cap BCE has.
const maxIPsUnattached = 40

// IPRequest asks for one address: Addr empty means auto-assign; Subnet empty
// means the ENI's own subnet.
type IPRequest struct {
	Addr    string
	Subnet  string
	Primary bool
}

// CreateENIInput is a decoded create request.
type CreateENIInput struct {
	Name, SubnetID, InstanceID, Description, TrafficMode string
	SecurityGroupIDs, EnterpriseSecurityGroupIDs         []string
	PrivateIPs                                           []IPRequest
	Tags                                                 []Tag
}

// SetRetention tells the world how long to keep history for lagged reads
// (the current replica lag). Zero drops history at the next mutation.
func (w *World) SetRetention(d time.Duration) { w.retention = d }

// advance applies delayed status transitions that are due by now and drops
// history older than the retention window.
func (w *World) advance(now time.Time) {
	for id := range w.pending {
		e := w.enis[id]
		if e == nil || now.Before(e.transitionAt) {
			continue
		}
		cur := e.current()
		switch cur.Status {
		case StatusAttaching:
			e.history = append(e.history, statusChange{At: e.transitionAt, Status: StatusInUse, Instance: cur.Instance})
		case StatusDetaching:
			e.history = append(e.history, statusChange{At: e.transitionAt, Status: StatusAvailable})
		}
		w.historic[id] = struct{}{}
		delete(w.pending, id)
	}
	cutoff := now.Add(-w.retention)
	for id, e := range w.graveyard {
		if !e.Deleted.After(cutoff) {
			delete(w.graveyard, id)
		}
	}
	for id := range w.historic {
		e := w.enis[id]
		if e == nil {
			delete(w.historic, id)
			continue
		}
		// Keep the newest entry at or before the cutoff: it is the state a
		// lagged reader sees.
		if n := len(e.history); n > 1 && !e.history[n-2].At.After(cutoff) {
			i := 0
			for i+1 < n && !e.history[i+1].At.After(cutoff) {
				i++
			}
			e.history = e.history[i:]
		}
		if len(e.removed) > 0 {
			e.removed = slices.DeleteFunc(e.removed, func(ip *ipEntry) bool { return !ip.Removed.After(cutoff) })
		}
		if len(e.history) == 1 && len(e.removed) == 0 {
			delete(w.historic, id)
		}
	}
}

func (w *World) setStatus(e *eni, now time.Time, st ENIStatus, inst string, delay time.Duration) {
	e.history = append(e.history, statusChange{At: now, Status: st, Instance: inst})
	e.transitionAt = now.Add(delay)
	w.pending[e.ID] = struct{}{}
	w.historic[e.ID] = struct{}{}
}

type ipAlloc struct {
	sn   *subnet
	addr netip.Addr // invalid = auto
}

// allocate takes every requested address or none.
func (w *World) allocate(reqs []ipAlloc) ([]netip.Addr, *APIError) {
	// Explicit addresses first so an auto pick cannot steal one of them.
	order := make([]int, 0, len(reqs))
	for i, r := range reqs {
		if r.addr.IsValid() {
			order = append(order, i)
		}
	}
	for i, r := range reqs {
		if !r.addr.IsValid() {
			order = append(order, i)
		}
	}
	out := make([]netip.Addr, len(reqs))
	var taken []int
	undo := func() {
		for _, i := range taken {
			reqs[i].sn.pool.release(out[i])
		}
	}
	for _, i := range order {
		r := reqs[i]
		if r.addr.IsValid() {
			switch err := r.sn.pool.allocExact(r.addr); {
			case err == nil:
				out[i] = r.addr
			case errors.Is(err, errOutOfRange):
				undo()
				return nil, apiErr(http.StatusBadRequest, CodeIPOutsideSubnet, "address %s is outside subnet %s (%s)", r.addr, r.sn.ID,
					r.sn.pool.prefix)
			default:
				undo()
				return nil, apiErr(http.StatusBadRequest, CodePrivateIPInUse, "address %s is already in use", r.addr)
			}
		} else {
			a, err := r.sn.pool.allocAny()
			if err != nil {
				undo()
				return nil, apiErr(http.StatusBadRequest, CodeSubnetNoMoreIP, "subnet %s has no more free addresses", r.sn.ID)
			}
			out[i] = a
		}
		taken = append(taken, i)
	}
	return out, nil
}

// resolveIPs validates requests against the ENI's VPC and zone and parses them.
func (w *World) resolveIPs(vpc, zone, defSubnet string, reqs []IPRequest) ([]ipAlloc, *APIError) {
	seen := map[netip.Addr]bool{}
	out := make([]ipAlloc, len(reqs))
	for i, r := range reqs {
		sid := r.Subnet
		if sid == "" {
			sid = defSubnet
		}
		sn := w.subnets[sid]
		if sn == nil {
			return nil, errNoSuchObject("subnet", sid)
		}
		if sn.VPC != vpc || sn.Zone != zone {
			return nil, apiErr(http.StatusBadRequest, CodeVPCMismatch, "subnet %s is not in vpc %s zone %s", sid, vpc, zone)
		}
		out[i].sn = sn
		if r.Addr != "" {
			a, err := netip.ParseAddr(r.Addr)
			if err != nil || !a.Is4() {
				return nil, errBadParam("privateIpAddress %q: not an IPv4 address", r.Addr)
			}
			if seen[a] {
				return nil, errBadParam("address %s requested twice", a)
			}
			seen[a] = true
			out[i].addr = a
		}
	}
	return out, nil
}

// checkCreateIPs validates a create's privateIpSet: exactly one primary,
// every entry in the ENI's subnet, no more than an unattached ENI holds.
func (w *World) checkCreateIPs(reqs []IPRequest, subnetID string) error {
	primaries := 0
	for _, r := range reqs {
		if r.Primary {
			primaries++
		}
		if r.Subnet != "" && r.Subnet != subnetID {
			return errBadParam("privateIpSet entries must be in the eni subnet")
		}
	}
	if primaries != 1 {
		return errBadParam("privateIpSet must hold exactly one primary address, got %d", primaries)
	}
	if w.cfg.CreateENIPrimaryOnly && len(reqs) > 1 {
		return errBadParam("privateIpSet: only the primary address is taken at creation")
	}
	if len(reqs) > maxIPsUnattached {
		return apiErr(http.StatusBadRequest, CodeVMMemoryIPCap, "an eni holds at most %d addresses", maxIPsUnattached)
	}
	return nil
}

// CreateENI creates an ENI (and attaches it when InstanceID is set).
func (w *World) CreateENI(now time.Time, in CreateENIInput) (string, error) {
	w.advance(now)
	if !validName(in.Name) {
		return "", errBadParam("name must be 1 to 256 printable characters")
	}
	sn := w.subnets[in.SubnetID]
	if sn == nil {
		return "", errNoSuchObject("subnet", in.SubnetID)
	}
	// BCE takes exactly one kind of security group per ENI.
	if len(in.SecurityGroupIDs) == 0 && len(in.EnterpriseSecurityGroupIDs) == 0 {
		return "", errBadParam("an eni needs at least one security group")
	}
	if len(in.SecurityGroupIDs) > 0 && len(in.EnterpriseSecurityGroupIDs) > 0 {
		return "", errBadParam("securityGroupIds and enterpriseSecurityGroupIds cannot both be set")
	}
	for _, g := range in.EnterpriseSecurityGroupIDs {
		if !strings.HasPrefix(g, "esg-") || len(g) <= len("esg-") {
			return "", errNoSuchObject("enterprise security group", g)
		}
	}
	for _, g := range in.SecurityGroupIDs {
		if sg := w.sgs[g]; sg == nil || sg.VPC != sn.VPC {
			return "", errNoSuchObject("security group", g)
		}
	}
	switch in.TrafficMode {
	case "":
		in.TrafficMode = "standard"
	case "standard", "highPerformance":
	default:
		return "", errBadParam("networkInterfaceTrafficMode %q: want standard or highPerformance", in.TrafficMode)
	}
	if err := w.checkCreateIPs(in.PrivateIPs, sn.ID); err != nil {
		return "", err
	}
	var inst *instance
	if in.InstanceID != "" {
		var err *APIError
		if inst, err = w.checkAttach(in.InstanceID, sn.VPC, sn.Zone, len(in.PrivateIPs)); err != nil {
			return "", err
		}
	} else if w.unattached(sn.VPC) >= w.cfg.MaxUnattachedENIsPerVPC {
		return "", apiErr(http.StatusBadRequest, CodeQuotaLimitExceeded, "vpc %s already has %d unattached enis", sn.VPC,
			w.cfg.MaxUnattachedENIsPerVPC)
	}
	reqs, aerr := w.resolveIPs(sn.VPC, sn.Zone, sn.ID, in.PrivateIPs)
	if aerr != nil {
		return "", aerr
	}
	addrs, aerr := w.allocate(reqs)
	if aerr != nil {
		return "", aerr
	}
	id := w.newID("eni-", func(id string) bool { return w.enis[id] != nil || w.graveyard[id] != nil })
	e := &eni{ID: id, Name: in.Name, Description: in.Description, Zone: sn.Zone, VPC: sn.VPC, Subnet: sn.ID,
		MAC: w.newMAC(), TrafficMode: in.TrafficMode, SecurityGroups: slices.Clone(in.SecurityGroupIDs),
		EnterpriseSGs: slices.Clone(in.EnterpriseSecurityGroupIDs), Tags: slices.Clone(in.Tags), Created: now,
		history: []statusChange{{At: now, Status: StatusAvailable}}}
	for i, a := range addrs {
		e.IPs = append(e.IPs, &ipEntry{Addr: a, Subnet: sn.ID, Primary: in.PrivateIPs[i].Primary, Added: now})
	}
	w.enis[id] = e
	pos, _ := slices.BinarySearch(w.eniIDs, id)
	w.eniIDs = slices.Insert(w.eniIDs, pos, id)
	if inst != nil {
		w.setStatus(e, now, StatusAttaching, inst.ID, w.cfg.AttachDelay)
	}
	return id, nil
}

func (w *World) unattached(vpc string) int {
	n := 0
	for _, e := range w.enis {
		if e.VPC == vpc && e.instance() == "" {
			n++
		}
	}
	return n
}

// checkAttach validates attaching an ENI with nIPs
// addresses to instance instID.
func (w *World) checkAttach(instID, vpc, zone string, nIPs int) (*instance, *APIError) {
	inst := w.instances[instID]
	if inst == nil {
		return nil, errNoSuchObject("instance", instID)
	}
	if inst.VPC != vpc || inst.Zone != zone {
		return nil, apiErr(http.StatusBadRequest, CodeVPCMismatch, "instance %s is in vpc %s zone %s, eni in vpc %s zone %s", instID,
			inst.VPC, inst.Zone, vpc, zone)
	}
	attached := 0
	for _, o := range w.enis {
		if o.instance() == instID {
			attached++
		}
	}
	if limit := MaxENIsPerInstance(inst.CPU); attached >= limit {
		return nil, apiErr(http.StatusBadRequest, CodeInstanceENICap, "instance %s already has %d enis (cap %d for %d vCPUs)", instID,
			attached, limit, inst.CPU)
	}
	if limit := MaxIPsPerENI(inst.MemoryGB); nIPs > limit {
		return nil, apiErr(http.StatusBadRequest, CodeVMMemoryIPCap, "eni holds %d addresses, instance %s allows %d per eni", nIPs, instID,
			limit)
	}
	return inst, nil
}

// AttachENI attaches an available ENI. The ENI reads "attaching" at once and
// "inuse" after the configured delay.
func (w *World) AttachENI(now time.Time, eniID, instID string) error {
	w.advance(now)
	e := w.enis[eniID]
	if e == nil {
		return errENINotFound(eniID)
	}
	if e.status() != StatusAvailable || e.instance() != "" {
		return apiErr(http.StatusBadRequest, CodeENIState, "eni %s is %s, attach needs available", eniID, e.status())
	}
	if _, err := w.checkAttach(instID, e.VPC, e.Zone, len(e.IPs)); err != nil {
		return err
	}
	w.setStatus(e, now, StatusAttaching, instID, w.cfg.AttachDelay)
	return nil
}

// DetachENI detaches an ENI from instID: "detaching", then "available".
func (w *World) DetachENI(now time.Time, eniID, instID string) error {
	w.advance(now)
	e := w.enis[eniID]
	if e == nil {
		return errENINotFound(eniID)
	}
	st := e.status()
	if (st != StatusInUse && st != StatusAttaching) || (instID != "" && e.instance() != instID) {
		return apiErr(http.StatusBadRequest, CodeENIState, "eni %s is %s on instance %q, cannot detach from %q", eniID, st, e.instance(),
			instID)
	}
	w.setStatus(e, now, StatusDetaching, e.instance(), w.cfg.DetachDelay)
	return nil
}

// DeleteENI deletes an available ENI and frees its addresses.
func (w *World) DeleteENI(now time.Time, eniID string) error {
	w.advance(now)
	e := w.enis[eniID]
	if e == nil {
		return errENINotFound(eniID)
	}
	if e.status() != StatusAvailable || e.instance() != "" {
		return apiErr(http.StatusBadRequest, CodeENIState, "eni %s is %s, delete needs available", eniID, e.status())
	}
	for _, ip := range e.IPs {
		w.subnets[ip.Subnet].pool.release(ip.Addr)
	}
	delete(w.enis, eniID)
	delete(w.pending, eniID)
	delete(w.macs, e.MAC)
	if i, ok := slices.BinarySearch(w.eniIDs, eniID); ok {
		w.eniIDs = slices.Delete(w.eniIDs, i, i+1)
	}
	if w.retention > 0 {
		e.Deleted = now
		w.graveyard[eniID] = e
	}
	return nil
}

// AddIPsInput asks for secondary addresses: either explicit ones (IPs) or
// Count auto-assigned ones from CountSubnet (empty: the ENI's subnet).
type AddIPsInput struct {
	IPs         []IPRequest
	Count       int
	CountSubnet string
}

// AddIPs adds secondary addresses to an ENI, all or nothing.
func (w *World) AddIPs(now time.Time, eniID string, in AddIPsInput) ([]string, error) {
	w.advance(now)
	e := w.enis[eniID]
	if e == nil {
		return nil, errENINotFound(eniID)
	}
	reqs := in.IPs
	switch {
	case len(reqs) > 0 && in.Count > 0:
		return nil, errBadParam("give either privateIpAddresses or privateIpAddressCount, not both")
	case len(reqs) == 0 && in.Count <= 0:
		return nil, errBadParam("give privateIpAddresses or a positive privateIpAddressCount")
	case len(reqs) > MaxBatchIPs || in.Count > MaxBatchIPs:
		return nil, errBadParam("at most %d addresses per call", MaxBatchIPs)
	}
	if len(reqs) == 0 {
		reqs = make([]IPRequest, in.Count)
		for i := range reqs {
			reqs[i].Subnet = in.CountSubnet
		}
	}
	limit := maxIPsUnattached
	if inst := e.instance(); inst != "" {
		limit = MaxIPsPerENI(w.instances[inst].MemoryGB)
	}
	if len(e.IPs)+len(reqs) > limit {
		return nil, apiErr(http.StatusBadRequest, CodeVMMemoryIPCap, "eni %s holds %d addresses, adding %d exceeds the cap of %d", eniID,
			len(e.IPs), len(reqs), limit)
	}
	allocs, aerr := w.resolveIPs(e.VPC, e.Zone, e.Subnet, reqs)
	if aerr != nil {
		return nil, aerr
	}
	addrs, aerr := w.allocate(allocs)
	if aerr != nil {
		return nil, aerr
	}
	out := make([]string, len(addrs))
	for i, a := range addrs {
		e.IPs = append(e.IPs, &ipEntry{Addr: a, Subnet: allocs[i].sn.ID, Added: now})
		out[i] = a.String()
	}
	return out, nil
}

// RemoveIPs releases secondary addresses from an ENI, all or nothing. With a
// replica lag, an address younger than the lag is "not found" (the release
// reached a replica that has not seen it yet) and stays allocated.
func (w *World) RemoveIPs(now time.Time, lag time.Duration, eniID string, addrs []string) error {
	w.advance(now)
	e := w.enis[eniID]
	if e == nil {
		return errENINotFound(eniID)
	}
	if len(addrs) == 0 {
		return errBadParam("give at least one privateIpAddress")
	}
	if len(addrs) > MaxBatchIPs*10 {
		return errBadParam("at most %d addresses per call", MaxBatchIPs*10)
	}
	idx := make([]int, 0, len(addrs))
	seen := map[int]bool{}
	for _, s := range addrs {
		i := slices.IndexFunc(e.IPs, func(ip *ipEntry) bool { return ip.Addr.String() == s })
		if i < 0 || (lag > 0 && e.IPs[i].Added.After(now.Add(-lag))) {
			return apiErr(http.StatusBadRequest, CodePrivateIPNotExist, "address %q is not on eni %s", s, eniID)
		}
		if e.IPs[i].Primary {
			return apiErr(http.StatusBadRequest, CodePrimaryIPRelease, "address %s is the primary address of eni %s", s, eniID)
		}
		if seen[i] {
			return errBadParam("address %s listed twice", s)
		}
		seen[i] = true
		idx = append(idx, i)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(idx)))
	for _, i := range idx {
		ip := e.IPs[i]
		w.subnets[ip.Subnet].pool.release(ip.Addr)
		if w.retention > 0 {
			ip.Removed = now
			e.removed = append(e.removed, ip)
			w.historic[e.ID] = struct{}{}
		}
		e.IPs = slices.Delete(e.IPs, i, i+1)
	}
	return nil
}
