package ipam_test

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

// The flags hold the only defaults; DefaultConfig is a command line without
// flags, and the required IDs are the only thing it lacks.
func TestConfig_DefaultsAreTheFlags(t *testing.T) {
	var flagged ipam.Config
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	flagged.RegisterFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if def := ipam.DefaultConfig(); def != flagged {
		t.Fatalf("DefaultConfig() = %+v, want the flag defaults %+v", def, flagged)
	}
	want := ipam.Config{
		CNIMode: ipam.CNIModeSecondaryIPVeth,
		IdleMin: 2, IdleMax: 6, BatchAdd: 4,
		PoolCheckPeriod: 30 * time.Second, AllocateWait: 10 * time.Second,
		Cooldown: 5 * time.Second, ReadLag: 5 * time.Second,
		ENISyncPeriod: 20 * time.Second, LeakedENIAge: 3 * time.Minute,
		ENICreateWithIPs: true, // a new ENI for waiting pods holds their addresses (eni.go)
		SubnetSelection:  ipam.SubnetMostFreeIP,
		GCPeriod:         120 * time.Second, LeakGrace: 10 * time.Minute,
		SubnetAvailableIndex: 2, // the reference's --subnet-available-index
	}
	if flagged != want {
		t.Fatalf("flag defaults %+v, want %+v (users' command lines must not change)", flagged, want)
	}
	err := flagged.Validate()
	if err == nil || !strings.Contains(err.Error(), "cluster ID is required") || !strings.Contains(err.Error(), "VPC ID is required") {
		t.Fatalf("Validate() of the defaults = %v, want only the required IDs missing", err)
	}
	flagged.ClusterID, flagged.VPCID = "c", "vpc"
	if err := flagged.Validate(); err != nil {
		t.Fatalf("Validate() of the defaults with IDs = %v", err)
	}
}

// A zero is never taken to mean the default: Validate says what is wrong.
func TestConfig_Validate_RejectsUnusableValues(t *testing.T) {
	for name, tc := range map[string]struct {
		change func(*ipam.Config)
		want   string
	}{
		"zero pool check period": {func(c *ipam.Config) { c.PoolCheckPeriod = 0 }, "pool check period 0s"},
		"zero allocate wait":     {func(c *ipam.Config) { c.AllocateWait = 0 }, "allocate wait 0s"},
		"zero cooling":           {func(c *ipam.Config) { c.Cooldown = 0 }, "cooling period 0s"},
		"zero read lag":          {func(c *ipam.Config) { c.ReadLag = 0 }, "cloud read lag 0s"},
		"zero ENI sync":          {func(c *ipam.Config) { c.ENISyncPeriod = 0 }, "ENI sync period 0s"},
		"zero leaked ENI age":    {func(c *ipam.Config) { c.LeakedENIAge = 0 }, "leaked ENI age 0s"},
		"zero GC period":         {func(c *ipam.Config) { c.GCPeriod = 0 }, "GC period 0s"},
		"negative leak grace":    {func(c *ipam.Config) { c.LeakGrace = -time.Second }, "leaked IP grace -1s"},
		"zero batch":             {func(c *ipam.Config) { c.BatchAdd = 0 }, "batch 0"},
		"zero idle min":          {func(c *ipam.Config) { c.IdleMin = 0 }, "min idle 0"},
		"max below min":          {func(c *ipam.Config) { c.IdleMax = 1 }, "max idle 1 below min idle 2"},
		"no subnet selection":    {func(c *ipam.Config) { c.SubnetSelection = "" }, "subnet selection"},
		"no CNI mode":            {func(c *ipam.Config) { c.CNIMode = "" }, `CNI mode "": want one of`},
		"vpc-route mode":         {func(c *ipam.Config) { c.CNIMode = "vpc-route-veth" }, "cce-ipam has nothing to serve"},
		"cross-VPC mode":         {func(c *ipam.Config) { c.CNIMode = "crossvpc-eni" }, "cross-VPC ENIs are not served"},
		"unknown mode":           {func(c *ipam.Config) { c.CNIMode = "kubenet" }, `CNI mode "kubenet": want one of`},
	} {
		t.Run(name, func(t *testing.T) {
			c := ipam.DefaultConfig()
			c.ClusterID, c.VPCID = "c", "vpc"
			tc.change(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error mentioning %q", err, tc.want)
			}
			if _, err := ipam.New(c, ipam.Deps{}, nil, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New() = %v, want the config refused", err)
			}
		})
	}
}

// Every vpc-secondary-ip mode and its BBC variant is accepted: the datapath
// suffix is the node agent's business, not the IPAM's.
func TestConfig_Validate_AcceptsSecondaryIPModes(t *testing.T) {
	for _, mode := range []string{
		"vpc-secondary-ip-veth", "vpc-secondary-ip-ipvlan", "vpc-secondary-ip-auto-detect",
		"bbc-vpc-secondary-ip-veth", "bbc-vpc-secondary-ip-ipvlan", "bbc-vpc-secondary-ip-auto-detect",
	} {
		c := ipam.DefaultConfig()
		c.ClusterID, c.VPCID, c.CNIMode = "c", "vpc", mode
		if err := c.Validate(); err != nil {
			t.Errorf("Validate() with --cni-mode=%s = %v, want accepted", mode, err)
		}
		if got, want := ipam.CNIModeServesBBC(mode), strings.HasPrefix(mode, "bbc-"); got != want {
			t.Errorf("CNIModeServesBBC(%s) = %v, want %v", mode, got, want)
		}
	}
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	var c ipam.Config
	c.RegisterFlags(fs)
	if err := fs.Parse([]string{"--cni-mode=vpc-secondary-ip-ipvlan"}); err != nil || c.CNIMode != "vpc-secondary-ip-ipvlan" {
		t.Fatalf("--cni-mode=vpc-secondary-ip-ipvlan parsed to %q, %v", c.CNIMode, err)
	}
}
