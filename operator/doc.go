// Package operator serves an operator's allocate and release by hand
// (ipamctl allocate/release) on a replica's metrics port:
//
//	POST /admin/allocate {"namespace":"default","name":"web-0","user":"alice","reason":"stuck sandbox"}
//	POST /admin/release  {"namespace":"default","name":"web-0","containerID":"...","user":"alice","reason":"..."}
//
// A call does exactly what a CNI ADD or DEL for the pod would do: the
// Handler calls the replica's own gRPC CNI service (cni.Server) in-process,
// so validation, the concurrency limits and deadline, the CNI metrics, the
// shard router (the node's owner serves it, one authenticated hop away),
// the fencing and the IPAM's own metrics and Events all apply. There is no
// second allocation path.
//
// Every call, answered or failed, is audited: a Kubernetes Event on the pod
// (Normal IPAllocatedByOperator or IPReleasedByOperator, Warning
// OperatorIPAMCallFailed) naming the user, the reason, the IP, the container
// and the answering replica, and one structured log line.
//
// Authentication: the metrics port has none, and these calls change state,
// so each request carries an HMAC-SHA256 of its method, path, body and time
// under the replicas' forward key (shard.Authenticator.VerifyRequest; a
// replica without a forward key refuses them all, 403). That key is no new
// secret: it is the forward-key of the chart's <fullname>-keys Secret, with
// which any holder can already sign forwarded CNI calls, that is impersonate
// a replica and allocate or release any pod's IP. So whoever may read that
// Secret may make operator calls, and that Secret's RBAC is the gate. The
// user name in a request is asserted by ipamctl (the API server's
// SelfSubjectReview when a kubeconfig is at hand, else $USER@host), not
// proven: it is recorded as such, as the words of a key holder. The port is
// plain HTTP: someone who captures a request can replay it for the 30 s the
// timestamp is accepted, no longer, and change nothing in it. A replayed
// allocate is a repeated ADD of the same sandbox; a replayed release frees
// only what that same sandbox holds then.
//
//	h := operator.NewHandler(operator.Deps{Auth: auth, CNI: cniServer, Kube: kube, CCE: cce, Self: self}, log)
//	mux.Handle("/admin/", h)
package operator
