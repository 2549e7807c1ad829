// Package ipclaim is the ledger of the addresses of exclusive subnets
// (PSTS Fixed, Manual and Custom): one IPClaim per address, held by at most
// one pod across every replica, without a lock or an owner per subnet
// (ipamcore/ipam/PSTS.md, "I7, one holder per exclusive-subnet address").
//
// etcd makes the Create of a claim exclusive and the resourceVersion
// precondition makes the takeover of a free claim a compare-and-swap, so
// whatever the replicas' caches say, an address has one holder at a time.
// A freed claim is kept, not deleted: it says when it was freed, and nobody
// takes it for the cooling period while the old pod's datapath drains.
//
// A replica's node owner, on an ADD of a PSTS pod of an exclusive subnet:
//
//	l := ipclaim.New(cfg, cs, factory.Cce().V1alpha1().IPClaims(), nil, log, reg)
//	factory.Start(ctx.Done()) // then wait for l.HasSynced
//
//	h := ipclaim.Holder{Namespace: pod.Namespace, Name: pod.Name}
//	at := ipclaim.Attachment{Node: node, PSTS: psts.Name}
//	err := l.Reserve(ctx, subnetID, oldIP, h, at) // a Fixed pod's old address
//	addr, err := l.Pick(ctx, subnetID, ranges, usable, h, at) // else any free one
//	// add addr to the ENI; PrivateIpInUse: l.Block(ctx, addr, h), pick again
//	// write the wep; on DEL (wep deleted, address off the cloud): l.Free(ctx, addr, h)
//
// Only the claim's holder frees it, except the leader's Keeper, which
//   - frees a held claim whose holder has had no wep naming the address for
//     Config.OrphanGrace (ReservedAt, refreshed by the holder's Reserve,
//     says since when), checked live before the compare-and-swap;
//   - creates the claim of every kept PSTS wep (Fixed, Custom with reuse)
//     that has none: weps written by the reference; a claim held by another
//     pod is reported (log and a Warning event on the wep), never taken;
//   - deletes the free claims of subnets no PSTS lists any more.
//
// A claim whose name is not ClaimName of its spec.ip, or whose holder names
// no pod, is corrupt: nobody takes it, the Keeper reports it (log, Warning
// event, cce_ipam_ipclaim_corrupt) and an operator deletes or fixes it.
package ipclaim
