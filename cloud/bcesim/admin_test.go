package bcesim_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/baidubce/bce-sdk-go/services/eni"

	"github.com/cce-ipam/sharded/cloud/bcesim"
)

func adminDo(t *testing.T, method, url string, in, out any) int {
	t.Helper()
	var body bytes.Buffer
	if in != nil {
		if err := json.NewEncoder(&body).Encode(in); err != nil {
			t.Fatal(err)
		}
	}
	req, _ := http.NewRequest(method, url, &body)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("%s %s: decode: %v", method, url, err)
		}
	}
	return resp.StatusCode
}

func TestAdmin_HTTPControlsTheWorld(t *testing.T) {
	w := startWorld(t, bcesim.Config{})
	var created map[string]string
	if code := adminDo(t, "POST", w.url+"/admin/subnets", bcesim.SubnetSpec{ZoneName: testZone, CIDR: "10.5.0.0/24", VPCID: testVPC}, &created); code != 200 || created["id"] == "" {
		t.Fatalf("create subnet: %d %v", code, created)
	}
	sn := created["id"]
	if code := adminDo(t, "POST", w.url+"/admin/instances", bcesim.InstanceSpec{ID: "i-admin", SubnetID: sn, CPUCount: 4, MemoryGB: 8}, &created); code != 200 {
		t.Fatalf("create instance: %d", code)
	}
	if code := adminDo(t, "POST", w.url+"/admin/instances", bcesim.InstanceSpec{ID: "i-bad", SubnetID: "sbn-none", CPUCount: 4, MemoryGB: 8}, nil); code != 404 {
		t.Fatalf("instance in a missing subnet: %d", code)
	}
	if code := adminDo(t, "POST", w.url+"/admin/subnets", "not json", nil); code != 400 {
		t.Fatalf("bad body: %d", code)
	}
	var d bcesim.WorldDump
	adminDo(t, "GET", w.url+"/admin/world", nil, &d)
	if len(d.Subnets) != 3 || len(d.Instances) != 4 {
		t.Fatalf("dump: %d subnets %d instances", len(d.Subnets), len(d.Instances))
	}

	// Replica lag over the admin API: a just-added address cannot be released yet.
	c := newSDK(t, w.url, testAK, testSK)
	res, err := c.eni.CreateEni(&eni.CreateEniArgs{Name: "n", SubnetId: sn, SecurityGroupIds: []string{w.sg}, PrivateIpSet: []eni.PrivateIp{{Primary: true}}})
	if err != nil {
		t.Fatal(err)
	}
	var f bcesim.Faults
	if code := adminDo(t, "PUT", w.url+"/admin/faults", bcesim.Faults{ReplicaLagMs: 600_000}, &f); code != 200 || f.ReplicaLagMs != 600_000 {
		t.Fatalf("set lag: %d %+v", code, f)
	}
	ip, err := c.eni.AddPrivateIp(&eni.EniPrivateIpArgs{EniId: res.EniId})
	if err != nil {
		t.Fatal(err)
	}
	err = c.eni.DeletePrivateIp(&eni.EniPrivateIpArgs{EniId: res.EniId, PrivateIpAddress: ip.PrivateIpAddress})
	if se := svcErr(t, err); se.Code != bcesim.CodePrivateIPNotExist {
		t.Fatalf("release under lag: %v", se)
	}
	if got, _ := c.eni.GetEniDetail(res.EniId); got.EniId != "" {
		t.Fatalf("lagged read sees the new eni: %+v", got)
	}
	if code := adminDo(t, "PUT", w.url+"/admin/faults", bcesim.Faults{ErrorRate: map[bcesim.Op]float64{"*": 2}}, nil); code != 400 {
		t.Fatalf("error rate 2 accepted: %d", code)
	}
	if code := adminDo(t, "PUT", w.url+"/admin/faults", bcesim.Faults{ErrorRate: map[bcesim.Op]float64{bcesim.OpGetInstance: 1}}, nil); code != 200 {
		t.Fatalf("clear lag: %d", code)
	}
	if _, err := c.bcc.GetInstanceDetail("i-admin"); svcErr(t, err).StatusCode != 500 {
		t.Fatal("error rate 1 did not fail the call")
	}

	// Rate limits and per-second counters.
	var rl map[string]bcesim.RateLimit
	if code := adminDo(t, "PUT", w.url+"/admin/ratelimits", map[string]bcesim.RateLimit{"DescribeSubnet": {QPS: 0.001, Burst: 2}}, &rl); code != 200 || rl["DescribeSubnet"].Burst != 2 {
		t.Fatalf("set rate limit: %d %v", code, rl)
	}
	if code := adminDo(t, "PUT", w.url+"/admin/ratelimits", map[string]bcesim.RateLimit{"Nope": {QPS: 1, Burst: 1}}, nil); code != 400 {
		t.Fatalf("unknown op accepted: %d", code)
	}
	for range 3 {
		_, _ = c.vpc.GetSubnetDetail(sn) // only the counting matters here
	}
	var st bcesim.Stats
	adminDo(t, "GET", w.url+"/admin/stats", nil, &st)
	ds := st.Ops[bcesim.OpDescribeSubnet]
	if ds.Calls != 3 || ds.Throttled != 1 {
		t.Fatalf("DescribeSubnet stats %+v, want 3 calls 1 throttled", ds)
	}
	var sum int64
	for _, s := range st.All.PerSecond {
		sum += s.Calls
	}
	if sum != st.All.Calls || st.All.Calls < 3+4 {
		t.Fatalf("per-second sums %d, total %d", sum, st.All.Calls)
	}
	var check map[string]bool
	if code := adminDo(t, "GET", w.url+"/admin/check", nil, &check); code != 200 || !check["ok"] {
		t.Fatalf("check: %d %v", code, check)
	}
	if code := adminDo(t, "GET", w.url+"/admin/nothing", nil, nil); code != 404 {
		t.Fatalf("unknown admin path: %d", code)
	}
}

func TestServer_UnknownPathsAndMethodsAnswerJSON(t *testing.T) {
	w := startWorld(t, bcesim.Config{})
	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/v1/nothing", 404, bcesim.CodeInvalidURI},
		{"POST", "/v1/subnet", 405, bcesim.CodeMethodNotAllowed},
		{"PUT", "/v1/eni/eni-1", 400, bcesim.CodeInvalidParameter},
		{"GET", "/v1/eni", 400, bcesim.CodeInvalidAuthHeader}, // routed, then unsigned
	} {
		req, _ := http.NewRequest(tc.method, w.url+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Code, Message, RequestID string }
		_ = json.NewDecoder(resp.Body).Decode(&body) // an undecodable body leaves the fields empty, which the check reports
		resp.Body.Close()
		if resp.StatusCode != tc.status || body.Code != tc.code || resp.Header.Get("x-bce-request-id") == "" {
			t.Errorf("%s %s = %d %q, want %d %q", tc.method, tc.path, resp.StatusCode, body.Code, tc.status, tc.code)
		}
	}
}
