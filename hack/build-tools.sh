#!/usr/bin/env bash
# Builds the real parts the tests and the demo run against into a cache outside the repository,
# keyed by version. Every part builds from its pinned module in hack/tools/<part>/ (committed
# go.mod and go.sum, made by hack/pin-tools.sh) in read-only module mode: nothing is resolved
# here, nothing floats to "latest", every module is checked against go.sum.
# Idempotent: a part whose stamp matches its pins is not rebuilt.
# Usage: hack/build-tools.sh [all|kube|etcd|kwok|mocknvml|crds|helm|adapter|capi|karpenter]...
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
TOOLS="$HERE/tools"
CACHE="${GPUMON_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpumon/tools}"
# The mock NVML's source where the module proxy refuses it (it does, with 403, for every
# version): the copy that sits beside this repository's checkout, or one named explicitly.
MOCKNVML_SRC="${GPUMON_MOCKNVML_SRC:-$HERE/../../shared/mocknvml}"
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"
START=$(date +%s)

log() { printf '[build-tools %4ss] %s\n' "$(( $(date +%s) - START ))" "$*" >&2; }

# Runs a long command while printing a heartbeat, so a cold build visibly makes progress.
with_progress() {
  local what=$1; shift
  local t0; t0=$(date +%s)
  ( while sleep 30; do log "  … still building $what ($(( $(date +%s) - t0 ))s)"; done ) &
  local ticker=$!
  local rc=0
  "$@" || rc=$?
  kill "$ticker" 2>/dev/null; wait "$ticker" 2>/dev/null || true
  if [ "$rc" -ne 0 ]; then log "FAILED building $what (exit $rc)"; return "$rc"; fi
  log "  built $what in $(( $(date +%s) - t0 ))s"
}

# The version hack/tools/<part>/go.mod pins for a module: the single source of versions.
pinned() {
  (cd "$TOOLS/$1" && go mod edit -json) | python3 -c '
import json, sys
mod = json.load(sys.stdin)
print(next(r["Version"] for r in mod["Require"] if r["Path"] == sys.argv[1]))' "$2"
}

# What a part's stamp records: its pins (and patches) and the recipe that builds it (the text of
# the calling build_* function), so a re-pin or a changed recipe rebuilds it. Without the recipe a
# cache built before a step was added (a file copied, a binary built) would pass as complete.
stamp() { { (cd "$TOOLS/$1" && cat $(find . -type f | sort)); declare -f "$2"; } | sha256sum | cut -d' ' -f1; }
is_built() { [ -f "$1/.done" ] && [ "$(cat "$1/.done")" = "$(stamp "$2" "${FUNCNAME[1]}")" ]; }
mark_built() { stamp "$2" "${FUNCNAME[1]}" > "$1/.done"; }

# The packages a part builds: the imports of hack/tools/<part>/tools.go.
tool_packages() { (cd "$TOOLS/$1" && go list -e -tags tools -f '{{join .Imports " "}}' .); }

