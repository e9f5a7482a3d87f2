#!/usr/bin/env bash
# Regenerates gpumon/exporter/podresources/ (Python gRPC stubs of the kubelet pod-resources v1
# API) from the real api.proto in the Go module k8s.io/kubelet at the pinned Kubernetes version.
# Needs Go (module proxy) and grpcio-tools (in the venv). Usage: hack/gen-podresources.sh
set -euo pipefail

KUBELET_VERSION=${KUBELET_VERSION:-v0.36.3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
OUT=gpumon/exporter/podresources
export GOTOOLCHAIN=local GOFLAGS=-mod=mod

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# `go mod download` needs a module context; a throwaway one keeps the repository free of Go files.
(cd "$work" && go mod init gpumon.local/gen >/dev/null 2>&1 &&
  go mod download -json "k8s.io/kubelet@$KUBELET_VERSION" > kubelet.json)
dir=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["Dir"])' "$work/kubelet.json")
src="$dir/pkg/apis/podresources/v1/api.proto"
[ -f "$src" ] || { echo "no $src in k8s.io/kubelet@$KUBELET_VERSION" >&2; exit 1; }

# Kubernetes up to 1.30 imported gogo.proto and set gogoproto options, which only shape the Go
# code; Python users of the API drop them. v0.36.3 has none, so this is a no-op there, kept so
# that KUBELET_VERSION can point at an older release. Wire format and the service name
# (/v1.PodResourcesLister/...) are unchanged either way.
mkdir -p "$ROOT/$OUT"
{
  echo "// Copied by hack/gen-podresources.sh from k8s.io/kubelet@$KUBELET_VERSION"
  echo "// pkg/apis/podresources/v1/api.proto (Apache-2.0, The Kubernetes Authors); gogoproto options removed."
  sed -E -e '/^import "github.com\/gogo\/protobuf\/gogoproto\/gogo.proto";/d' \
         -e '/^option \(gogoproto\.[a-z_]+\) = [a-z]+;/d' "$src"
} > "$ROOT/$OUT/api.proto"

# Generating from the repository root makes the stubs import each other as
# gpumon.exporter.podresources.api_pb2 instead of a bare top-level `api_pb2`.
cd "$ROOT"
rm -f "$OUT"/api_pb2*.py
"$PY" -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. "$OUT/api.proto"
echo "generated $(ls "$OUT"/api_pb2* | tr '\n' ' ')"
