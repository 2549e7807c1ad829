#!/usr/bin/env bash
# make e2e-kind: the e2e lifecycle suite against a kind cluster running the
# Helm chart with 3 replicas (real pods: hostNetwork, probes, PDB,
# anti-affinity, one per system worker) and bce-sim in-cluster, everything
# built on this machine without a registry (see e2e/kind/README.md).
#
#   e2e/kind/run.sh            build images, create the cluster, deploy, test, delete the cluster
#   KEEP=1 e2e/kind/run.sh     keep the cluster afterwards (kubeconfig path is printed)
#   KIND_NODE_IMAGE=kindest/node:v1.3x.y e2e/kind/run.sh   use another node image (Kubernetes 1.31 or later)
#   E2E_KIND_DOCKER=system e2e/kind/run.sh   use the machine's Docker ($DOCKER_HOST) instead of our own daemon
#
# Needs root for its own Docker daemon (e2e/kind/dockerd.sh: Debian's
# docker.io, installed with apt if missing) and Go; kind, kubectl, the node
# image's Kubernetes and helm are built into bin/ (e2e/tools/build.sh).
#
# Where the kubelet simulator runs: on the host, inside `go test`. It reaches
# the API server through kind's kubeconfig, every cce-ipam replica's CNI
# port through one `kubectl port-forward` per pod (so calls spread over all
# replicas, as through the Service), and bce-sim's admin API through a
# port-forward to its Service. The simulated nodes are Node objects only;
# the suites pin their pods to them with a node selector, so kind's
# scheduler places the pods there and the simulator plays their kubelet.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$ROOT/e2e/kind"
BIN="$ROOT/bin"
NAME=${KIND_CLUSTER_NAME:-cce-ipam-e2e}
NS=e2e-system
TAG=e2e
IMAGE="cce-ipam:$TAG"
IMAGE_SIM="cce-ipam-bce-sim:$TAG"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cce-ipam-kind-XXXXXX")
export KUBECONFIG="$WORK/kubeconfig"
# Why the run failed, in a few lines, printed last by cleanup (a CI log shows
# only its tail): the failing command, and what rollout.sh and the suites say.
export E2E_KIND_CAUSE="$WORK/cause"
trap 'rc=$?; printf "e2e-kind: line %s failed (exit %s): %s\n" "$LINENO" "$rc" "$BASH_COMMAND" >>"$E2E_KIND_CAUSE"' ERR

