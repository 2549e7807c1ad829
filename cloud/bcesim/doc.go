// Package bcesim is a local simulator of the Baidu Cloud (BCE) OpenAPI that
// the ENI IPAM uses: ENIs and their private IPs, VPC subnets, BCC instances
// and security groups. It serves the unmodified bce-sdk-go over plain HTTP,
// verifies every bce-auth-v1 signature, and answers with BCE's JSON shapes
// and error codes (spec: shared/spec/bce-openapi.md).
//
// The package has two layers. World is a pure model (no I/O, time passed in):
// subnets hand out addresses from a bitmap so availableIp is exact and no
// address is ever held twice, instances cap ENIs by vCPU and addresses per
// ENI by memory, and ENIs move available → attaching → inuse → detaching.
// Server puts the BCE HTTP surface on top and adds what a real cloud does to
// a client: per-operation token buckets answering 429 RateLimit, latency,
// injected 5xx (also after a mutation was applied, which the SDK retries),
// replica lag on reads, clientToken idempotency, and per-second call counters.
//
// In a test:
//
//	srv, _ := bcesim.New(bcesim.Config{Credentials: map[string]string{"ak": "sk"}, PageSize: 50})
//	if _, err := srv.Start("127.0.0.1:0"); err != nil { ... }
//	t.Cleanup(func() { srv.Close() })
//	sn, _ := srv.AddSubnet(bcesim.SubnetSpec{ZoneName: "cn-bj-a", CIDR: "10.0.0.0/20", VPCID: "vpc-1"})
//	sg, _ := srv.AddSecurityGroup(bcesim.SecurityGroupSpec{VPCID: "vpc-1"})
//	srv.AddInstance(bcesim.InstanceSpec{SubnetID: sn, CPUCount: 8, MemoryGB: 32, SecurityGroupIDs: []string{sg}})
//	// point the SDK (or cloud.New) at srv.URL(); inspect with srv.Dump(),
//	// srv.Check() and srv.Stats(); misbehave with srv.SetFaults(...).
//
// As a process, cmd/bce-sim wraps the same Server and exposes the same
// controls over the admin API under /admin/ (see admin.go).
package bcesim
