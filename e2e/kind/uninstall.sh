#!/usr/bin/env bash
# `helm uninstall` leaves nothing behind but what the chart README's
# "Uninstall" section lists (#23), run by run.sh against its kind cluster:
#   - the CRDs (Helm never deletes what a chart's crds/ installed) and the
#     custom resources in them (IPPools, WorkloadEndpoints, Subnets, ...),
#   - in the release namespace, the objects the replicas create themselves:
#     the Secret <fullname>-keys, the webhook certificate Secret
#     <fullname>-webhook-certs and the Leases <fullname>-*; and Events.
# Every other object, in any namespace or cluster-scoped, whose name holds
# the release's fullname is a leftover and fails the check; objects named
# after the kind cluster (its nodes, their Leases and static pods) are the
# cluster's.
#
#   e2e/kind/uninstall.sh BIN NAMESPACE RELEASE KIND_CLUSTER   (the fullname is the release name: it holds "cce-ipam")
set -euo pipefail
BIN=$1 NS=$2 RELEASE=$3 CLUSTER=$4
kubectl() { "$BIN/kindnode/kubectl" "$@"; }
log() { printf '[e2e-kind uninstall %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

start=$SECONDS
"$BIN/helm" uninstall "$RELEASE" --namespace "$NS" --wait --timeout 3m >/dev/null
log "helm uninstall done in $((SECONDS - start)) s"
# The replica pods are gone once the Deployment's garbage is collected.
for _ in $(seq 1 90); do
	[ -z "$(kubectl -n "$NS" get pods -l "app.kubernetes.io/instance=$RELEASE" -o name 2>/dev/null)" ] && break
	sleep 1
done

# Every object of every listable kind, as KIND NAMESPACE NAME.
kinds=$(kubectl api-resources --verbs=list -o name | grep -v '^events' | paste -sd, -)
named=$(kubectl get "$kinds" -A --no-headers -o custom-columns='KIND:.kind,NS:.metadata.namespace,NAME:.metadata.name' 2>/dev/null |
	awk -v r="$RELEASE" -v c="$CLUSTER" 'index($3, r) && $3 != c && index($3, c "-") == 0 && index($3, "-" c "-") == 0' || true)
left=()
kept=()
while read -r kind ns name; do
	[ -n "$kind" ] || continue # <<< of an empty list is one empty line
	case "$kind/$ns/$name" in
	# The webhook certificate Secret: webhook.secretName, default <fullname>-webhook-certs.
	"Secret/$NS/$RELEASE-keys" | "Secret/$NS/$RELEASE-webhook-certs" | "Lease/$NS/$RELEASE-"*)
		kept+=("$kind/$ns/$name") ;;
	*) left+=("$kind/$ns/$name") ;;
	esac
done <<<"$named"
# Summarised: the partition Leases are one per partition (sharding.partitions).
log "kept, as the chart README says: $(printf '%s\n' ${kept[@]+"${kept[@]}"} | sed 's/-partition-[0-9]*$/-partition-N/' | sort | uniq -c |
	awk '{ printf "%s%s%s", sep, $2, ($1 > 1 ? " x" $1 : ""); sep = ", " }')"
crds=$(kubectl get crd -o name | grep -c '\.cce\.io$' || true)
log "CRDs kept (Helm leaves crds/ alone): $crds"
if [ ${#left[@]} -gt 0 ]; then
	{
		echo "uninstall: helm uninstall left objects the chart README does not list:"
		printf '  %s\n' "${left[@]}"
	} | tee -a "${E2E_KIND_CAUSE:-/dev/null}" >&2
	exit 1
fi
log "passed: nothing else of $RELEASE is left"
