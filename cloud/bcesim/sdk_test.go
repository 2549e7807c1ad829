package bcesim_test

import (
	"net/http"
	"testing"

	"github.com/baidubce/bce-sdk-go/auth"
	"github.com/baidubce/bce-sdk-go/bce"
	"github.com/baidubce/bce-sdk-go/services/bcc"
	"github.com/baidubce/bce-sdk-go/services/eni"
	"github.com/baidubce/bce-sdk-go/services/vpc"

	"github.com/cce-ipam/sharded/cloud/bcesim"
)

const (
	testAK = "test-ak"
	testSK = "test-sk"
)

// sdk bundles unmodified SDK clients. Each sdk owns its http.Client: the SDK
// writes http.Client.Timeout on every request, so one client shared by
// goroutines is a data race; one per goroutine is not.
type sdk struct {
	eni *eni.Client
	vpc *vpc.Client
	bcc *bcc.Client
}

func newSDK(t testing.TB, endpoint, ak, sk string) *sdk {
	t.Helper()
	cred, err := auth.NewBceCredentials(ak, sk)
	if err != nil {
		t.Fatal(err)
	}
	bc := &bce.BceClient{
		Config: &bce.BceClientConfiguration{
			Endpoint: endpoint, Region: "bj", UserAgent: bce.DEFAULT_USER_AGENT, Credentials: cred,
			SignOption: &auth.SignOptions{
				HeadersToSign: auth.DEFAULT_HEADERS_TO_SIGN,
				ExpireSeconds: auth.DEFAULT_EXPIRE_SECONDS,
			},
			// Short backoff so retried 5xx cost milliseconds in tests.
			Retry:                     bce.NewBackOffRetryPolicy(3, 20, 1),
			ConnectionTimeoutInMillis: 10_000,
		},
		Signer:     &auth.BceV1Signer{},
		HTTPClient: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()},
	}
	t.Cleanup(bc.HTTPClient.CloseIdleConnections)
	return &sdk{
		eni: &eni.Client{BceClient: bc},
		vpc: &vpc.Client{BceClient: bc},
		bcc: &bcc.Client{BceClient: bc},
	}
}

// world is a started simulator with one VPC, two subnets, security group and instances.
type world struct {
	srv              *bcesim.Server
	url              string
	subnet, subnet2  string
	sg               string
	small, big, tiny string // instances: 2 CPU/4 GB, 16 CPU/128 GB, 1 CPU/1 GB
}

const (
	testVPC  = "vpc-test"
	testZone = "cn-bj-a"
)

func startWorld(t testing.TB, cfg bcesim.Config) *world {
	t.Helper()
	if cfg.Credentials == nil {
		cfg.Credentials = map[string]string{testAK: testSK}
	}
	srv, err := bcesim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	w := &world{
		srv: srv,
		url: srv.URL(),
	}
	must := func(id string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	w.subnet = must(srv.AddSubnet(bcesim.SubnetSpec{
		ID:       "sbn-a",
		ZoneName: testZone,
		CIDR:     "10.0.0.0/24",
		VPCID:    testVPC,
	}))
	w.subnet2 = must(srv.AddSubnet(bcesim.SubnetSpec{
		ID:       "sbn-b",
		ZoneName: testZone,
		CIDR:     "10.0.1.0/28",
		VPCID:    testVPC,
	}))
	w.sg = must(srv.AddSecurityGroup(bcesim.SecurityGroupSpec{
		ID:    "g-test",
		VPCID: testVPC,
	}))
	w.small = must(srv.AddInstance(bcesim.InstanceSpec{
		ID:               "i-small",
		SubnetID:         w.subnet,
		CPUCount:         2,
		MemoryGB:         4,
		SecurityGroupIDs: []string{w.sg},
	}))
	w.big = must(srv.AddInstance(bcesim.InstanceSpec{
		ID:               "i-big",
		SubnetID:         w.subnet,
		CPUCount:         16,
		MemoryGB:         128,
		SecurityGroupIDs: []string{w.sg},
	}))
	w.tiny = must(srv.AddInstance(bcesim.InstanceSpec{
		ID:               "i-tiny",
		SubnetID:         w.subnet,
		CPUCount:         1,
		MemoryGB:         1,
		SecurityGroupIDs: []string{w.sg},
	}))
	return w
}
