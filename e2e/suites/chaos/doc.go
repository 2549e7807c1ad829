// Package chaos is the seeded, time-bounded chaos suite: while pods churn,
// replicas are SIGKILLed and restarted, SIGSTOPped and resumed, cut off
// from their peers (each replica runs in its own network namespace), bce-sim
// answers 429s, 5xx, slowly or from a lagging replica, and kube-apiserver
// is restarted. The invariant checker runs throughout and at the end; the
// test prints the pods churned, the faults injected and the violations.
//
//	E2E_CHAOS_DURATION  how long faults are injected (default 45s: the
//	                    short profile of make test; make e2e-chaos runs 10m)
//	E2E_CHAOS_SEED      seed of the fault schedule and the churn (default 1)
//
// The same seed gives the same schedule of faults and pod operations; the
// processes' timing still differs from run to run.
package chaos