# A module's source directory, downloaded and checked against the part's go.sum.
module_dir() { (cd "$TOOLS/$1" && go mod download -json "$2") | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'; }

build_kube() {
  local v; v=$(pinned kubernetes k8s.io/kubernetes)
  local out="$CACHE/kubernetes-$v"
  is_built "$out" kubernetes && { log "kubernetes $v cached in $out"; return; }
  log "kubernetes $v: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (about 5 min cold on 2 cores)"
  local minor=${v#v1.}; minor=${minor%%.*}
  local ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  mkdir -p "$out/bin"
  # shellcheck disable=SC2046
  (cd "$TOOLS/kubernetes" && CGO_ENABLED=0 with_progress "kubernetes binaries" \
     go build -trimpath -ldflags "$ld" -o "$out/bin/" $(tool_packages kubernetes))
  mark_built "$out" kubernetes
}

build_etcd() {
  local v; v=$(pinned etcd go.etcd.io/etcd/server/v3)
  local out="$CACHE/etcd-$v"
  is_built "$out" etcd && { log "etcd $v cached in $out"; return; }
  log "etcd $v"
  mkdir -p "$out/bin"
  (cd "$TOOLS/etcd" && CGO_ENABLED=0 with_progress "etcd" \
     go build -trimpath -ldflags "-s -w" -o "$out/bin/etcd" go.etcd.io/etcd/server/v3)
  mark_built "$out" etcd
}

build_kwok() {
  local v; v=$(pinned kwok sigs.k8s.io/kwok)
  local out="$CACHE/kwok-$v"
  is_built "$out" kwok && { log "kwok $v cached in $out"; return; }
  log "kwok $v"
  mkdir -p "$out/bin" "$out/stages"
  (cd "$TOOLS/kwok" && CGO_ENABLED=0 with_progress "kwok" \
     go build -trimpath -ldflags "-s -w" -o "$out/bin/kwok" sigs.k8s.io/kwok/cmd/kwok)
  # Standalone kwok loads no stages by itself: keep the module's own stage files beside it.
  local kdir; kdir=$(module_dir kwok sigs.k8s.io/kwok)
  cp "$kdir/kustomize/stage/node/fast/node-initialize.yaml" \
     "$kdir/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
     "$kdir/kustomize/stage/pod/fast/pod-ready.yaml" \
     "$kdir/kustomize/stage/pod/fast/pod-complete.yaml" \
     "$kdir/kustomize/stage/pod/fast/pod-delete.yaml" "$out/stages/"
  chmod -R u+w "$out/stages"
  mark_built "$out" kwok
}

build_helm() {
  local v; v=$(pinned helm helm.sh/helm/v3)
  local k; k=$(pinned kubernetes k8s.io/kubernetes)
  local out="$CACHE/helm-$v"
  is_built "$out" helm && { log "helm $v cached in $out"; return; }
  log "helm $v"
  mkdir -p "$out/bin"
  # Without the Kubernetes version stamped in, `helm template` and `helm lint` assume 1.20
  # (.Capabilities.KubeVersion); stamp the minor of the control plane the tests run.
  local minor=${k#v1.}; minor=${minor%%.*}
  local ld="-s -w -X helm.sh/helm/v3/internal/version.version=$v"
  ld+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ld+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
  done
  (cd "$TOOLS/helm" && CGO_ENABLED=0 with_progress "helm" \
     go build -trimpath -ldflags "$ld" -o "$out/bin/helm" helm.sh/helm/v3/cmd/helm)
  mark_built "$out" helm
}

build_adapter() {
  local v; v=$(pinned prometheus-adapter sigs.k8s.io/prometheus-adapter)
  local out="$CACHE/prometheus-adapter-$v"
  is_built "$out" prometheus-adapter && { log "prometheus-adapter $v cached in $out"; return; }
  log "prometheus-adapter $v (HPA external metrics for the end-to-end tests)"
  mkdir -p "$out/bin"
  (cd "$TOOLS/prometheus-adapter" && CGO_ENABLED=0 with_progress "prometheus-adapter" \
     go build -trimpath -ldflags "-s -w" -o "$out/bin/prometheus-adapter" sigs.k8s.io/prometheus-adapter/cmd/adapter)
  mark_built "$out" prometheus-adapter
}

# Cluster API's core manager (its main package is the module root), with what a management
# cluster installs beside it: every core CRD and the webhook configurations. devcluster points
# the CRDs' conversion webhooks and these configurations at the manager's loopback port.
build_capi() {
  local v; v=$(pinned cluster-api sigs.k8s.io/cluster-api)
  local out="$CACHE/cluster-api-$v"
  is_built "$out" cluster-api && { log "cluster-api $v cached in $out"; return; }
  log "cluster-api $v: the core manager (about 2 min cold on 2 cores)"
  local minor=${v#v1.}; minor=${minor%%.*}
  local ld="-s -w" pkg=sigs.k8s.io/cluster-api/version
  ld+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  mkdir -p "$out/bin" "$out/crds" "$out/webhook"
  (cd "$TOOLS/cluster-api" && CGO_ENABLED=0 with_progress "cluster-api manager" \
     go build -trimpath -ldflags "$ld" -o "$out/bin/cluster-api-manager" sigs.k8s.io/cluster-api)
  local cdir; cdir=$(module_dir cluster-api sigs.k8s.io/cluster-api)
  cp "$cdir"/config/crd/bases/*.yaml "$out/crds/"
  cp "$cdir/config/webhook/manifests.yaml" "$out/webhook/"
  chmod -R u+w "$out/crds" "$out/webhook"
  mark_built "$out" cluster-api
}

# Karpenter with its kwok cloud provider (binary renamed: `kwok` is the fake kubelet's name
# here) and its kwok DRA driver, and their CRDs. Karpenter's go.mod asks for a newer Go than the
# machine's: its pinned go.mod names the toolchain, which the go command fetches from the module
# proxy for this part only (checked against the proxy's checksum database like any module).
build_karpenter() {
  local v; v=$(pinned karpenter sigs.k8s.io/karpenter)
  local out="$CACHE/karpenter-$v"
  is_built "$out" karpenter && { log "karpenter $v cached in $out"; return; }
  local toolchain; toolchain=$(cd "$TOOLS/karpenter" && go mod edit -json | python3 -c 'import json,sys; print(json.load(sys.stdin)["Toolchain"])')
  log "karpenter $v: the kwok provider and the kwok DRA driver, with $toolchain (about 3 min cold on 2 cores)"
  mkdir -p "$out/bin" "$out/crds"
  (export GOTOOLCHAIN=$toolchain; cd "$TOOLS/karpenter" && CGO_ENABLED=0 with_progress "karpenter (kwok provider)" \
     go build -trimpath -ldflags "-s -w" -o "$out/bin/karpenter-kwok" sigs.k8s.io/karpenter/kwok \
   && CGO_ENABLED=0 with_progress "karpenter's kwok DRA driver" \
     go build -trimpath -ldflags "-s -w" -o "$out/bin/karpenter-dra-kwok-driver" sigs.k8s.io/karpenter/dra-kwok-driver)
  local kdir; kdir=$(GOTOOLCHAIN=$toolchain module_dir karpenter sigs.k8s.io/karpenter)
  cp "$kdir"/kwok/charts/crds/*.yaml "$kdir"/kwok/apis/crds/*.yaml "$kdir"/dra-kwok-driver/pkg/apis/crds/*.yaml "$out/crds/"
  chmod -R u+w "$out/crds"
  mark_built "$out" karpenter
}

# Unversioned NVML names that nvidia-ml-py calls, mapped to the versioned symbols the bridge
# exports (the list in the upstream Makefile). Without them nvidia-ml-py cannot load the library.
NVML_ALIASES=(
  nvmlDeviceGetPciInfo=nvmlDeviceGetPciInfo_v3
  nvmlDeviceGetHandleByPciBusId=nvmlDeviceGetHandleByPciBusId_v2
  nvmlDeviceGetNvLinkRemotePciInfo=nvmlDeviceGetNvLinkRemotePciInfo_v2
  nvmlDeviceRemoveGpu=nvmlDeviceRemoveGpu_v2
  nvmlDeviceGetGridLicensableFeatures=nvmlDeviceGetGridLicensableFeatures_v4
  nvmlEventSetWait=nvmlEventSetWait_v2
  nvmlDeviceGetAttributes=nvmlDeviceGetAttributes_v2
  nvmlComputeInstanceGetInfo=nvmlComputeInstanceGetInfo_v2
  nvmlDeviceGetComputeRunningProcesses=nvmlDeviceGetComputeRunningProcesses_v3
  nvmlDeviceGetGraphicsRunningProcesses=nvmlDeviceGetGraphicsRunningProcesses_v3
  nvmlDeviceGetMPSComputeRunningProcesses=nvmlDeviceGetMPSComputeRunningProcesses_v3
  nvmlDeviceGetGpuInstancePossiblePlacements=nvmlDeviceGetGpuInstancePossiblePlacements_v2
  nvmlVgpuInstanceGetLicenseInfo=nvmlVgpuInstanceGetLicenseInfo_v2
  nvmlDeviceGetDriverModel=nvmlDeviceGetDriverModel_v2
)

# NVIDIA's mock libnvidia-ml (github.com/NVIDIA/k8s-test-infra, pkg/gpu/mocknvml). Its source
# comes from the module proxy where that serves it, else from $MOCKNVML_SRC; either way the
# pinned go.mod/go.sum and the project's patches (hack/tools/mocknvml/patches) are laid over a
# writable copy and the bridge is built read-only from it.
build_mocknvml() {
  local v; v=$(cat "$TOOLS/mocknvml/VERSION")
  local out="$CACHE/mocknvml-$v"
  is_built "$out" mocknvml && { log "mock NVML $v cached in $out"; return; }
  log "NVIDIA mock NVML $v (cgo shared library)"
  local src why
  # Asked outside any module, so that nothing is written to the pins.
  if why=$(cd "$(mktemp -d)" && GOFLAGS= go mod download -json "github.com/NVIDIA/k8s-test-infra@$v" 2>&1); then
    src=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])' <<<"$why")
    log "  source: the module proxy ($src)"
  elif [ -d "$MOCKNVML_SRC/pkg/gpu/mocknvml" ]; then
    src=$(cd "$MOCKNVML_SRC" && pwd)
    log "  the module proxy refuses github.com/NVIDIA/k8s-test-infra ($(grep -o '[0-9][0-9][0-9] [A-Z][A-Za-z ]*' <<<"$why" | head -1)); source: $src"
  else
    log "  the module proxy refuses github.com/NVIDIA/k8s-test-infra and no source copy is at $MOCKNVML_SRC (set GPUMON_MOCKNVML_SRC)"
    return 1
  fi
  local dir="$CACHE/src/mocknvml-$v"
  rm -rf "$dir"; mkdir -p "$dir/pkg/gpu"
  cp -r "$src/pkg/gpu/mocknvml" "$dir/pkg/gpu/"
  cp "$src/LICENSE" "$dir/" 2>/dev/null || true
  chmod -R u+w "$dir"
  cp "$TOOLS/mocknvml/go.mod" "$TOOLS/mocknvml/go.sum" "$dir/"
  local p
  for p in "$TOOLS"/mocknvml/patches/*.patch; do
    [ -e "$p" ] || continue
    # A patch the source already carries (the copy beside the checkout has upstream fixes applied) is skipped.
    if patch -d "$dir" -p1 -R --dry-run -s -f < "$p" >/dev/null 2>&1; then
      log "  patch $(basename "$p"): already in the source"
    else
      patch -d "$dir" -p1 -s -f < "$p" || { log "  patch $(basename "$p") does not apply"; return 1; }
      log "  patch $(basename "$p"): applied"
    fi
  done
  local ldflags="" pair
  for pair in "${NVML_ALIASES[@]}"; do ldflags+=" -Wl,--defsym,$pair"; done
  mkdir -p "$out/lib" "$out/configs"
  # go-nvml's generated calls name every NVML function, deprecated ones too: silence that.
  (cd "$dir/pkg/gpu/mocknvml" && CGO_ENABLED=1 CGO_CFLAGS="-O2 -Wno-deprecated-declarations" CGO_LDFLAGS_ALLOW='--defsym|-soname' \
     CGO_LDFLAGS="$ldflags -Wl,-soname,libnvidia-ml.so.1" \
     with_progress "libnvidia-ml.so (mock)" go build -tags nopadding -buildmode=c-shared \
       -o "$out/lib/libnvidia-ml.so.1.mock" ./bridge) || return 1
  ln -sf libnvidia-ml.so.1.mock "$out/lib/libnvidia-ml.so.1"
  ln -sf libnvidia-ml.so.1 "$out/lib/libnvidia-ml.so"
  rm -f "$out/lib/libnvidia-ml.so.1.h"
  cp "$dir"/pkg/gpu/mocknvml/configs/*.yaml "$out/configs/"
  chmod -R u+w "$out/configs"
  mark_built "$out" mocknvml
}

fetch_crds() {
  local capi promop certmanager
  capi=$(pinned crds sigs.k8s.io/cluster-api)
  promop=$(pinned crds github.com/prometheus-operator/prometheus-operator)
  certmanager=$(pinned crds github.com/cert-manager/cert-manager)
  local out="$CACHE/crds-capi-$capi-promop-$promop-certmanager-$certmanager"
  is_built "$out" crds && { log "CRDs cached in $out"; return; }
  log "CRDs: cluster-api $capi, prometheus-operator $promop, cert-manager $certmanager"
  mkdir -p "$out"
  local cdir pdir mdir
  cdir=$(module_dir crds sigs.k8s.io/cluster-api)
  pdir=$(module_dir crds github.com/prometheus-operator/prometheus-operator)
  mdir=$(module_dir crds github.com/cert-manager/cert-manager)
  for k in machinedeployments machinesets machinepools; do
    cp "$cdir/config/crd/bases/cluster.x-k8s.io_$k.yaml" "$out/"
  done
  for k in servicemonitors podmonitors prometheusrules; do
    cp "$pdir/example/prometheus-operator-crd/monitoring.coreos.com_$k.yaml" "$out/"
  done
  for k in certificates issuers clusterissuers; do
    cp "$mdir/deploy/crds/cert-manager.io_$k.yaml" "$out/"
  done
  chmod -R u+w "$out"
  mark_built "$out" crds
}

parts=("$@"); [ ${#parts[@]} -eq 0 ] && parts=(all)
for p in "${parts[@]}"; do
  case "$p" in
    all) fetch_crds; build_mocknvml; build_kwok; build_etcd; build_kube; build_helm; build_adapter
         build_capi; build_karpenter ;;
    adapter) build_adapter ;;
    capi) build_capi ;; karpenter) build_karpenter ;;
    kube) build_kube ;; etcd) build_etcd ;; kwok) build_kwok ;;
    mocknvml) build_mocknvml ;; crds) fetch_crds ;; helm) build_helm ;;
    *) echo "unknown part: $p (all|kube|etcd|kwok|mocknvml|crds|helm|adapter|capi|karpenter)" >&2; exit 2 ;;
  esac
done
log "tools ready in $CACHE"
