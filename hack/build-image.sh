#!/usr/bin/env bash
# Builds the Linux image from deploy/image/Containerfile with buildah, from this checkout; the
# version and the git revision are baked in (`gpumon version`, gpumon_exporter_build_info, OCI
# labels). docs/images.md has the why of each setting. Prints the image reference.
#
#   IMAGE      name:tag to give it (default gpumon/gpumon:<package version>)
#   PLATFORMS  e.g. linux/amd64,linux/arm64: a manifest list with one image per platform
#              (default: this machine's platform, one image); others need qemu-user binfmt
#   BASE       the base image (default: the Containerfile's, a public Python image); where no
#              registry is reachable: BASE=$(hack/image-base.sh)
#   CA_BUNDLE  a CA bundle mounted over the image's for the build's RUN steps only (pip behind a
#              TLS-intercepting proxy); never kept in the image
#   VERSION, REVISION, SOURCE  default: the package's version, `git rev-parse HEAD` (with
#              "-dirty" when the tree has changes), `git remote get-url origin`
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
command -v buildah >/dev/null || { echo "buildah is not installed: run \`make setup\`" >&2; exit 1; }

VERSION="${VERSION:-$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$ROOT/gpumon/__init__.py")}"
if [ -z "${REVISION:-}" ]; then
  REVISION=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
  # Only what goes into the image counts (.dockerignore): tests or docs being edited do not.
  if [ -n "$(git -C "$ROOT" status --porcelain -- gpumon pyproject.toml README.md 2>/dev/null)" ]; then
    REVISION="$REVISION-dirty"
  fi
fi
SOURCE="${SOURCE:-$(git -C "$ROOT" remote get-url origin 2>/dev/null || true)}"
IMAGE="${IMAGE:-gpumon/gpumon:$VERSION}"

args=(bud --layers --isolation "${BUILDAH_ISOLATION:-chroot}" -f "$ROOT/deploy/image/Containerfile"
      --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" --build-arg "SOURCE=$SOURCE")
[ -n "${BASE:-}" ] && args+=(--build-arg "BASE=$BASE")
[ -n "${CA_BUNDLE:-}" ] && args+=(--volume "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro")
if [[ "${PLATFORMS:-}" == *,* ]]; then
  args+=(--platform "$PLATFORMS" --manifest "$IMAGE")
else
  [ -n "${PLATFORMS:-}" ] && args+=(--platform "$PLATFORMS")
  args+=(--tag "$IMAGE")
fi
echo "==> buildah ${args[*]} $ROOT" >&2
buildah "${args[@]}" "$ROOT" >&2
echo "$IMAGE"
