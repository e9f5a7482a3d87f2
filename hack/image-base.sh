#!/usr/bin/env bash
# A local Debian base image for deploy/image/Containerfile, for machines that cannot pull from a
# registry (this workplace's: docs/images.md). mmdebstrap makes a bookworm rootfs with the same
# Python as the host's Debian (3.11) and its venv module; `podman import` loads it into the
# local image store. Prints the image reference (for `--build-arg BASE=...`) on stdout.
#
# The rootfs tarball is cached under the tools cache, keyed by a digest of the suite, the
# variant, the package list, the mirrors and the excludes below (all it is built from), so
# changing any of them builds a new one. Idempotent: a cached tarball is only re-imported when the image
# store lost it.
set -euo pipefail

CACHE="${GPUMON_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpumon/tools}"
SUITE=bookworm
# essential (no apt: nothing installs packages at run time) plus what the image needs: Python,
# its venv module (the build stage makes the venv), the C++ runtime grpcio's wheel links
# (apt brings it into Debian's slim images), and the CA bundle for https clients (Prometheus,
# an API server with a public certificate).
VARIANT=essential
PACKAGES=python3,python3-venv,libstdc++6,ca-certificates
MIRRORS=(
  "deb http://deb.debian.org/debian $SUITE main"
  "deb http://deb.debian.org/debian $SUITE-updates main"
  "deb http://deb.debian.org/debian-security $SUITE-security main"
)
# Documentation, manuals and translations are dead weight in an image; licences stay.
DPKG_OPTS=(
  "path-exclude=/usr/share/doc/*" "path-include=/usr/share/doc/*/copyright"
  "path-exclude=/usr/share/man/*" "path-exclude=/usr/share/info/*"
  "path-exclude=/usr/share/locale/*" "path-include=/usr/share/locale/locale.alias"
)

log() { printf '[image-base] %s\n' "$*" >&2; }

for tool in mmdebstrap podman; do
  command -v "$tool" >/dev/null || { log "$tool is not installed: run \`make setup\`"; exit 1; }
done

# The key: what the rootfs is made from, not this file (editing a comment rebuilds nothing).
key=$(printf '%s\n' "$SUITE" "$VARIANT" "$PACKAGES" "${MIRRORS[@]}" "${DPKG_OPTS[@]}" | sha256sum | cut -c1-12)
out="$CACHE/debian-base-$SUITE-$key"
image="localhost/gpumon-base:$SUITE-$key"

if [ ! -f "$out/.done" ]; then
  log "building a Debian $SUITE rootfs with mmdebstrap into $out (1 to 2 minutes on 2 cores)"
  t0=$(date +%s)
  mkdir -p "$out"
  dpkg_args=()
  for o in "${DPKG_OPTS[@]}"; do dpkg_args+=("--dpkgopt=$o"); done
  mmdebstrap --quiet --variant="$VARIANT" --include="$PACKAGES" "${dpkg_args[@]}" \
    --format=tar "$SUITE" "$out/rootfs.tar.tmp" "${MIRRORS[@]}"
  mv "$out/rootfs.tar.tmp" "$out/rootfs.tar"
  echo "$key" > "$out/.done"
  log "rootfs built in $(( $(date +%s) - t0 ))s ($(du -m "$out/rootfs.tar" | cut -f1) MB)"
fi

if ! podman image exists "$image"; then
  log "importing $out/rootfs.tar as $image"
  podman import --quiet "$out/rootfs.tar" "$image" >/dev/null
fi
echo "$image"
