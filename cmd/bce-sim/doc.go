// Command bce-sim runs the BCE OpenAPI simulator (package cloud/bcesim) as
// its own process, for development, e2e tests, benchmarks and demos.
//
//	bce-sim --listen 127.0.0.1:0 --credential ak:sk \
//	    --subnet sbn-a,cn-bj-a,10.0.0.0/16 --instances 100 --instance-subnet sbn-a
//
// It prints the bound address as the first line on stdout (so scripts can
// start it on port 0), logs with log/slog on stderr, and serves the ENI, VPC
// and BCC paths plus the admin API under /admin/ on that one address. Point
// the IPAM at it with --bce-endpoint=<address> and the same credentials.
// SIGINT or SIGTERM shuts it down gracefully.
package main
