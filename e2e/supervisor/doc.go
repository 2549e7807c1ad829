// Package supervisor runs the child processes of tests, benchmarks and the
// demo (etcd, kube-apiserver, bce-sim, cce-ipam replicas, Prometheus) so that
// none of them outlives its parent.
//
// Every child runs in its own process group, so a signal reaches whatever it
// forks too, and gets SIGKILL as its parent-death signal. Pdeathsig fires when
// the *thread* that forked the child exits, not the process, and Go may retire
// threads: so the fork happens on a goroutine locked to its thread, and that
// goroutine stays alive (and locked) until the child has been reaped. The
// thread therefore dies only with the whole parent, and the kernel takes the
// child with it, also after SIGKILL, a panic or `go test -timeout`.
//
// stdout and stderr are appended to a log file, between "=== start" and
// "=== exit" marker lines (a restarted child keeps the earlier runs' lines);
// the first stdout line is also offered on FirstLine, for children that print
// their address.
//
//	p, err := supervisor.Start(supervisor.Spec{Name: "bce-sim", Bin: bin, Args: args, LogPath: log})
//	addr := <-p.FirstLine()
//	...
//	err = p.Stop(5 * time.Second) // SIGCONT+SIGTERM to the group, SIGKILL after the grace
//
// In a test, StartT kills the child when the test ends (also when it fails or
// panics) and logs the tail of its log if the test failed:
//
//	p := supervisor.StartT(t, supervisor.Spec{Name: "prometheus", Bin: bin, Args: args})
package supervisor
