#!/usr/bin/env bash
# Regenerates the pinned Go build module of one or more tools: hack/tools/<part>/{go.mod,go.sum}.
# This is the only place a tool's version is chosen and the only step that asks the module proxy
# to resolve anything; hack/build-tools.sh builds read-only from what is committed here.
#
#   hack/pin-tools.sh [all|kubernetes|etcd|kwok|helm|prometheus-adapter|cluster-api|karpenter|mocknvml|crds]...
#
# To move a pin: change its version below, run this for that part, review the go.mod/go.sum
# diff, run `make test` (tests/unit/test_tool_pins.py checks the graphs are complete) and commit.
set -euo pipefail

K8S_VERSION=v1.36.3
STAGING_VERSION=v0.36.3
ETCD_VERSION=v3.6.8
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.21.4
ADAPTER_VERSION=v0.12.0
# One Cluster API version: the core manager is built from it and its CRDs are read from it.
CAPI_VERSION=v1.13.6
KARPENTER_VERSION=v1.15.0
# Karpenter v1.15.0's go.mod asks for Go 1.26.9, newer than the machine's; the go command fetches
# this toolchain from the module proxy for Karpenter's pin and build only (everything else is
# built with GOTOOLCHAIN=local).
KARPENTER_GOTOOLCHAIN=go1.27.3
PROMOP_VERSION=v0.93.0
# The chart's optional cert-manager Certificate is dry-run against this release's CRDs.
CERTMANAGER_VERSION=v1.21.2
# main after v0.3.0 (v0.3.0's nvmlEventSetWait_v2 returns TIMEOUT at once instead of blocking);
# the commit ../shared/mocknvml holds. Its module graph is that folder's go.mod, copied as is.
MOCKNVML_VERSION=v0.3.1-0.20260821154203-3b2b865d91b1
GO_VERSION=1.26.0

HERE="$(cd "$(dirname "$0")" && pwd)"
TOOLS="$HERE/tools"
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

