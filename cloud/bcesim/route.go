package bcesim

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Op names one BCE operation; rate limits, faults and call counters are per Op.
type Op string

// Operations the simulator serves.
const (
	OpListENIs                     Op = "ListENIs"
	OpGetENI                       Op = "GetENI"
	OpCreateENI                    Op = "CreateENI"
	OpAttachENI                    Op = "AttachENI"
	OpDetachENI                    Op = "DetachENI"
	OpDeleteENI                    Op = "DeleteENI"
	OpAddPrivateIP                 Op = "AddPrivateIP"
	OpBatchAddPrivateIP            Op = "BatchAddPrivateIP"
	OpBatchAddPrivateIPCrossSubnet Op = "BatchAddPrivateIPCrossSubnet"
	OpDeletePrivateIP              Op = "DeletePrivateIP"
	OpBatchDeletePrivateIP         Op = "BatchDeletePrivateIP"
	OpENIQuota                     Op = "ENIQuota"
	OpENIStatus                    Op = "ENIStatus"
	OpDescribeSubnet               Op = "DescribeSubnet"
	OpListSubnets                  Op = "ListSubnets"
	OpGetInstance                  Op = "GetInstance"
	OpListSecurityGroups           Op = "ListSecurityGroups"
)

// AllOps lists every operation, for flags and the admin API.
var AllOps = []Op{OpListENIs, OpGetENI, OpCreateENI, OpAttachENI, OpDetachENI, OpDeleteENI, OpAddPrivateIP,
	OpBatchAddPrivateIP, OpBatchAddPrivateIPCrossSubnet, OpDeletePrivateIP, OpBatchDeletePrivateIP, OpENIQuota,
	OpENIStatus, OpDescribeSubnet, OpListSubnets, OpGetInstance, OpListSecurityGroups}

// Mutating reports whether op changes the world (and so honours clientToken).
func (o Op) Mutating() bool {
	switch o {
	case OpCreateENI, OpAttachENI, OpDetachENI, OpDeleteENI, OpAddPrivateIP, OpBatchAddPrivateIP,
		OpBatchAddPrivateIPCrossSubnet, OpDeletePrivateIP, OpBatchDeletePrivateIP:
		return true
	}
	return false
}

// call is a routed request: the operation and its path parameters.
type call struct {
	op  Op
	id  string // eni, subnet or instance ID from the path
	ip  string // address from DELETE .../privateIp/{ip}
	arg any    // decoded input, set by decode
}

// route maps method and decoded path to an operation.
func route(method, path string, q url.Values) (*call, *APIError) {
	seg := strings.Split(strings.Trim(path, "/"), "/")
	want := func(m string, c *call) (*call, *APIError) {
		if method != m {
			return nil, apiErr(http.StatusMethodNotAllowed, CodeMethodNotAllowed, "%s not allowed on %s", method, path)
		}
		return c, nil
	}
	n := len(seg)
	switch {
	case n == 2 && seg[0] == "v1" && seg[1] == "eni":
		if method == http.MethodPost {
			return &call{op: OpCreateENI}, nil
		}
		return want(http.MethodGet, &call{op: OpListENIs})
	case n == 3 && seg[0] == "v1" && seg[1] == "eni" && seg[2] == "quota":
		return want(http.MethodGet, &call{op: OpENIQuota})
	case n == 3 && seg[0] == "v1" && seg[1] == "eni" && seg[2] != "":
		id := seg[2]
		switch method {
		case http.MethodGet:
			return &call{op: OpGetENI, id: id}, nil
		case http.MethodDelete:
			return &call{op: OpDeleteENI, id: id}, nil
		case http.MethodPut:
			_, attach := q["attach"]
			_, detach := q["detach"]
			switch {
			case attach && !detach:
				return &call{op: OpAttachENI, id: id}, nil
			case detach && !attach:
				return &call{op: OpDetachENI, id: id}, nil
			}
			return nil, errBadParam("PUT on an eni needs exactly one of ?attach or ?detach")
		}
		return want(http.MethodGet, nil)
	case n == 4 && seg[0] == "v1" && seg[1] == "eni" && seg[2] != "" && seg[3] == "status":
		return want(http.MethodGet, &call{op: OpENIStatus, id: seg[2]})
	case n == 4 && seg[0] == "v1" && seg[1] == "eni" && seg[2] != "" && seg[3] == "privateIp":
		return want(http.MethodPost, &call{op: OpAddPrivateIP, id: seg[2]})
	case n == 5 && seg[0] == "v1" && seg[1] == "eni" && seg[2] != "" && seg[3] == "privateIp" && seg[4] != "":
		switch {
		case method == http.MethodPost && seg[4] == "batchAdd":
			return &call{op: OpBatchAddPrivateIP, id: seg[2]}, nil
		case method == http.MethodPost && seg[4] == "batchAddCrossSubnet":
			return &call{op: OpBatchAddPrivateIPCrossSubnet, id: seg[2]}, nil
		case method == http.MethodPost && seg[4] == "batchDel":
			return &call{op: OpBatchDeletePrivateIP, id: seg[2]}, nil
		}
		return want(http.MethodDelete, &call{op: OpDeletePrivateIP, id: seg[2], ip: seg[4]})
	case n == 2 && seg[0] == "v1" && seg[1] == "subnet":
		return want(http.MethodGet, &call{op: OpListSubnets})
	case n == 3 && seg[0] == "v1" && seg[1] == "subnet" && seg[2] != "":
		return want(http.MethodGet, &call{op: OpDescribeSubnet, id: seg[2]})
	case n == 3 && seg[0] == "v2" && seg[1] == "instance" && seg[2] != "":
		return want(http.MethodGet, &call{op: OpGetInstance, id: seg[2]})
	case n == 2 && seg[0] == "v2" && seg[1] == "securityGroup":
		return want(http.MethodGet, &call{op: OpListSecurityGroups})
	}
	return nil, apiErr(http.StatusNotFound, CodeInvalidURI, "no operation at %s %s", method, path)
}

