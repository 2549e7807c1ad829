// Package cloud is the IPAM's only way to Baidu Cloud: a small Provider
// interface (ENIs, their private IPs, subnets, instances) and Client, its
// implementation over the unmodified bce-sdk-go v0.9.278. SDK types stay in
// this package; callers see ENI, Subnet, Instance and *Error.
//
// A replica builds one Client at start-up:
//
//	var cfg cloud.Config
//	cfg.RegisterFlags(pflag.CommandLine) // --bce-endpoint, --bce-credentials-dir, --bce-rate, ...
//	pflag.Parse()
//	c, err := cloud.New(cfg, logger, prometheus.DefaultRegisterer)
//
// and hands it to the IPAM as a cloud.Provider. Every call first takes a token
// from one client-side bucket; the shard layer calls c.SetRate(share, burst)
// whenever this replica's share of the global BCE budget changes. A call BCE
// throttles (RateLimit) is retried after a jittered backoff (at least the
// operation's cluster-wide interval, without a second token of its
// per-operation share: BCE did not count the rejected call). A 5xx or a
// transport failure is retried by the client too, not by the SDK, so every
// HTTP request takes its own token and passes the gate; each mutation
// carries one clientToken for all its attempts, so a retry after a 5xx
// cannot apply it twice.
//
// A call made for one node carries that node's permission (ForNode, the
// IPAM's fence): it is asked before every attempt, like the gate, and each
// attempt ends at the permission's deadline. A call whose permission has
// ended is refused (class Canceled, errors.Is ErrFenced) without sending
// anything, retries included.
//
// Per-operation limits (ListENIs: about one a second for the whole cluster)
// are split the same way (SetOpShare). A call pods are waiting on (a
// takeover's ENI list) is marked Urgent: it does not queue behind the share
// at all, only paces its pages at the operation's whole limit (sent faster,
// BCE turns them away for certain), and bears more RateLimit answers before
// it gives up. Housekeeping
// marks its calls NoWait and skips a round rather than queue for a token, or
// run while an Urgent call of the same operation is in flight or just ended.
// ListENIs can keep only some instances' ENIs (ListENIsOptions.Instances),
// dropped page by page, so a replica holds its share of a VPC's ENIs rather
// than all of them.
//
// Errors are *Error values classified by BCE's error code first (then HTTP
// status, then the upstream's substrings), so callers branch with
//
//	if errors.Is(err, cloud.ErrSubnetHasNoMoreIP) { mark the subnet full }
//	if errors.Is(err, cloud.ErrPrivateIPNotFound) { the release already happened }
//
// Credentials come from flags or a mounted Secret directory and never appear
// in logs or errors. Metrics (calls by operation and result, latency, time
// waiting for tokens, throttles, current rate) are registered on the
// registerer passed to New.
//
// Sub-package bcesim simulates the BCE OpenAPI for tests and cmd/bce-sim.
package cloud
