#!/usr/bin/env bash
# The device check (docs/nvml.md, "The device check"): gpumon on this machine's NVIDIA driver in
# one call, writing summary.md, summary.json and report.tar.gz under --out.
#
#   hack/device-check.sh [--bundle DIR] [--mock] --out DIR [more: python -m bench device-check --help]
#
# --bundle DIR: a `make device-bundle` output. Its wheels are installed offline into a directory
# of their own, first on the path, so the check runs on exactly the versions proven here; the
# machine's own packages are left alone. $PYTHON (default python3) runs everything. The check
# is stopped (its report still written) after 8 minutes.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
args=()
bundle=""
while [ $# -gt 0 ]; do
  case $1 in
    --bundle)
      [ $# -ge 2 ] || { echo "device-check: --bundle needs a directory" >&2; exit 2; }
      bundle=$2
      shift 2
      ;;
    *) args+=("$1"); shift ;;
  esac
done

path=$repo
if [ -n "$bundle" ]; then
  if [ ! -f "$bundle/MANIFEST.json" ]; then
    echo "device-check: $bundle is not a device bundle (no MANIFEST.json; make device-bundle)" >&2
    exit 2
  fi
  site=$(mktemp -d "${TMPDIR:-/tmp}/gpumon-site.XXXXXX")
  trap 'rm -rf "$site"' EXIT
  "$py" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    --no-index --find-links "$bundle/wheels" --target "$site" gpumon
  path=$site:$repo
  args+=(--bundle-manifest "$bundle/MANIFEST.json")
  if [ -x "$bundle/bin/nvidia_gpu_exporter" ]; then
    args+=(--peer "$bundle/bin/nvidia_gpu_exporter")
  fi
fi

# PYTHONSAFEPATH: no Python of the check puts its working directory first on its path, where
# this checkout's gpumon/ would hide the bundle's. SIGINT at 8 minutes lets the check write what
# it found; 30 s later it is killed.
status=0
PYTHONSAFEPATH=1 PYTHONPATH=$path timeout --signal=INT --kill-after=30 480 \
  "$py" -m bench device-check "${args[@]}" || status=$?
exit "$status"