log() { printf '[e2e-kind %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

command -v go >/dev/null || { echo "e2e-kind: go is not installed" >&2; exit 1; }
# rollout.sh reads kubelet-sim's metrics with curl, which a minimal Debian lacks.
if ! command -v curl >/dev/null; then
	[[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null || { echo "e2e-kind: curl is not installed" >&2; exit 1; }
	log "installing curl with apt"
	{ DEBIAN_FRONTEND=noninteractive apt-get install -y -q curl || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q curl; }; } >&2
fi
log "tools: kind, the node image's Kubernetes, helm (bin/, cached by version)"
"$ROOT/e2e/tools/build.sh" "$BIN" kind kindnode helm >&2
KIND="$BIN/kind"
HELM="$BIN/helm"
kubectl() { "$BIN/kindnode/kubectl" "$@"; }
kind() { "$KIND" "$@"; }

FORWARDS=()
CREATED=0
OWN_DOCKERD=0
cleanup() {
	local code=$?
	local why cause
	why=$(cat "$WORK/why" 2>/dev/null || true)
	cause=$(cat "$E2E_KIND_CAUSE" 2>/dev/null || true)
	for pid in ${FORWARDS[@]+"${FORWARDS[@]}"}; do
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	if [[ $code -ne 0 && $CREATED -eq 1 && -s "$KUBECONFIG" ]]; then
		log "failed ($code); cluster state:"
		kubectl get pods -A -o wide --request-timeout=20s || true
		# A killed node's kubelet never answers: bounded, or the cleanup hangs.
		kubectl -n "$NS" logs -l app.kubernetes.io/name=cce-ipam --tail=50 --prefix --request-timeout=20s || true
	fi
	if [[ $CREATED -eq 1 && "${KEEP:-0}" != 1 ]]; then
		log "deleting kind cluster $NAME"
		kind delete cluster --name "$NAME" || true
		rm -rf "$WORK"
	elif [[ $CREATED -eq 1 ]]; then
		log "kept cluster $NAME: export KUBECONFIG=$KUBECONFIG (delete: kind delete cluster --name $NAME)"
	else
		rm -rf "$WORK"
	fi
	if [[ $OWN_DOCKERD -eq 1 && "${KEEP:-0}" != 1 ]]; then
		"$HERE/dockerd.sh" stop "$BIN" || true
	fi
	# Last, where a CI log's tail shows it: why the cluster did not come up.
	if [[ $code -ne 0 && -n "${why:-}" ]]; then
		log "failed ($code) creating the cluster:"
		printf '%s\n' "$why"
	fi
	if [[ $code -ne 0 && -n "${cause:-}" ]]; then
		log "failed ($code):"
		printf '%s\n' "$cause"
	fi
	exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ "${E2E_KIND_DOCKER:-own}" == own ]]; then
	DOCKER_HOST=$("$HERE/dockerd.sh" start "$BIN")
	export DOCKER_HOST
	OWN_DOCKERD=1
	log "docker: our own daemon at $DOCKER_HOST"
fi
docker info >/dev/null 2>&1 || { echo "e2e-kind: docker does not answer (DOCKER_HOST=${DOCKER_HOST:-})" >&2; exit 1; }


log "building images $IMAGE and $IMAGE_SIM (make image)"
make -C "$ROOT" image IMAGE="$IMAGE" IMAGE_SIM="$IMAGE_SIM" >"$WORK/make-image.log" 2>&1 || { cat "$WORK/make-image.log" >&2; exit 1; }

NODE_IMAGE=${KIND_NODE_IMAGE:-}
if [[ -z "$NODE_IMAGE" ]]; then
	log "building the kind node image (e2e/kind/images.sh)"
	NODE_IMAGE=$("$HERE/images.sh" "$BIN" 2>"$WORK/images.log") || { cat "$WORK/images.log" >&2; exit 1; }
fi
log "node image $NODE_IMAGE"

if kind get clusters 2>/dev/null | grep -qx "$NAME"; then
	echo "e2e-kind: a kind cluster named $NAME exists already; delete it (kind delete cluster --name $NAME) or set KIND_CLUSTER_NAME" >&2
	exit 1
fi
ETCD_TAG=$(awk '$1 == "require" && $2 == "go.etcd.io/etcd/server/v3" { print $3 }' "$ROOT/e2e/tools/etcd/go.mod")
sed "s/ETCD_TAG/${ETCD_TAG#v}-0/" "$HERE/cluster.yaml" >"$WORK/cluster.yaml"
log "creating kind cluster $NAME"
CREATED=1
start=$SECONDS
# A node image built just now may still be gigabytes of dirty pages; the first
# node containers then start while the disk is busy writing them back.
sync
# Each attempt keeps its nodes (--retain) and its output, so a failure can be
# explained: kind prints kubeadm's whole log and a stack trace, and a CI log
# shows only its end, so the cause is printed again last (see cleanup).
attempts=0
create() {
	attempts=$((attempts + 1))
	local out="$WORK/create-$attempts.log" rc=0
	kind create cluster --name "$NAME" --config "$WORK/cluster.yaml" --image "$NODE_IMAGE" \
		--kubeconfig "$KUBECONFIG" --wait 180s --retain 2>&1 | tee "$out" >&2 || rc=${PIPESTATUS[0]}
	[[ $rc -eq 0 ]] && return 0
	explain_create "$out" >"$WORK/why-$attempts"
	cat "$WORK/why-$attempts" >>"$WORK/why"
	return "$rc"
}
# explain_create LOG: what failed (kind's ERROR line, kubeadm's failed phase
# and last errors), and each node's last lines of its image import, kubelet
# and containerd errors.
explain_create() {
	echo "kind create cluster, attempt $attempts, failed after $((SECONDS - start)) s:"
	{ grep -E '^ERROR:|error execution phase|[Tt]imed out|deadline exceeded|^\[.*\] (Waiting|The )' "$1" || true; } |
		cut -c1-300 | tail -n 8 | sed 's/^/    /'
	local n
	for n in $(docker ps -a --filter "label=io.x-k8s.kind.cluster=$NAME" --format '{{.Names}}' || true); do
		echo "  $n: $(docker inspect -f '{{.State.Status}}' "$n" 2>/dev/null || true)"
		{ docker logs --tail 3 "$n" 2>&1 || true; } | cut -c1-300 | sed 's/^/    log: /'
		{ docker exec "$n" journalctl -u kind-images --no-pager -q -n 3 2>/dev/null || true; } | cut -c1-400 | sed 's/^/    images: /'
		{ docker exec "$n" journalctl -u kubelet --no-pager -q -n 4 2>/dev/null || true; } | cut -c1-300 | sed 's/^/    kubelet: /'
		{ docker exec "$n" journalctl -u containerd --no-pager -q 2>/dev/null || true; } | { grep -E 'level=(error|fatal)' || true; } |
			tail -n 2 | cut -c1-500 | sed 's/^/    containerd: /'
	done
}
# Again on failure, up to 3 attempts begun within 5 minutes: the first
# cluster of a fresh daemon (a cold CI run, right after the node image was
# built) has missed kind's 30 s wait for a node's first log line, and in one
# CI run both of two attempts failed, the second in kubeadm (the causes were
# cut from the log; explain_create keeps them now).
until create; do
	log "kind create cluster failed:"
	cat "$WORK/why-$attempts"
	kind delete cluster --name "$NAME" || true
	if [[ $attempts -ge 3 || $((SECONDS - start)) -ge 300 ]]; then
		exit 1
	fi
	log "creating it once more"
done
log "cluster up in $((SECONDS - start)) s"
# The CRDs use selectable fields (spec.node), on by default from Kubernetes 1.31.
minor=$(kubectl get --raw /version | sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p' | head -n 1)
if [[ -z "$minor" || "$minor" -lt 31 ]]; then
	echo "e2e-kind: the cluster runs Kubernetes 1.${minor:-?}; the CRDs need 1.31 or later (set KIND_NODE_IMAGE)" >&2
	exit 1
fi
# The chart goes in while CoreDNS is down: on CCE, CoreDNS's own pods may be
# waiting for IPs from us, so the replicas must form one gossip ring without
# cluster DNS (the replica Leases seed the join). CoreDNS comes back before
# the suites, which need it only for the replicas' BCE endpoint name.
log "CoreDNS scaled to 0 for the install: gossip must form without cluster DNS"
kubectl -n kube-system scale deployment/coredns --replicas=0

log "loading images into the cluster"
kind load docker-image --name "$NAME" "$IMAGE" "$IMAGE_SIM"

log "deploying bce-sim"
kubectl create namespace "$NS"
kubectl -n "$NS" apply -f "$HERE/bce-sim.yaml"
kubectl -n "$NS" rollout status deployment/bce-sim --timeout=180s

log "installing the chart with 3 replicas"
"$HELM" install cce-ipam "$ROOT/charts/cce-ipam" --namespace "$NS" -f "$HERE/values.yaml" --wait --timeout 5m
kubectl -n "$NS" rollout status deployment/cce-ipam --timeout=180s
# check, through the API server's service proxy (no DNS): the answering
# replica sees 3 live members and every partition held. Asked until three
# answers in a row pass, so that each is likely to come from another replica.
start=$SECONDS passes=0
while [[ $passes -lt 3 ]]; do
	if "$BIN/ipamctl" -n "$NS" --service cce-ipam-peers check --replicas 3 >"$WORK/check.out" 2>&1; then
		passes=$((passes + 1))
	else
		passes=0
		if [[ $((SECONDS - start)) -gt 90 ]]; then
			echo "e2e-kind: the replicas did not form one ring of 3 without cluster DNS within 90 s:" >&2
			cat "$WORK/check.out" >&2
			"$BIN/ipamctl" -n "$NS" --service cce-ipam-peers members >&2 || true
			exit 1
		fi
		sleep 1
	fi
done
log "gossip without cluster DNS: one ring of 3 replicas, every partition held ($((SECONDS - start)) s after the rollout)"
"$BIN/ipamctl" -n "$NS" --service cce-ipam-peers members
dns_pods=$(kubectl -n kube-system get pods -l k8s-app=kube-dns --no-headers 2>/dev/null | wc -l)
[[ "$dns_pods" == 0 ]] || { echo "e2e-kind: $dns_pods CoreDNS pods existed during the check" >&2; exit 1; }
kubectl -n kube-system scale deployment/coredns --replicas=2
kubectl -n kube-system rollout status deployment/coredns --timeout=120s
log "the running install:"
kubectl get pods -A -o wide

# forward TARGET PORT: starts `kubectl port-forward TARGET :PORT` in the
# background (its PID goes to FORWARDS, for cleanup) and sets ADDR to the
# local address once it listens. Not called in a subshell, so FORWARDS
# keeps the PID.
ADDR=
forward() {
	local target=$1 port=$2 out
	ADDR=
	out="$WORK/forward-${#FORWARDS[@]}.log"
	kubectl -n "$NS" port-forward --address 127.0.0.1 "$target" ":$port" >"$out" 2>&1 &
	FORWARDS+=("$!")
	for _ in $(seq 1 100); do
		local addr
		addr=$(sed -n 's/^Forwarding from \(127\.0\.0\.1:[0-9]*\) -> .*/\1/p' "$out" | head -n 1)
		if [[ -n "$addr" ]]; then
			ADDR=$addr
			return 0
		fi
		sleep 0.2
	done
	echo "e2e-kind: port-forward to $target:$port did not start:" >&2
	cat "$out" >&2
	return 1
}

forward service/bce-sim 8080
SIM_ADDR=$ADDR
CNI=()
for pod in $(kubectl -n "$NS" get pods -l app.kubernetes.io/name=cce-ipam --field-selector=status.phase=Running \
	-o jsonpath='{.items[*].metadata.name}'); do
	forward "pod/$pod" 9997
	CNI+=("$ADDR")
done
if [[ ${#CNI[@]} -ne 3 ]]; then
	echo "e2e-kind: expected 3 cce-ipam pods, found ${#CNI[@]}" >&2
	exit 1
fi
CNI_LIST=$(IFS=,; echo "${CNI[*]}")
log "bce-sim at http://$SIM_ADDR, CNI endpoints $CNI_LIST"

log "running the lifecycle suite"
cd "$ROOT"
suite_rc=0
E2E_KUBECONFIG="$KUBECONFIG" \
E2E_CNI_ENDPOINTS="$CNI_LIST" \
E2E_BCE_ENDPOINT="http://$SIM_ADDR" \
E2E_CLUSTER_ID=cce-kind \
E2E_VPC_ID=vpc-kind \
E2E_SUBNET_ID=sbn-kind \
E2E_SECURITY_GROUP=g-kind \
	go test -race -tags integration -count=1 -v -timeout 30m ./e2e/suites/lifecycle/ 2>&1 | tee "$WORK/lifecycle.log" || suite_rc=$?
if [[ $suite_rc -ne 0 ]]; then
	{
		echo "e2e-kind: the lifecycle suite failed (exit $suite_rc):"
		grep -E -e '--- FAIL|^panic:|_test\.go:[0-9]+:' "$WORK/lifecycle.log" | cut -c1-300 | tail -n 15 || true
	} >>"$E2E_KIND_CAUSE"
	exit "$suite_rc"
fi

log "rolling update and pod deletion under load (e2e/kind/rollout.sh)"
"$HERE/rollout.sh" "$BIN" "$NS" cce-ipam "$ROOT/charts/cce-ipam" "$HERE/values.yaml" "$SIM_ADDR"

log "helm uninstall leaves only what the chart README says (e2e/kind/uninstall.sh)"
"$HERE/uninstall.sh" "$BIN" "$NS" cce-ipam "$NAME"
log "passed"
