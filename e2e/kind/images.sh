#!/usr/bin/env bash
# Builds the kind node image and every image it needs, from Debian packages
# and the Go module proxy only (no registry is reachable here, #23), into the
# Docker daemon at $DOCKER_HOST (e2e/kind/dockerd.sh starts one):
#
#   cce-kind-base:<recipe>          Debian bookworm from debootstrap (systemd, containerd, runc, CNI plugins, iptables)
#   registry.k8s.io/kube-{apiserver,controller-manager,scheduler,proxy}:<kube version>
#   registry.k8s.io/etcd:<etcd version>-0, registry.k8s.io/coredns/coredns:<version>, registry.k8s.io/pause:<version>
#   cce-kind-node:<kube version>-<recipe>   the node image; prints its name on stdout
#
#   e2e/kind/images.sh BIN_DIR
#
# Each image is rebuilt only when its inputs changed (its tag carries a hash
# of them); the binaries come from `e2e/tools/build.sh BIN_DIR kind kindnode`,
# cached by version like every tool.
set -euo pipefail

bin_dir=$(cd "${1:?usage: images.sh BIN_DIR}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
here=$root/e2e/kind
log() { echo "images.sh: $*" >&2; }

pinned() { awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1/go.mod"; }
KUBE_VERSION=$(pinned "$root/e2e/tools/kube" k8s.io/kubernetes)
ETCD_VERSION=$(pinned "$root/e2e/tools/etcd" go.etcd.io/etcd/server/v3)
COREDNS_VERSION=$(pinned "$root/e2e/tools/coredns" github.com/coredns/coredns)
# kubeadm 1.37's PauseVersion: containerd's sandbox_image names it too.
PAUSE_VERSION=3.10.2
SUITE=bookworm
PACKAGES=systemd,systemd-sysv,dbus,containerd,runc,containernetworking-plugins,iptables,iproute2,conntrack,ethtool,socat,kmod,ca-certificates,util-linux,mount,procps,libseccomp2,ebtables,nftables

have() { docker image inspect "$1" >/dev/null 2>&1; }

"$root/e2e/tools/build.sh" "$bin_dir" kind kindnode >&2
work=$(mktemp -d "${TMPDIR:-/tmp}/cce-kind-images-XXXXXX")
trap 'rm -rf "$work"' EXIT

# 1. The Debian root filesystem.
base_recipe=$(printf '%s %s' "$SUITE" "$PACKAGES" | sha256sum | cut -c1-10)
BASE=cce-kind-base:$base_recipe
if ! have "$BASE"; then
	tarball=$bin_dir/kindenv/rootfs-$base_recipe.tar
	if [ ! -s "$tarball" ]; then
		command -v debootstrap >/dev/null || {
			[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || { log "debootstrap is missing"; exit 1; }
			log "installing debootstrap with apt"
			{ DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap; }; } >&2
		}
		log "debootstrap $SUITE (minbase + $PACKAGES)"
		debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$work/rootfs" >"$work/debootstrap.log" 2>&1 ||
			{ tail -20 "$work/debootstrap.log" >&2; exit 1; }
		# Nothing of the build machine stays in the image.
		rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
		mkdir -p "$(dirname "$tarball")"
		tar -C "$work/rootfs" -c . >"$tarball.tmp" && mv "$tarball.tmp" "$tarball"
		rm -rf "$work/rootfs"
	fi
	log "importing $BASE"
	docker import "$tarball" "$BASE" >/dev/null
fi

# 2. The component images, FROM scratch around the static binaries
# (kube-proxy FROM the base: it needs iptables).
component() { # NAME IMAGE BINARY ENTRYPOINT_JSON FROM
	local ctx=$work/$1
	mkdir -p "$ctx"
	cp "$bin_dir/kindnode/$3" "$ctx/$3"
	{
		echo "FROM $5"
		echo "COPY $3 /usr/local/bin/$3"
		echo "ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
		[ -n "$4" ] && echo "ENTRYPOINT $4"
	} >"$ctx/Dockerfile"
	if [ "$5" = scratch ]; then
		mkdir -p "$ctx/etc/ssl/certs"
		cp /etc/ssl/certs/ca-certificates.crt "$ctx/etc/ssl/certs/"
		echo "COPY etc /etc" >>"$ctx/Dockerfile"
	fi
	docker build -q -t "$2" "$ctx" >/dev/null
	components+=("$2")
	component_names+=("$1")
	echo "$2 $(docker image inspect -f '{{.Id}}' "$2")" >>"$work/component-ids"
}
components=()
component_names=() # kind-import-images picks a node's images by these names
log "component images (kube $KUBE_VERSION, etcd $ETCD_VERSION, coredns $COREDNS_VERSION, pause $PAUSE_VERSION)"
for c in kube-apiserver kube-controller-manager kube-scheduler; do
	component "$c" "registry.k8s.io/$c:$KUBE_VERSION" "$c" "" scratch
done
component kube-proxy "registry.k8s.io/kube-proxy:$KUBE_VERSION" kube-proxy "" "$BASE"
component etcd "registry.k8s.io/etcd:${ETCD_VERSION#v}-0" etcd "" scratch
component coredns "registry.k8s.io/coredns/coredns:$COREDNS_VERSION" coredns '["/usr/local/bin/coredns"]' scratch
CGO_ENABLED=0 go build -C "$root" -o "$bin_dir/kindnode/pause" ./e2e/kind/pause
component pause "registry.k8s.io/pause:$PAUSE_VERSION" pause '["/usr/local/bin/pause"]' scratch

# 3. The node image.
ctx=$work/node
mkdir -p "$ctx/bin"
cp -a "$here/node/files" "$here/node/Dockerfile" "$ctx/"
cp "$bin_dir/kindnode/kubelet" "$bin_dir/kindnode/kubeadm" "$bin_dir/kindnode/kubectl" "$ctx/bin/"
CGO_ENABLED=0 go build -C "$root" -o "$ctx/bin/runcwrap" ./e2e/kind/runcwrap
# The tag hashes what goes in: the files, the binaries and the component
# images' IDs (a saved tarball is not byte-stable, an image ID is).
node_recipe=$( (cd "$ctx" && find . -type f -print0 | sort -z | xargs -0 sha256sum; echo "$BASE"; cat "$work/component-ids"
	sha256sum <"$here/images.sh") | sha256sum | cut -c1-10)
NODE=cce-kind-node:$KUBE_VERSION-$node_recipe
if ! have "$NODE"; then
	log "building $NODE"
	mkdir -p "$ctx/images"
	for i in "${!components[@]}"; do
		docker save -o "$ctx/images/${component_names[$i]}.tar" "${components[$i]}"
	done
	docker build -q --build-arg "BASE=$BASE" --build-arg "KUBE_VERSION=$KUBE_VERSION" -t "$NODE" "$ctx" >/dev/null
fi
echo "$NODE"
