// Package sharding is the e2e suite for running several cce-ipam replicas
// at once: CNI calls enter through every replica (and are forwarded to the
// node's owner), replicas join and leave, and every replica is restarted in
// turn while pods churn. It needs the local fleet (it starts and stops
// replica processes); see package suite.
package sharding
