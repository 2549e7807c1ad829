#!/usr/bin/env bash
# Installs prometheus and promtool (Debian package `prometheus`) for the chart's
# Prometheus e2e test (charts/charttest). Idempotent: does nothing when both are
# already on PATH. Needs root and apt-get; invoked by `make tools`.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
	echo "tools: prometheus $(prometheus --version 2>&1 | awk 'NR==1 {print $3}') is installed"
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "tools: prometheus and promtool are missing and apt-get is not available; install the Prometheus server and promtool on PATH" >&2
	exit 1
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
	command -v sudo >/dev/null 2>&1 || { echo "tools: installing prometheus needs root (or sudo)" >&2; exit 1; }
	sudo=sudo
fi
echo "tools: installing the Debian package prometheus ..."
start=$SECONDS
export DEBIAN_FRONTEND=noninteractive
# Recommends (node exporter, web assets) are not needed; the tests start
# their own prometheus on a free port, whether or not the package's service runs.
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v prometheus >/dev/null && command -v promtool >/dev/null || {
	echo "tools: the prometheus package did not provide prometheus and promtool" >&2
	exit 1
}
echo "tools: installed prometheus in $((SECONDS - start))s"
