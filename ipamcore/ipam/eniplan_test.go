package ipam

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

func TestPlanPlacement(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"zone": "a", "kind": "gpu"}}}
	pool := func(name, selector string, prio int32, subnets []string, sgs, esgs []string) cce.IPPool {
		return cce.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cce.IPPoolNamespace},
			Spec: cce.IPPoolSpec{NodeSelector: selector, Priority: prio,
				ENI: cce.ENISpec{Subnets: subnets, SecurityGroups: sgs, EnterpriseSecurityGroups: esgs}}}
	}
	own := pool(cce.IPPoolName("n1"), "kubernetes.io/hostname=n1", 0, []string{"sbn-own"}, []string{"g-own"}, nil)
	crs := map[string]*cce.Subnet{
		"sbn-excl": {Spec: cce.SubnetSpec{Exclusive: true}, Status: cce.SubnetStatus{Enable: true}},
		"sbn-off":  {Status: cce.SubnetStatus{Enable: false}},
		"sbn-full": {Status: cce.SubnetStatus{Enable: true, HasNoMoreIP: true}},
		"sbn-a":    {Status: cce.SubnetStatus{Enable: true}},
		"sbn-b":    {Status: cce.SubnetStatus{Enable: true}},
	}
	subnet := func(id string) *cce.Subnet { return crs[id] }
	for _, tc := range []struct {
		name        string
		pools       []cce.IPPool
		wantSubnets []string
		wantSGs     []string
		wantESGs    []string
		wantErr     string
	}{
		{"own pool only (its selector need not match the labels)", []cce.IPPool{own}, []string{"sbn-own"}, []string{"g-own"}, nil, ""},
		{"top priority wins; union of equal top pools in name order, groups from the own pool", []cce.IPPool{
			own,
			pool("p-low", "zone=a", 1, []string{"sbn-low"}, nil, nil),
			pool("p-top2", "kind=gpu", 7, []string{"sbn-b", "sbn-a"}, nil, nil),
			pool("p-top1", "zone=a,kind=gpu", 7, []string{"sbn-a", "sbn-new"}, []string{"g-top"}, nil),
			pool("p-other", "zone=b", 99, []string{"sbn-other"}, nil, nil),
		}, []string{"sbn-a", "sbn-new", "sbn-b"}, []string{"g-own"}, nil, ""},
		{"exclusive, disabled and exhausted dropped; unknown subnet kept", []cce.IPPool{
			own, pool("p", "zone=a", 3, []string{"sbn-excl", "sbn-off", "sbn-full", "sbn-unknown"}, nil, nil),
		}, []string{"sbn-unknown"}, []string{"g-own"}, nil, ""},
		{"nothing qualifies", []cce.IPPool{
			own, pool("p", "zone=a", 3, []string{"sbn-excl", "sbn-off", "sbn-full"}, nil, nil),
		}, nil, nil, nil, "no subnet qualifies for a new ENI among the top-priority IPPools (priority 3: default/p): sbn-excl exclusive"},
		{"no own pool: groups from the first top pool that sets any", []cce.IPPool{
			pool("p2", "zone=a", 1, []string{"sbn-a"}, nil, []string{"esg-2"}),
			pool("p1", "zone=a", 1, []string{"sbn-b"}, nil, nil),
		}, []string{"sbn-b", "sbn-a"}, nil, []string{"esg-2"}, ""},
		{"enterprise groups only", []cce.IPPool{pool(cce.IPPoolName("n1"), "", 0, []string{"sbn-a"}, nil, []string{"esg-1"})},
			[]string{"sbn-a"}, nil, []string{"esg-1"}, ""},
		{"both kinds refused", []cce.IPPool{pool(cce.IPPoolName("n1"), "", 0, []string{"sbn-a"}, []string{"g"}, []string{"esg-1"})},
			nil, nil, nil, "sets both securityGroups and enterpriseSecurityGroups"},
		{"neither kind refused", []cce.IPPool{pool(cce.IPPoolName("n1"), "", 0, []string{"sbn-a"}, nil, nil)},
			nil, nil, nil, "sets neither securityGroups nor enterpriseSecurityGroups"},
		{"no pool selects the node", []cce.IPPool{pool("p", "zone=b", 0, []string{"sbn-a"}, []string{"g"}, nil)},
			nil, nil, nil, errNoPool.Error()},
		{"malformed selector skipped and named", []cce.IPPool{pool("bad", "zone in (", 0, []string{"sbn-a"}, []string{"g"}, nil)},
			nil, nil, nil, "default/bad"},
		{"top pools list no subnet", []cce.IPPool{own, pool("p", "zone=a", 2, nil, nil, nil)},
			nil, nil, nil, "list none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := planPlacement(node, tc.pools, subnet)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Subnets, tc.wantSubnets) || !slices.Equal(got.SecurityGroups, tc.wantSGs) ||
				!slices.Equal(got.EnterpriseGroups, tc.wantESGs) {
				t.Fatalf("placement = %+v, want subnets %v groups %v enterprise %v", got, tc.wantSubnets, tc.wantSGs, tc.wantESGs)
			}
		})
	}
}
