"""The tool builds are pinned: every part's module graph is complete in its committed go.mod and
go.sum (hack/tools/<part>/), so `hack/build-tools.sh` resolves nothing and cannot float.

These run `go list -mod=readonly` against the local module cache with the proxy switched off:
an incomplete pin fails here with the error a fresh machine's build would hit, at the cost of a
package load rather than a cold build."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpumon.devcluster import binaries

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "hack" / "tools"
BUILD_PARTS = ("kubernetes", "etcd", "kwok", "helm", "prometheus-adapter", "cluster-api", "karpenter")


def _edit_json(part: str) -> dict[str, Any]:
    out = subprocess.run(
        ["go", "mod", "edit", "-json"], cwd=TOOLS / part, capture_output=True, text=True, check=True
    )
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def _toolchain(part: str) -> str:
    """The machine's Go, or the toolchain a part's go.mod names (Karpenter's): the one
    hack/build-tools.sh exports for it, which the module cache must then hold."""
    return str(_edit_json(part).get("Toolchain") or "local")


def _go(
    args: list[str], cwd: Path, toolchain: str = "local", **extra: str
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "GOTOOLCHAIN": toolchain,
        "GOFLAGS": "-mod=readonly -buildvcs=false",
        "GOPROXY": "off",  # what is not pinned and cached must fail, not be fetched
        **extra,
    }
    return subprocess.run(["go", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _requires(part: str) -> dict[str, str]:
    return {r["Path"]: r["Version"] for r in _edit_json(part)["Require"] or ()}


@pytest.mark.parametrize("part", BUILD_PARTS)
def test_module_graph_is_complete_and_pinned(part: str) -> None:
    toolchain = _toolchain(part)
    listed = _go(
        ["list", "-e", "-tags", "tools", "-f", '{{join .Imports " "}}', "."], TOOLS / part, toolchain
    )
    packages = listed.stdout.split()
    assert packages, f"{part}: tools.go names no package to build ({listed.stderr.strip()})"
    deps = _go(["list", "-deps", "-tags", "tools", *packages], TOOLS / part, toolchain, CGO_ENABLED="0")
    assert deps.returncode == 0, f"{part}: the pinned module graph is incomplete:\n{deps.stderr[-3000:]}"


def test_mock_nvml_module_graph_is_complete_and_pinned(tmp_path: Path) -> None:
    """The bridge builds from the pinned go.mod/go.sum laid over the source build-tools.sh used."""
    version = (TOOLS / "mocknvml" / "VERSION").read_text().strip()
    source = binaries.cache_dir() / "src" / f"mocknvml-{version}"
    assert (source / "pkg").is_dir(), (
        f"the mock NVML's source is not in the tools cache ({source}): run `make setup`"
    )
    shutil.copytree(source / "pkg", tmp_path / "pkg")
    for name in ("go.mod", "go.sum"):
        shutil.copy(TOOLS / "mocknvml" / name, tmp_path / name)
    deps = _go(["list", "-deps", "./pkg/gpu/mocknvml/bridge"], tmp_path, CGO_ENABLED="1")
    assert deps.returncode == 0, f"mocknvml: the pinned module graph is incomplete:\n{deps.stderr[-3000:]}"


def test_crd_modules_are_checksummed() -> None:
    sums = (TOOLS / "crds" / "go.sum").read_text()
    for module, version in _requires("crds").items():
        assert f"{module} {version} h1:" in sums, (
            f"{module}@{version} has no checksum in hack/tools/crds/go.sum"
        )


def test_harness_versions_are_the_pinned_ones() -> None:
    """gpumon/devcluster/binaries.py finds the cache directories build-tools.sh names after the pins."""
    assert _requires("kubernetes")["k8s.io/kubernetes"] == binaries.KUBERNETES_VERSION
    assert _requires("etcd")["go.etcd.io/etcd/server/v3"] == binaries.ETCD_VERSION
    assert _requires("kwok")["sigs.k8s.io/kwok"] == binaries.KWOK_VERSION
    assert _requires("helm")["helm.sh/helm/v3"] == binaries.HELM_VERSION
    assert _requires("prometheus-adapter")["sigs.k8s.io/prometheus-adapter"] == binaries.ADAPTER_VERSION
    assert _requires("cluster-api")["sigs.k8s.io/cluster-api"] == binaries.CLUSTER_API_VERSION
    assert _requires("karpenter")["sigs.k8s.io/karpenter"] == binaries.KARPENTER_VERSION
    assert (TOOLS / "mocknvml" / "VERSION").read_text().strip() == binaries.MOCKNVML_VERSION
    crds = _requires("crds")
    assert (
        f"crds-capi-{crds['sigs.k8s.io/cluster-api']}"
        f"-promop-{crds['github.com/prometheus-operator/prometheus-operator']}"
        f"-certmanager-{crds['github.com/cert-manager/cert-manager']}"
    ) == binaries.CRDS_DIR_NAME


def test_one_cluster_api_version() -> None:
    """The manager that runs and the CRDs every control plane installs come from one release."""
    assert _requires("crds")["sigs.k8s.io/cluster-api"] == _requires("cluster-api")["sigs.k8s.io/cluster-api"]


def test_only_karpenter_builds_with_a_fetched_toolchain() -> None:
    """GOTOOLCHAIN=local for every part but Karpenter, whose go.mod asks for a newer Go."""
    named = {part: _toolchain(part) for part in BUILD_PARTS}
    assert {part: t for part, t in named.items() if t != "local"} == {"karpenter": "go1.27.3"}


def test_the_build_resolves_nothing() -> None:
    """Resolution belongs to hack/pin-tools.sh only; the build script may not float."""
    script = (ROOT / "hack" / "build-tools.sh").read_text()
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    for forbidden in ("go mod tidy", "go get ", "go install ", "-mod=mod", "@latest"):
        assert forbidden not in code, f"hack/build-tools.sh runs `{forbidden.strip()}`"
    assert 'GOFLAGS="-mod=readonly' in code
