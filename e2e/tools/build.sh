#!/usr/bin/env bash
# Builds the pinned test tools into a bin directory from the Go module proxy.
# Usage: e2e/tools/build.sh BIN_DIR [TOOL...]   (TOOL: etcd kube helm lint; default all)
#        e2e/tools/build.sh BIN_DIR kind kindnode   (the kind path's tools, #23: not in the default set)
#
# Each tool's version is read from its own tools module's go.mod, so that file
# is the single pin. A tool whose recorded version (BIN_DIR/.versions/NAME)
# matches is not rebuilt.
set -euo pipefail

bin_dir=$(mkdir -p "$1" && cd "$1" && pwd)
shift
tools_dir=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$bin_dir/.versions"

# pinned MODULE_DIR MODULE -> the version of MODULE required in MODULE_DIR/go.mod
pinned() {
	awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1/go.mod"
}

# Bump when the way a tool is built changes, so that stale binaries rebuild.
recipe=2

# build NAME MODULE_DIR MODULE LDFLAGS BINARY=PACKAGE...
build() {
	local name=$1 dir=$2 module=$3 ldflags=$4
	shift 4
	local version stamp
	version=$(pinned "$dir" "$module")
	[ -n "$version" ] || { echo "no version of $module in $dir/go.mod" >&2; exit 1; }
	stamp="$bin_dir/.versions/$name"
	local want_stamp="$module@$version recipe=$recipe${build_env:+ $build_env}"
	local outputs=()
	for spec in "$@"; do outputs+=("$bin_dir/${spec%%=*}"); done
	if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want_stamp" ]; then
		local all=1
		for o in "${outputs[@]}"; do [ -x "$o" ] || all=0; done
		if [ $all = 1 ]; then
			echo "tools: $name $version is up to date"
			return
		fi
	fi
	echo "tools: building $name ($module@$version) ..."
	local start=$SECONDS
	rm -f "$stamp"
	# One `go build -o DIR/` per output directory when every binary is named
	# after its package: the packages compile once and the links run in parallel.
	local -A pkgs_by_dir=()
	for spec in "$@"; do
		local out=$bin_dir/${spec%%=*} pkg=${spec#*=}
		mkdir -p "$(dirname "$out")"
		if [ "$(basename "$out")" = "$(basename "$pkg")" ]; then
			pkgs_by_dir[$(dirname "$out")]+=" $pkg"
		else
			# build_env: CGO_ENABLED=0 for the binaries that go into FROM-scratch images.
			(cd "$dir" && env ${build_env:-} go build -ldflags "${ldflags//@VERSION@/$version}" -o "$out" "$pkg")
		fi
	done
	for out_dir in "${!pkgs_by_dir[@]}"; do
		# shellcheck disable=SC2086 # the package list is meant to split
		(cd "$dir" && env ${build_env:-} go build -ldflags "${ldflags//@VERSION@/$version}" -o "$out_dir/" ${pkgs_by_dir[$out_dir]})
	done
	echo "$want_stamp" >"$stamp"
	echo "tools: built $name in $((SECONDS - start))s"
}

# The Kubernetes build stamps its version with -X; without it the binaries say
# v0.0.0-master, which clients and version skew checks then see.
kube_ldflags() {
	local v=$1 major minor
	major=${v#v}; major=${major%%.*}
	minor=${v#v*.}; minor=${minor%%.*}
	local f=""
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		f+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
	done
	echo "$f"
}

want=("$@")
[ ${#want[@]} -gt 0 ] || want=(etcd kube helm lint)
for t in "${want[@]}"; do
	case "$t" in
	etcd)
		build_env=CGO_ENABLED=0
		build etcd "$tools_dir/etcd" go.etcd.io/etcd/server/v3 "" etcd=go.etcd.io/etcd/server/v3
		build_env=
		;;
	# Static like the kind node image's (kindnode below, the same module): one build mode, so
	# that the two share every compiled package and the kind path's cold build costs little more.
	kube)
		build_env=CGO_ENABLED=0
		build kube "$tools_dir/kube" k8s.io/kubernetes "$(kube_ldflags "$(pinned "$tools_dir/kube" k8s.io/kubernetes)")" \
			kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
			kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager
		build_env=
		;;
	helm) build helm "$tools_dir/helm" helm.sh/helm/v3 "-X helm.sh/helm/v3/internal/version.version=@VERSION@" \
		helm=helm.sh/helm/v3/cmd/helm ;;
	lint) build golangci-lint "$tools_dir/golangci-lint" github.com/golangci/golangci-lint/v2 "-X main.version=@VERSION@" \
		golangci-lint=github.com/golangci/golangci-lint/v2/cmd/golangci-lint ;;
	kind) build kind "$tools_dir/kind" sigs.k8s.io/kind "" kind=sigs.k8s.io/kind ;;
	# The kind node image's binaries, static, in bin/kindnode/ (e2e/kind/images.sh makes images of them).
	kindnode)
		build_env=CGO_ENABLED=0
		build kindnode-kube "$tools_dir/kube" k8s.io/kubernetes "$(kube_ldflags "$(pinned "$tools_dir/kube" k8s.io/kubernetes)")" \
			kindnode/kubelet=k8s.io/kubernetes/cmd/kubelet \
			kindnode/kubeadm=k8s.io/kubernetes/cmd/kubeadm \
			kindnode/kubectl=k8s.io/kubernetes/cmd/kubectl \
			kindnode/kube-proxy=k8s.io/kubernetes/cmd/kube-proxy \
			kindnode/kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler \
			kindnode/kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
			kindnode/kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager
		build kindnode-etcd "$tools_dir/etcd" go.etcd.io/etcd/server/v3 "" kindnode/etcd=go.etcd.io/etcd/server/v3
		build kindnode-coredns "$tools_dir/coredns" github.com/coredns/coredns "" kindnode/coredns=github.com/coredns/coredns
		build_env=
		;;
	*) echo "unknown tool $t (want etcd, kube, helm, lint, kind or kindnode)" >&2; exit 2 ;;
	esac
done