// Request bodies, as the SDK marshals them.
type (
	createENIBody struct {
		Name                       string          `json:"name"`
		SubnetID                   string          `json:"subnetId"`
		InstanceID                 string          `json:"instanceId"`
		SecurityGroupIDs           []string        `json:"securityGroupIds"`
		EnterpriseSecurityGroupIDs []string        `json:"enterpriseSecurityGroupIds"`
		PrivateIPSet               []PrivateIPView `json:"privateIpSet"`
		IPv6PrivateIPSet           []PrivateIPView `json:"ipv6PrivateIpSet"`
		Description                string          `json:"description"`
		Tags                       []Tag           `json:"tags"`
		TrafficMode                string          `json:"networkInterfaceTrafficMode"`
	}
	eniInstanceBody struct {
		InstanceID *string `json:"instanceId"`
	}
	privateIPBody struct {
		PrivateIPAddress string `json:"privateIpAddress"`
		IsIPv6           bool   `json:"isIpv6"`
	}
	batchIPBody struct {
		PrivateIPAddresses    []string `json:"privateIpAddresses"`
		PrivateIPAddressCount int      `json:"privateIpAddressCount"`
		IsIPv6                bool     `json:"isIpv6"`
	}
	crossSubnetBody struct {
		SubnetID   string `json:"subnetId"`
		PrivateIPs []struct {
			PrivateIPAddress string `json:"privateIpAddress"`
			SubnetID         string `json:"subnetId"`
		} `json:"privateIps"`
		PrivateIPAddressCount int  `json:"privateIpAddressCount"`
		IsIPv6                bool `json:"isIpv6"`
	}
)

// listArgs is the decoded query of a list call.
type listArgs struct {
	marker  string
	maxKeys int
	eni     ENIFilter
	subnet  SubnetFilter
	// instanceID and vpcID for quota and security group lists.
	instanceID, vpcID, eniID string
}

func decodeJSON(body []byte, v any) *APIError {
	if len(body) == 0 {
		return apiErr(http.StatusBadRequest, CodeMalformedJSON, "request body is empty")
	}
	if err := json.Unmarshal(body, v); err != nil {
		return apiErr(http.StatusBadRequest, CodeMalformedJSON, "request body: %v", err)
	}
	return nil
}

