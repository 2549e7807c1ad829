// Package webhook serves the admission webhooks of PodSubnetTopologySpread
// (PSTS) in every replica, with certificates the replicas manage themselves.
//
//	srv, err := webhook.New(cfg, webhook.Deps{Kube: kube, CCE: cceClient, Cloud: provider}, logger, reg)
//	...
//	err = srv.Run(ctx) // serves until ctx ends, then shuts down gracefully
//
// Any replica answers any review: the API server calls the chart's Service,
// which spreads calls over the ready replicas, and a review reads only
// informer caches of PSTS and Subnet objects (few and small), never the
// shard. A PSTS review also asks the cloud and lists the IPPools once (from
// the API server's watch cache): IPPools are not cached, since their status
// carries every ENI and address of the cluster and every replica would hold
// them all, while PSTS objects change rarely.
//
// # The pod webhook (PathMutatePods, CREATE of pods)
//
// A new pod without the cce.baidubce.com/PodSubnetTopologySpread annotation
// gets the PSTS psts.Match picks (its namespace, highest priority), and a
// JSON Patch that sets the annotation, ANDs a required node affinity to the
// zones of the PSTS's usable subnets (Subnet resources that are enabled and
// not hasNoMoreIP) into every required node selector term (or adds a term),
// requests and limits one cce.baidubce.com/ip on the first container, and
// adds a zone topology spread constraint when the PSTS enables it. A pod
// annotated by its author keeps the annotation and gets the rest for the
// PSTS it names, if that exists. Other pods, and host-network pods (they
// take no IP from the IPAM), pass unchanged. The patch is idempotent, so the
// webhook can be invoked again after other webhooks (reinvocationPolicy
// IfNeeded) without adding anything twice.
//
// Zones: a Subnet's availabilityZone is BCE's zone name ("cn-bj-a"). CCE
// labels its nodes topology.kubernetes.io/zone=zoneA, and the reference
// webhook translates the name the same way, so ZoneFormatCCE is the
// default; clusters whose nodes carry BCE's names (self-built clusters, the
// kubelet simulator) use ZoneFormatRaw. The label key is Config.ZoneLabel.
//
// # The PSTS webhook (PathValidatePSTS, CREATE and UPDATE of PSTS)
//
// A PSTS whose spec is new is refused, with a message naming the subnet and
// the fault, when: it lists no subnet; a strategy type or release strategy
// is unknown; the cloud does not know a subnet (DescribeSubnet: not found);
// its addresses or ranges do not fit a subnet (psts.AllowedRanges: outside,
// overlapping, malformed); an Elastic subnet is exclusive or used by an
// exclusive PSTS; a Fixed, Manual or Custom subnet is an ENI subnet of an
// IPPool, or is not exclusive yet and an ENI is in it or holds one of its
// addresses, or an Elastic PSTS uses it. When the cloud cannot be asked the
// answer is a 503 with Retry-After, never an acceptance. An admitted PSTS
// (not a dry run: sideEffects NoneOnDryRun) gets the missing Subnet
// resources, exclusive where its strategy needs it, and an existing unused
// one is marked exclusive. An UPDATE that leaves the spec unchanged
// (finalizers, labels) passes without these checks.
//
// # Failure policy and timeouts
//
// The pod webhook sees every pod creation in the cluster, and the IPAM must
// never be the reason none can be created: failurePolicy Ignore,
// timeoutSeconds 2 (a review reads caches only: it answers in milliseconds,
// so 2s is all network), and selectors that skip kube-system, the IPAM's
// own namespace and pods (its replicas must start when no replica runs).
// A pod admitted while the webhook was down is not lost: the allocator
// itself matches an unannotated pod to its PSTS at ADD time (psts.Match, the
// same rule), so it gets the right subnet; what it misses is the zone
// affinity (the scheduler may then pick a node in a zone without a usable
// subnet, and the ADD fails there) and the cce.baidubce.com/ip request.
//
// The PSTS webhook gates only PSTS objects, and admitting one unchecked
// would be worse than refusing it for a while (an Elastic PSTS on an
// exclusive subnet breaks the one-holder rule of exclusive addresses):
// failurePolicy Fail, timeoutSeconds 10 (it asks the cloud, one subnet at a
// time per call, four calls at once). Each review is bounded by the timeout
// the API server sends, less a margin.
//
// # Certificates
//
// One Secret in the replicas' namespace, shared by all replicas, holds the
// CA(s) and the serving certificate (see package certs). The first replica
// to find none creates it (Create; AlreadyExists: use the stored one).
// Every replica watches it and serves what it holds: tls.Config's
// GetCertificate returns the current certificate, so a renewal needs no
// restart. When the serving certificate has less than a third of its
// validity left, or the CA nears its end, the replicas that notice write the
// renewal with the resourceVersion they read: one wins, the others reload.
// A new CA is added next to the old one, and every replica patches the
// caBundle of the two webhook configurations to the Secret's CAs (JSON Patch,
// only where it differs); the new CA signs only once the configurations
// carry it, so no admission fails during a rotation.
//
// With Config.CertManager, cert-manager writes the Secret and its cainjector
// the caBundles; the replicas only read and serve the Secret.
package webhook
