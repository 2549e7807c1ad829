#!/usr/bin/env bash
# A Docker daemon of the e2e kind path's own: its own data root (under bin/,
# so images built here survive between runs), exec root, socket and pid file,
# started and stopped by this script and no other. Any other daemon on the
# machine is left alone.
#
#   e2e/kind/dockerd.sh start BIN_DIR   start (if not running); prints the DOCKER_HOST to use
#   e2e/kind/dockerd.sh stop  BIN_DIR   stop it (SIGTERM, then SIGKILL after 30 s)
#   e2e/kind/dockerd.sh host  BIN_DIR   print the DOCKER_HOST
#
# Debian's docker.io is installed with apt when dockerd is missing and we are
# root (the only engine this machine can get: there is no registry, and
# nothing here pulls an image). No iptables rules and no IP masquerading:
# containers reach each other and the host, nothing beyond (their traffic
# stays in networks this run creates). Docker's embedded DNS answers the
# containers' names and sends every other name to 127.0.0.1, where nothing
# answers (--dns), so no query leaves either. Port publishing uses docker-proxy.
#
# kind runs its nodes privileged. Where the machine's capability bounding set
# lacks a capability, privileged containers fail ("unable to apply caps");
# then the daemon is restarted with runcwrap (e2e/kind/runcwrap) as its default
# runtime, which drops that capability from every container, and says so.
set -euo pipefail

cmd=${1:-}
bin_dir=$(mkdir -p "${2:?usage: dockerd.sh start|stop|host BIN_DIR}" && cd "$2" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
state=$bin_dir/kindenv/dockerd
# Sockets have a 108-byte path limit: the runtime state lives under /run.
run=/run/cce-kind-$(printf '%s' "$bin_dir" | sha256sum | cut -c1-8)
sock=$run/docker.sock
pidfile=$run/dockerd.pid
log() { echo "dockerd.sh: $*" >&2; }

running() {
	[ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null && DOCKER_HOST=unix://$sock docker version >/dev/null 2>&1
}

start_daemon() {
	local extra=("$@")
	mkdir -p "$state/data" "$run"
	log "starting dockerd (data $state/data, socket $sock) ${extra[*]}"
	setsid dockerd --data-root "$state/data" --exec-root "$run/exec" --host "unix://$sock" --pidfile "$pidfile" \
		--bridge none --iptables=false --ip-masq=false --ip6tables=false --dns 127.0.0.1 "${extra[@]}" \
		>"$state/dockerd.log" 2>&1 </dev/null &
	for _ in $(seq 1 60); do
		running && return 0
		sleep 0.5
	done
	log "dockerd did not answer within 30 s; its log ($state/dockerd.log):"
	tail -20 "$state/dockerd.log" >&2
	return 1
}

stop_daemon() {
	[ -f "$pidfile" ] || return 0
	local pid
	pid=$(cat "$pidfile")
	kill -TERM "$pid" 2>/dev/null || { rm -f "$pidfile"; return 0; }
	for _ in $(seq 1 60); do
		kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; return 0; }
		sleep 0.5
	done
	log "dockerd $pid ignored SIGTERM for 30 s: SIGKILL"
	kill -KILL "$pid" 2>/dev/null || true
	rm -f "$pidfile"
}

# probe_image imports a one-file image (the static pause binary) to probe
# privileged containers with, without pulling anything.
probe_image() {
	local d
	DOCKER_HOST=unix://$sock docker image inspect cce-kind-probe:1 >/dev/null 2>&1 && return 0
	d=$(mktemp -d)
	CGO_ENABLED=0 go build -C "$root" -o "$d/pause" ./e2e/kind/pause
	tar -C "$d" -c pause | DOCKER_HOST=unix://$sock docker import - cce-kind-probe:1 >/dev/null
	rm -rf "$d"
}

privileged_works() {
	DOCKER_HOST=unix://$sock docker run --rm --privileged --network none cce-kind-probe:1 /pause -version >/dev/null 2>"$state/probe.err"
}

case "$cmd" in
host)
	echo "unix://$sock"
	;;
stop)
	stop_daemon
	;;
start)
	if ! command -v dockerd >/dev/null; then
		if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
			log "no dockerd: installing Debian's docker.io with apt"
			{ DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io; }; } >&2
		else
			log "no dockerd, and apt-get as root is not available to install docker.io"
			exit 1
		fi
	fi
	[ "$(id -u)" = 0 ] || { log "dockerd needs root"; exit 1; }
	if ! running; then
		start_daemon
	fi
	probe_image
	if ! privileged_works; then
		log "privileged containers fail here: $(tr '\n' ' ' <"$state/probe.err")"
		log "restarting dockerd with runcwrap as the default runtime: it drops from every container the capabilities this machine's bounding set lacks ($(awk '/^CapBnd:/ {print $2}' /proc/self/status))"
		mkdir -p "$bin_dir/kindenv"
		CGO_ENABLED=0 go build -C "$root" -o "$bin_dir/kindenv/runcwrap" ./e2e/kind/runcwrap
		stop_daemon
		# dockerd passes the runtime no environment of ours: a wrapper script carries it.
		cat >"$bin_dir/kindenv/runcwrap.sh" <<SH
#!/bin/sh
RUNCWRAP_RUNC=$(command -v runc) exec "$bin_dir/kindenv/runcwrap" "\$@"
SH
		chmod +x "$bin_dir/kindenv/runcwrap.sh"
		start_daemon --add-runtime "kind-runc=$bin_dir/kindenv/runcwrap.sh" --default-runtime kind-runc
		privileged_works || { log "privileged containers still fail: $(cat "$state/probe.err")"; exit 1; }
		log "privileged containers work through runcwrap"
	fi
	echo "unix://$sock"
	;;
*)
	echo "usage: dockerd.sh start|stop|host BIN_DIR" >&2
	exit 2
	;;
esac
