//go:build integration

package subnet_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/subnet"
)

// A Subnet resource no IPPool or PSTS lists (made by hand, by the
// reference, or left by a deleted pool) is refreshed too: at once when it
// appears, not a period later.
func TestController_RefreshesUnlistedSubnets(t *testing.T) {
	w := newWorld(t)
	id := w.subnet("unlisted", "10.79.0.0/24")
	cfg := subnet.DefaultConfig()
	cfg.SyncPeriod = time.Hour // only the new Subnet's event can sync it
	w.run(subnet.NewController(cfg, w.cs, w.provider, nil, prometheus.NewRegistry()))
	if _, err := w.cs.CceV1alpha1().Subnets(cce.SubnetNamespace).Create(w.ctx, &cce.Subnet{
		ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: cce.SubnetNamespace},
		Spec:       cce.SubnetSpec{ID: id, CIDR: "10.79.0.0/24"},
		Status:     cce.SubnetStatus{Enable: true, AvailableIPNum: 0, HasNoMoreIP: true, Reason: "stale"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want, err := w.provider.DescribeSubnet(w.ctx, id)
	if err != nil || want.AvailableIP <= 0 {
		t.Fatalf("cloud subnet %+v, err %v", want, err)
	}
	w.eventually("the unlisted Subnet refreshed from the cloud", func() (bool, string) {
		s, err := w.get(id)
		if err != nil {
			return false, err.Error()
		}
		return int(s.Status.AvailableIPNum) == want.AvailableIP && !s.Status.HasNoMoreIP && s.Status.Reason == "",
			fmt.Sprintf("%+v", s.Status)
	})
}
