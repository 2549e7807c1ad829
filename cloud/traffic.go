package cloud

import (
	"strconv"
	"strings"

	"github.com/baidubce/bce-sdk-go/bce"
	"github.com/baidubce/bce-sdk-go/http"
	"github.com/baidubce/bce-sdk-go/services/eni"
)

// The SDK's eni.Eni lacks networkInterfaceTrafficMode, so the ENI list is
// decoded into listedENI instead (the same request as eni.Client.ListEni).
// ERIs and RoCE interfaces ("highPerformance") are listed alongside ENIs,
// and are not ours: their IPs belong to their own IPAM. ListENIs drops them,
// so nothing downstream (adoption, the ENI sync, leaked-IP and leaked-ENI
// GC) ever sees one.

// trafficModeStandard is the mode of an ordinary ENI.
const trafficModeStandard = "standard"

type listedENI struct {
	eni.Eni
	TrafficMode string `json:"networkInterfaceTrafficMode"`
}

type listENIResult struct {
	ENIs        []listedENI `json:"enis"`
	IsTruncated bool        `json:"isTruncated"`
	NextMarker  string      `json:"nextMarker"`
}

// standardENI reports whether a listed interface is an ordinary ENI. An
// empty mode counts as one: the field is optional in older replies, and an
// ERI always carries its mode.
func standardENI(mode string) bool {
	return mode == "" || strings.EqualFold(mode, trafficModeStandard)
}

// listENIPage sends one ListENIs request, as eni.Client.ListEni does.
func listENIPage(c *eni.Client, args *eni.ListEniArgs) (*listENIResult, error) {
	res := &listENIResult{}
	b := bce.NewRequestBuilder(c).
		WithURL(eni.URI_PREFIX+eni.REQUEST_ENI_URL).
		WithMethod(http.GET).
		WithQueryParam("vpcId", args.VpcId).
		WithQueryParamFilter("instanceId", args.InstanceId).
		WithQueryParamFilter("name", args.Name).
		WithQueryParamFilter("marker", args.Marker).
		WithQueryParamFilter("maxKeys", strconv.Itoa(args.MaxKeys))
	if len(args.PrivateIpAddress) > 0 {
		b.WithQueryParam("privateIpAddress", strings.Join(args.PrivateIpAddress, ","))
	}
	return res, b.WithResult(res).Do()
}
