package bcesim

import (
	"time"
)

type (
	createENIResult struct {
		ENIID string `json:"eniId"`
	}
	addIPResult struct {
		PrivateIPAddress string `json:"privateIpAddress"`
	}
	batchAddResult struct {
		PrivateIPAddresses []string `json:"privateIpAddresses"`
	}
	eniStatusResult struct {
		Status ENIStatus `json:"status"`
	}
	subnetResult struct {
		Subnet SubnetView `json:"subnet"`
	}
	instanceResult struct {
		Instance InstanceView `json:"instance"`
	}
	// empty is the body of calls without a result: the SDK ignores it, but
	// an explicit "{}" keeps every success a JSON document.
	empty struct{}
)

// dispatch maps a decoded call to the world. The caller holds s.mu.
func (s *Server) dispatch(c *call, now time.Time, lag time.Duration) (any, error) {
	w := s.world
	switch c.op {
	case OpListENIs:
		a := c.arg.(listArgs)
		return w.ListENIs(now, lag, a.eni, a.marker, min(a.maxKeys, s.cfg.PageSize))
	case OpGetENI:
		return w.GetENI(now, lag, c.id)
	case OpENIStatus:
		v, err := w.GetENI(now, lag, c.id)
		return eniStatusResult{Status: v.Status}, err
	case OpENIQuota:
		a := c.arg.(listArgs)
		return w.ENIQuota(now, a.instanceID, a.eniID)
	case OpCreateENI:
		id, err := w.CreateENI(now, c.arg.(CreateENIInput))
		return createENIResult{ENIID: id}, err
	case OpAttachENI:
		return empty{}, w.AttachENI(now, c.id, c.arg.(string))
	case OpDetachENI:
		return empty{}, w.DetachENI(now, c.id, c.arg.(string))
	case OpDeleteENI:
		return empty{}, w.DeleteENI(now, c.id)
	case OpAddPrivateIP:
		ips, err := w.AddIPs(now, c.id, c.arg.(AddIPsInput))
		if err != nil {
			return nil, err
		}
		return addIPResult{PrivateIPAddress: ips[0]}, nil
	case OpBatchAddPrivateIP, OpBatchAddPrivateIPCrossSubnet:
		ips, err := w.AddIPs(now, c.id, c.arg.(AddIPsInput))
		return batchAddResult{PrivateIPAddresses: ips}, err
	case OpDeletePrivateIP, OpBatchDeletePrivateIP:
		return empty{}, w.RemoveIPs(now, lag, c.id, c.arg.([]string))
	case OpDescribeSubnet:
		v, err := w.GetSubnet(c.id)
		return subnetResult{Subnet: v}, err
	case OpListSubnets:
		a := c.arg.(listArgs)
		return w.ListSubnets(a.subnet, a.marker, min(a.maxKeys, s.cfg.PageSize))
	case OpGetInstance:
		v, err := w.GetInstance(c.id)
		return instanceResult{Instance: v}, err
	case OpListSecurityGroups:
		a := c.arg.(listArgs)
		return w.ListSecurityGroups(a.instanceID, a.vpcID, a.marker, min(a.maxKeys, s.cfg.PageSize))
	}
	return nil, errBadParam("operation %s is not implemented", c.op)
}