moddir() { go mod download -json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'; }

# Starts hack/tools/<part>/go.mod afresh (tools.go, the list of packages built, is kept).
fresh() {
  local part=$1 dir="$TOOLS/$1"
  mkdir -p "$dir"
  rm -f "$dir/go.mod" "$dir/go.sum"
  (cd "$dir" && go mod init "gpumon.local/tools/$part" >/dev/null 2>&1 && go mod edit -go="$GO_VERSION")
  printf '%s' "$dir"
}

tidy_and_check() {
  local dir=$1
  (cd "$dir" && go mod tidy && GOFLAGS="-mod=readonly -buildvcs=false" go list -tags tools -deps \
     $(go list -e -tags tools -f '{{join .Imports " "}}' .) >/dev/null)
  echo "pinned $(basename "$dir"): $(grep -c . "$dir/go.sum") go.sum lines"
}

pin_kubernetes() {
  local dir; dir=$(fresh kubernetes)
  # k8s.io/kubernetes maps its staging modules to ./staging, which its module zip does not
  # carry: each is replaced by its published release. The list is read from its own go.mod.
  local kdir staging args=()
  kdir=$(moddir "k8s.io/kubernetes@$K8S_VERSION")
  staging=$(grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$kdir/go.mod" | awk '{print $1}')
  [ -n "$staging" ] || { echo "no staging replace lines in $kdir/go.mod" >&2; exit 1; }
  for m in $staging; do args+=("-replace=$m=$m@$STAGING_VERSION"); done
  (cd "$dir" && go mod edit "${args[@]}" -require="k8s.io/kubernetes@$K8S_VERSION")
  tidy_and_check "$dir"
}

pin_etcd() {
  local dir; dir=$(fresh etcd)
  # server/v3's own go.mod replaces its siblings with ../ paths, so `go install` cannot build
  # it; requiring them at the same tag here is what those replace lines stand for.
  (cd "$dir" && go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION" \
     -require="go.etcd.io/etcd/api/v3@$ETCD_VERSION" -require="go.etcd.io/etcd/client/pkg/v3@$ETCD_VERSION" \
     -require="go.etcd.io/etcd/client/v3@$ETCD_VERSION" -require="go.etcd.io/etcd/pkg/v3@$ETCD_VERSION")
  tidy_and_check "$dir"
}

pin_simple() {
  local part=$1 module=$2
  local dir; dir=$(fresh "$part")
  (cd "$dir" && go mod edit -require="$module")
  tidy_and_check "$dir"
}

pin_karpenter() {
  # tidy raises the go line to the module's own (1.26.9), which only the fetched toolchain meets.
  # The toolchain line is what hack/build-tools.sh exports as GOTOOLCHAIN for this part.
  (export GOTOOLCHAIN=$KARPENTER_GOTOOLCHAIN; pin_simple karpenter "sigs.k8s.io/karpenter@$KARPENTER_VERSION" \
     && cd "$TOOLS/karpenter" && go mod edit -toolchain="$KARPENTER_GOTOOLCHAIN")
}

pin_mocknvml() {
  # The proxy refuses github.com/NVIDIA/k8s-test-infra, so its graph comes from the standalone
  # go.mod/go.sum that ../shared/mocknvml carries; hack/build-tools.sh lays them over the source
  # whichever way the source came.
  local shared="$HERE/../../shared/mocknvml" dir="$TOOLS/mocknvml"
  [ -f "$shared/go.mod" ] || { echo "mocknvml: $shared not found" >&2; exit 1; }
  mkdir -p "$dir"
  cp "$shared/go.mod" "$shared/go.sum" "$dir/"
  chmod u+w "$dir/go.mod" "$dir/go.sum"
  printf '%s\n' "$MOCKNVML_VERSION" > "$dir/VERSION"
  echo "pinned mocknvml: $(grep -c . "$dir/go.sum") go.sum lines"
}

pin_crds() {
  # Not a build: the CRD files are read out of these modules. `go mod download` records their
  # checksums in go.sum (tidy would drop requirements nothing imports).
  local dir; dir=$(fresh crds)
  local mods=("sigs.k8s.io/cluster-api@$CAPI_VERSION" "github.com/prometheus-operator/prometheus-operator@$PROMOP_VERSION"
              "github.com/cert-manager/cert-manager@$CERTMANAGER_VERSION")
  (cd "$dir" && go mod edit "${mods[@]/#/-require=}" && go mod download "${mods[@]%@*}")
  echo "pinned crds: $(grep -c . "$dir/go.sum") go.sum lines"
}

parts=("$@"); [ ${#parts[@]} -eq 0 ] && parts=(all)
for p in "${parts[@]}"; do
  case "$p" in
    all) pin_kubernetes; pin_etcd; pin_simple kwok "sigs.k8s.io/kwok@$KWOK_VERSION"
         pin_simple helm "helm.sh/helm/v3@$HELM_VERSION"
         pin_simple prometheus-adapter "sigs.k8s.io/prometheus-adapter@$ADAPTER_VERSION"
         pin_simple cluster-api "sigs.k8s.io/cluster-api@$CAPI_VERSION"; pin_karpenter
         pin_mocknvml; pin_crds ;;
    kubernetes) pin_kubernetes ;;
    etcd) pin_etcd ;;
    kwok) pin_simple kwok "sigs.k8s.io/kwok@$KWOK_VERSION" ;;
    helm) pin_simple helm "helm.sh/helm/v3@$HELM_VERSION" ;;
    prometheus-adapter) pin_simple prometheus-adapter "sigs.k8s.io/prometheus-adapter@$ADAPTER_VERSION" ;;
    cluster-api) pin_simple cluster-api "sigs.k8s.io/cluster-api@$CAPI_VERSION" ;;
    karpenter) pin_karpenter ;;
    mocknvml) pin_mocknvml ;;
    crds) pin_crds ;;
    *) echo "unknown part: $p" >&2; exit 2 ;;
  esac
done
