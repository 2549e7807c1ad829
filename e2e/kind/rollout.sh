#!/usr/bin/env bash
# Real-cluster behaviour the process harness cannot show (#23), run by run.sh
# against its kind cluster: CNI calls keep succeeding while
#   1. the Deployment rolls (helm upgrade with a changed value),
#   2. a replica pod is deleted (kubelet-style SIGTERM and grace period), and
#   3. a kind node running a replica is killed (docker kill): the survivors
#      take its partitions; calls that kube-proxy sends to the dead endpoint
#      fail until the node is NotReady and the endpoint leaves the Service
#      (counted and reported: the kubelet retries them), none after that; every
#      pod gets its IP and no address is held twice.
# Load: a host-side kubelet-sim plays 6 simulated BCC nodes (renewing their
# heartbeat Leases: without them kube-controller-manager marks the nodes
# NotReady after 20 s, taints them unreachable, and marks and evicts their
# pods: most likely what failed this suite once in CI) and calls the CNI
# Service the way a node's CNI plugin does: through kube-proxy (the Service is
# a NodePort here; the calls go to the control-plane node's port, so readiness
# gating and endpoint changes are the cluster's own), on a new connection per
# call as the plugin's process does, so that kube-proxy balances every call
# over the ready endpoints: a replica that is not ready yet or is terminating
# must get no call it fails. A Deployment of 20 pause
# pods on those nodes churns (Running pods deleted and replaced) during each
# disruption.
# Pass: no CNI call failed; the figures (calls, failed, the longest call of
# each phase and of the run) are printed.
#
#   e2e/kind/rollout.sh BIN NAMESPACE RELEASE CHART VALUES BCE_ADDR
set -euo pipefail
BIN=$1 NS=$2 RELEASE=$3 CHART=$4 VALUES=$5 BCE=$6
kubectl() { "$BIN/kindnode/kubectl" "$@"; }
log() { printf '[e2e-kind rollout %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
LOAD_NS=rollout
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cce-kind-rollout-XXXXXX")
# CAUSE: where the reason for a failure goes, in a line or a few, for run.sh
# to print last: a CI log shows only its tail, which is otherwise run.sh's
# dump of the cluster.
CAUSE=${E2E_KIND_CAUSE:-/dev/null}
# fail MSG [FILE]: the reason (and FILE's last lines) on stderr and in CAUSE.
fail() {
	{
		printf 'rollout: %s\n' "$1"
		[ -z "${2:-}" ] || tail -n 15 "$2" | cut -c1-400 | sed 's/^/    /'
	} | tee -a "$CAUSE" >&2
	exit 1
}
# Any other command that fails (a rollout status that timed out, helm upgrade).
trap 'rc=$?; printf "rollout: line %s failed (exit %s): %s\n" "$LINENO" "$rc" "$BASH_COMMAND" >>"$CAUSE"' ERR
SIM_PID=
CHURN_PID=
cleanup() {
	[ -n "$CHURN_PID" ] && kill "$CHURN_PID" 2>/dev/null || true
	[ -n "$SIM_PID" ] && kill "$SIM_PID" 2>/dev/null && wait "$SIM_PID" 2>/dev/null || true
	if [ "${KEEP:-0}" = 1 ]; then
		log "kept kubelet-sim's log and the rest in $WORK"
	else
		rm -rf "$WORK"
	fi
}
trap cleanup EXIT

port=$(kubectl -n "$NS" get svc "$RELEASE" -o jsonpath='{.spec.ports[?(@.name=="grpc")].nodePort}')
cp_ip=$(kubectl get node -l node-role.kubernetes.io/control-plane -o jsonpath='{.items[0].status.addresses[?(@.type=="InternalIP")].address}')
[ -n "$port" ] && [ -n "$cp_ip" ] || fail "the CNI Service has no NodePort ($port) or no control-plane address ($cp_ip)"
log "CNI Service through kube-proxy at $cp_ip:$port"

kubectl create namespace "$LOAD_NS" >/dev/null
"$BIN/kubelet-sim" --kubeconfig "$KUBECONFIG" --name rollout --node-prefix roll --nodes 6 --namespace "$LOAD_NS" \
	--cni-endpoint "$cp_ip:$port" --cni-connection-per-call --cni-timeout 60s --bce-endpoint "http://$BCE" \
	--bce-access-key-id AKFLEET --bce-secret-access-key SKfleetSecret \
	--cluster-id cce-kind --vpc-id vpc-kind --subnet-id sbn-kind --security-group g-kind --zone cn-bj-a \
	--metrics-listen 127.0.0.1:0 --stats-period 0 --log-level debug --node-lease-period 5s >"$WORK/kubelet-sim.log" 2>&1 &
SIM_PID=$!
metrics=
for _ in $(seq 1 100); do
	metrics=$(sed -n 's/.*"serving metrics".*addr=\([0-9.:]*\).*/\1/p; s/.*"msg":"serving metrics".*"addr":"\([0-9.:]*\)".*/\1/p' "$WORK/kubelet-sim.log" | head -n 1)
	[ -n "$metrics" ] && break
	kill -0 "$SIM_PID" 2>/dev/null || fail "kubelet-sim exited:" "$WORK/kubelet-sim.log"
	sleep 0.2
done
[ -n "$metrics" ] || fail "kubelet-sim did not log its metrics address:" "$WORK/kubelet-sim.log"
log "kubelet-sim metrics at $metrics"
# sim_nodes_ready: how many of the simulated nodes are Ready.
sim_nodes_ready() { kubectl get nodes -l kubeletsim.cce-ipam.io/simulator=rollout --no-headers 2>/dev/null | grep -c ' Ready' || true; }
for _ in $(seq 1 120); do
	[ "$(sim_nodes_ready)" = 6 ] && break
	sleep 1
done
cat <<YAML | kubectl apply -f - >/dev/null
apiVersion: apps/v1
kind: Deployment
metadata: {name: load, namespace: $LOAD_NS}
spec:
  replicas: 20
  selector: {matchLabels: {app: load}}
  template:
    metadata: {labels: {app: load}}
    spec:
      nodeSelector: {kubeletsim.cce-ipam.io/simulator: rollout}
      terminationGracePeriodSeconds: 0
      containers: [{name: pause, image: registry.k8s.io/pause:3.10.2}]
YAML
kubectl -n "$LOAD_NS" rollout status deploy/load --timeout=180s >/dev/null

calls() { # method result -> count
	curl -s "http://$metrics/metrics" | awk -v m="$1" -v r="$2" '
		/^kubeletsim_cni_calls_total/ && index($0, "method=\"" m "\"") && (r == "" || index($0, "result=\"" r "\"")) { s += $2 }
		END { print s + 0 }'
}
# churn keeps ADDs and DELs flowing: every 2 s it deletes 3 Running pods
# (their ADD is done: each delete is a DEL), and the ReplicaSet creates 3 new
# ones (3 ADDs). Scaling down instead would delete Pending pods first, whose
# ADD is in flight and then fails with "pod not found", as it should, since
# the pod is gone: that is no IPAM failure, and it would hide real ones.
churn() {
	while true; do
		kubectl -n "$LOAD_NS" get pods -l app=load --field-selector=status.phase=Running -o name 2>/dev/null |
			shuf -n 3 | xargs -r "$BIN/kindnode/kubectl" -n "$LOAD_NS" delete --wait=false --grace-period=0 >/dev/null 2>&1 || true
		sleep 2
	done
}
# failed_total: CNI calls with a result other than ok, from one scrape (the
# counters only grow; a difference of two scrapes would not).
failed_total() {
	curl -s "http://$metrics/metrics" | awk '/^kubeletsim_cni_calls_total/ && !index($0, "result=\"ok\"") { s += $2 } END { print s + 0 }'
}
# now_secs: the UTC time of day in seconds, as failed_since compares.
now_secs() { date -u +%H:%M:%S.%N | awk '{ split($1, t, ":"); printf "%.3f", t[1] * 3600 + t[2] * 60 + t[3] }'; }
# failed_since SECS: failed CNI calls that began after SECS (UTC seconds of the
# day; kubelet-sim logs each call's end time and duration). Not across midnight.
failed_since() {
	grep '"msg":"CNI \(ADD\|DEL\) failed"' "$WORK/kubelet-sim.log" |
		sed -n 's/.*"time":"[0-9-]*T\([0-9:.]*\)Z".*"duration":\([0-9]*\).*/\1 \2/p' |
		awk -v g="$1" '{ split($1, t, ":"); end = t[1] * 3600 + t[2] * 60 + t[3]; if (end - $2 / 1e9 > g) n++ } END { print n + 0 }'
}
# FAILED_BASE: failed calls check() forgives, those of the node kill before
# the dead endpoint left the Service (reported on their own).
FAILED_BASE=0

# longest [LINE]: the longest CNI call (ADD or DEL, ok or failed), in seconds,
# logged after line LINE of kubelet-sim's log (default: the whole run;
# kubelet-sim logs every call at debug level with its duration in ns).
longest() {
	tail -n "+$((${1:-0} + 1))" "$WORK/kubelet-sim.log" | grep '"msg":"CNI \(ADD\|DEL\)' |
		sed -n 's/.*"duration":\([0-9]*\).*/\1/p' | awk '{ if ($1 > m) m = $1 } END { printf "%.2f", m / 1e9 }'
}
# MARK: the log's line count when the phase began.
MARK=0
begin_phase() { MARK=$(wc -l <"$WORK/kubelet-sim.log"); }
# load_on / load_off: a phase under load begins (and the churn starts), and the
# churn stops.
load_on() { begin_phase; churn & CHURN_PID=$!; }
load_off() { kill "$CHURN_PID"; wait "$CHURN_PID" 2>/dev/null || true; CHURN_PID=; }
# wait_ring N SECS: until ipamctl check passes with N live replicas (asked
# through the API server's service proxy, which may still pick a dead
# endpoint: asked again, with a short timeout).
wait_ring() {
	local n=$1 within=$2 from=$SECONDS
	until "$BIN/ipamctl" -n "$NS" --service "$RELEASE-peers" --timeout 3s check --replicas "$n" >"$WORK/check.out" 2>&1; do
		if [ $((SECONDS - from)) -gt "$within" ]; then
			fail "no ring of $n live replicas holding every partition within $within s:" "$WORK/check.out"
		fi
		sleep 1
	done
}
check() { # name
	local total failed ready
	ready=$(sim_nodes_ready)
	[ "$ready" = 6 ] || fail "$1: $ready of the 6 simulated nodes are Ready (kubelet-sim's node heartbeats lapsed?)"
	total=$(( $(calls AllocateIP "") + $(calls ReleaseIP "") ))
	failed=$(( $(failed_total) - FAILED_BASE ))
	log "$1: CNI calls so far $total, failed $failed; longest call in this phase $(longest "$MARK") s, in the run $(longest) s"
	if [ "$failed" != 0 ]; then
		grep "CNI ADD failed\|CNI DEL failed\|\"level\":\"ERROR\"" "$WORK/kubelet-sim.log" >"$WORK/failed.log" || true
		fail "$1: $failed CNI calls failed; kubelet-sim's log:" "$WORK/failed.log"
	fi
}
check "warm-up"

log "1. rolling update under load: helm upgrade with a changed pod annotation"
load_on
start=$SECONDS
"$BIN/helm" upgrade "$RELEASE" "$CHART" --namespace "$NS" -f "$VALUES" --set-string "podAnnotations.e2e-rollout=$(date +%s)" --wait --timeout 5m >/dev/null
kubectl -n "$NS" rollout status "deployment/$RELEASE" --timeout=180s >/dev/null
sleep 6
load_off
log "rolled in $((SECONDS - start)) s"
check "rolling update"

log "2. a replica pod deleted (SIGTERM, grace period) under load"
load_on
# A replica that is not already terminating (the rollout's old pods may still be going).
victim=$(kubectl -n "$NS" get pods -l "app.kubernetes.io/instance=$RELEASE,app.kubernetes.io/name=cce-ipam" \
	-o jsonpath='{range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}' | awk 'NF == 1 { print $1; exit }')
[ -n "$victim" ] || fail "no replica pod that is not terminating"
start=$SECONDS
kubectl -n "$NS" delete pod "$victim" --wait=true >/dev/null
kubectl -n "$NS" rollout status "deployment/$RELEASE" --timeout=180s >/dev/null
sleep 6
load_off
log "deleted $victim; replaced and ready in $((SECONDS - start)) s"
check "pod deletion"

log "3. a kind node running a replica killed (docker kill) under load"
# A replica whose node does not run bce-sim (the cloud stays up).
sim_node=$(kubectl -n "$NS" get pods -l app=bce-sim -o jsonpath='{.items[0].spec.nodeName}')
read -r victim node < <(kubectl -n "$NS" get pods -l "app.kubernetes.io/instance=$RELEASE,app.kubernetes.io/name=cce-ipam" \
	-o jsonpath='{range .items[*]}{.metadata.name} {.spec.nodeName} {.metadata.deletionTimestamp}{"\n"}{end}' |
	awk -v s="$sim_node" 'NF == 2 && $2 != s { print $1, $2; exit }')
[ -n "${node:-}" ] || fail "no replica on a node without bce-sim"
victim_ip=$(kubectl -n "$NS" get pod "$victim" -o jsonpath='{.status.podIP}')
load_on
start=$SECONDS
docker kill "$node" >/dev/null
log "killed node $node (replica $victim, $victim_ip)"
# The survivors hold every partition: the dead replica's Lease expired and
# its partitions moved.
wait_ring 2 120
takeover=$((SECONDS - start))
log "survivors hold every partition ${takeover} s after the kill"
# Calls through the Service still reach the dead endpoint until the node is
# NotReady (node-monitor-grace-period, 20 s in cluster.yaml) and its pods are
# marked not ready. Those calls fail to connect, and the kubelet retries them;
# after that, no call may fail.
until [ -z "$(kubectl -n "$NS" get endpointslices -l "kubernetes.io/service-name=$RELEASE" \
	-o jsonpath='{range .items[*].endpoints[?(@.conditions.ready==true)]}{.addresses[0]}{"\n"}{end}' | grep -Fx "$victim_ip")" ]; do
	if [ $((SECONDS - start)) -gt 150 ]; then
		fail "the dead replica $victim is still a ready endpoint of the CNI Service 150 s after the kill"
	fi
	sleep 1
done
gated=$((SECONDS - start))
sleep 3 # kube-proxy's rules follow the EndpointSlice
gate_at=$(now_secs)
log "the dead replica left the CNI Service's ready endpoints ${gated} s after the kill"
# Calls begun before the gate may still be dialling the dead endpoint: gRPC
# gives up a dial after 20 s. Wait that out, with the churn going on.
sleep 21
load_off
failed_after=$(failed_since "$gate_at")
failed_phase=$(( $(failed_total) - FAILED_BASE ))
log "node kill: CNI calls so far $(( $(calls AllocateIP "") + $(calls ReleaseIP "") )); failed $failed_phase, begun before the dead endpoint left the Service (connection refused, or a dial timeout of 20 s: a kubelet retries them): $((failed_phase - failed_after)), after: $failed_after; longest call in this phase $(longest "$MARK") s"
if [ "$failed_after" != 0 ]; then
	grep '"msg":"CNI \(ADD\|DEL\) failed"' "$WORK/kubelet-sim.log" | tail -n "$failed_after" >"$WORK/failed.log"
	fail "$failed_after CNI calls begun after the dead replica left the Service failed:" "$WORK/failed.log"
fi
# Every churned pod got its IP (the failed ADDs were retried), and no address
# is held by two WorkloadEndpoints.
# (Not `kubectl wait -l`: it waits out its timeout on a pod the last churn
# round deleted meanwhile. Counted instead: 20 pods not terminating, all Ready.)
ready_start=$SECONDS
until [ "$(kubectl -n "$LOAD_NS" get pods -l app=load \
	-o jsonpath='{range .items[*]}{.metadata.deletionTimestamp}{"|"}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
	grep -c '^|True$')" = 20 ]; do
	if [ $((SECONDS - ready_start)) -gt 120 ]; then
		kubectl -n "$LOAD_NS" get pods -o wide >&2
		{
			kubectl -n "$LOAD_NS" get pods -l app=load -o jsonpath='{range .items[*]}{.metadata.name}{" |"}{.metadata.deletionTimestamp}{"|"}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
				grep -v '^[^ ]* ||True$' || true
			echo "the simulated nodes (kube-controller-manager marks the pods of a NotReady node not Ready):"
			kubectl get nodes -l kubeletsim.cce-ipam.io/simulator=rollout --no-headers || true
			echo "kubelet-sim's last failures:"
			grep -i 'failed' "$WORK/kubelet-sim.log" | tail -n 5 || true
		} >"$WORK/unready.log"
		fail "the 20 load pods are not all Ready 120 s after the node kill (those that are not: name, deletion, Ready):" "$WORK/unready.log"
	fi
	sleep 1
done
dups=$(kubectl get workloadendpoints.cce.io -A -o jsonpath='{range .items[*]}{.spec.ip}{"\n"}{end}' | grep . | sort | uniq -d)
[ -z "$dups" ] || fail "addresses held by two WorkloadEndpoints: $dups"
# As an operator would for a node that is gone: delete it and its pod; the
# Deployment's replacement starts on the free system node and the ring is 3 again.
kubectl delete node "$node" --wait=false >/dev/null
kubectl -n "$NS" delete pod "$victim" --force --grace-period=0 >/dev/null 2>&1 || true
kubectl -n "$NS" rollout status "deployment/$RELEASE" --timeout=180s >/dev/null
wait_ring 3 90
log "node deleted, replacement replica ready, ring of 3 again"
# The node kill's failed calls, all begun before the gate, are reported above;
# check() counts from here on.
FAILED_BASE=$((FAILED_BASE + failed_phase))

begin_phase
kubectl -n "$LOAD_NS" scale deploy/load --replicas=0 >/dev/null
kubectl -n "$LOAD_NS" wait --for=delete pod -l app=load --timeout=120s >/dev/null 2>&1 || true
check "drained"
kubectl delete namespace "$LOAD_NS" --wait=false >/dev/null
log "passed"