func parseMaxKeys(q url.Values) (int, *APIError) {
	s := q.Get("maxKeys")
	if s == "" {
		return 1000, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 1000 {
		return 0, errBadParam("maxKeys %q must be an integer in [1,1000]", s)
	}
	return n, nil
}

var errNoIPv6 = errBadParam("ipv6 addresses are not simulated")

// decode parses the query and body of a routed call into c.arg.
func decode(c *call, q url.Values, body []byte) *APIError {
	var arg any
	var err *APIError
	switch c.op {
	case OpListENIs, OpListSubnets, OpListSecurityGroups, OpENIQuota:
		arg, err = decodeList(q)
	case OpCreateENI:
		arg, err = decodeCreateENI(body)
	case OpAttachENI, OpDetachENI:
		arg, err = decodeInstanceID(body)
	case OpAddPrivateIP:
		arg, err = decodeAddIP(body)
	case OpBatchAddPrivateIP:
		arg, err = decodeBatchAdd(body)
	case OpBatchAddPrivateIPCrossSubnet:
		arg, err = decodeCrossSubnetAdd(body)
	case OpDeletePrivateIP:
		arg = []string{c.ip}
	case OpBatchDeletePrivateIP:
		var b batchIPBody
		err = decodeJSON(body, &b)
		arg = b.PrivateIPAddresses
	default:
		return nil
	}
	if err != nil {
		return err
	}
	c.arg = arg
	return nil
}

// decodeList reads the query of a list call.
func decodeList(q url.Values) (listArgs, *APIError) {
	mk, err := parseMaxKeys(q)
	if err != nil {
		return listArgs{}, err
	}
	a := listArgs{
		marker:     q.Get("marker"),
		maxKeys:    mk,
		instanceID: q.Get("instanceId"),
		vpcID:      q.Get("vpcId"),
		eniID:      q.Get("eniId"),
	}
	a.eni = ENIFilter{VPCID: a.vpcID, InstanceID: a.instanceID, Name: q.Get("name")}
	if ips := q.Get("privateIpAddress"); ips != "" {
		a.eni.PrivateIPs = strings.Split(ips, ",")
	}
	a.subnet = SubnetFilter{VPCID: a.vpcID, ZoneName: q.Get("zoneName"), SubnetType: q.Get("subnetType")}
	if ids := q.Get("subnetIds"); ids != "" {
		a.subnet.SubnetIDs = strings.Split(ids, ",")
	}
	return a, nil
}

func decodeCreateENI(body []byte) (CreateENIInput, *APIError) {
	var b createENIBody
	if err := decodeJSON(body, &b); err != nil {
		return CreateENIInput{}, err
	}
	if len(b.IPv6PrivateIPSet) > 0 {
		return CreateENIInput{}, errNoIPv6
	}
	in := CreateENIInput{
		Name:                       b.Name,
		SubnetID:                   b.SubnetID,
		InstanceID:                 b.InstanceID,
		Description:                b.Description,
		TrafficMode:                b.TrafficMode,
		SecurityGroupIDs:           b.SecurityGroupIDs,
		EnterpriseSecurityGroupIDs: b.EnterpriseSecurityGroupIDs,
		Tags:                       b.Tags,
	}
	for _, p := range b.PrivateIPSet {
		in.PrivateIPs = append(in.PrivateIPs, IPRequest{Addr: p.PrivateIPAddress, Primary: p.Primary, Subnet: p.SubnetID})
	}
	return in, nil
}

// decodeInstanceID reads the instance of an attach or detach.
func decodeInstanceID(body []byte) (string, *APIError) {
	var b eniInstanceBody
	if err := decodeJSON(body, &b); err != nil {
		return "", err
	}
	if b.InstanceID == nil || *b.InstanceID == "" {
		return "", errBadParam("instanceId is required")
	}
	return *b.InstanceID, nil
}

func decodeAddIP(body []byte) (AddIPsInput, *APIError) {
	var b privateIPBody
	if err := decodeJSON(body, &b); err != nil {
		return AddIPsInput{}, err
	}
	if b.IsIPv6 {
		return AddIPsInput{}, errNoIPv6
	}
	return AddIPsInput{IPs: []IPRequest{{Addr: b.PrivateIPAddress}}}, nil
}

func decodeBatchAdd(body []byte) (AddIPsInput, *APIError) {
	var b batchIPBody
	if err := decodeJSON(body, &b); err != nil {
		return AddIPsInput{}, err
	}
	if b.IsIPv6 {
		return AddIPsInput{}, errNoIPv6
	}
	in := AddIPsInput{Count: b.PrivateIPAddressCount}
	for _, a := range b.PrivateIPAddresses {
		if a == "" {
			return AddIPsInput{}, errBadParam("privateIpAddresses holds an empty address")
		}
		in.IPs = append(in.IPs, IPRequest{Addr: a})
	}
	return in, nil
}

// decodeCrossSubnetAdd reads a cross-subnet batch add: a count of addresses
// of subnetId, or explicit addresses, each in its own subnetId (the call's
// when empty, the ENI's when both are; the SDK sends the call's empty with
// explicit addresses).
func decodeCrossSubnetAdd(body []byte) (AddIPsInput, *APIError) {
	var b crossSubnetBody
	if err := decodeJSON(body, &b); err != nil {
		return AddIPsInput{}, err
	}
	if b.IsIPv6 {
		return AddIPsInput{}, errNoIPv6
	}
	switch {
	case len(b.PrivateIPs) > 0 && b.PrivateIPAddressCount > 0:
		return AddIPsInput{}, errBadParam("give either privateIps or privateIpAddressCount, not both")
	case b.PrivateIPAddressCount > 0 && b.SubnetID == "":
		return AddIPsInput{}, errBadParam("privateIpAddressCount needs the subnetId to take the addresses from")
	}
	in := AddIPsInput{Count: b.PrivateIPAddressCount, CountSubnet: b.SubnetID}
	for _, p := range b.PrivateIPs {
		if p.PrivateIPAddress == "" {
			return AddIPsInput{}, errBadParam("privateIps holds an entry without privateIpAddress")
		}
		sid := p.SubnetID
		if sid == "" {
			sid = b.SubnetID
		}
		in.IPs = append(in.IPs, IPRequest{Addr: p.PrivateIPAddress, Subnet: sid})
	}
	return in, nil
}
