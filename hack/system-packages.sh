#!/usr/bin/env bash
# Installs the Debian packages the tests use (a real Prometheus, promtool and Alertmanager;
# buildah, podman and mmdebstrap to build and run the container image) and wrk for `make bench`,
# once; later runs find them and do nothing.
set -euo pipefail
need=()
command -v prometheus >/dev/null || need+=(prometheus)
command -v promtool >/dev/null || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null || need+=(prometheus-alertmanager)
command -v wrk >/dev/null || need+=(wrk)
command -v buildah >/dev/null || need+=(buildah)
command -v podman >/dev/null || need+=(podman)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
[ ${#need[@]} -eq 0 ] && exit 0
echo "==> installing Debian packages: ${need[*]}"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null
# The packages start their services through init scripts where there is an init; the tests
# start their own instances on free ports, so stop any the package started.
for svc in prometheus prometheus-alertmanager prometheus-node-exporter; do
  $SUDO service "$svc" stop >/dev/null 2>&1 || true
done
