"""Where the control plane's binaries, kwok's stages, the CRDs and NVIDIA's mock NVML are: the
cache that ``hack/build-tools.sh`` fills, keyed by version. The versions are pinned in
``hack/tools/<part>/go.mod``; tests/unit/test_tool_pins.py holds the ones here equal to them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.8"
KWOK_VERSION = "v0.8.0"
CRDS_DIR_NAME = "crds-capi-v1.13.6-promop-v0.93.0-certmanager-v1.21.2"
CLUSTER_API_VERSION = "v1.13.6"
KARPENTER_VERSION = "v1.15.0"
HELM_VERSION = "v3.21.4"
ADAPTER_VERSION = "v0.12.0"
MOCKNVML_VERSION = "v0.3.1-0.20260821154203-3b2b865d91b1"

KWOK_STAGES = (
    "node-initialize",
    "node-heartbeat-with-lease",
    "pod-ready",
    "pod-complete",
    "pod-delete",
)


class ToolsMissing(Exception):
    """A binary or data file the harness needs has not been built; the message says how to fix it."""


@dataclass(frozen=True)
class Tools:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kwok: Path
    kwok_stages: tuple[Path, ...]
    crds: tuple[Path, ...]


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """The same rule as hack/build-tools.sh."""
    if env.get("GPUMON_TOOLS_CACHE"):
        return Path(env["GPUMON_TOOLS_CACHE"])
    xdg = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "gpumon" / "tools"


def locate(cache: Path | None = None) -> Tools:
    """Every path the harness runs or reads, checked to exist; raises :class:`ToolsMissing`
    naming all that are absent."""
    root = cache if cache is not None else cache_dir()
    kube = root / f"kubernetes-{KUBERNETES_VERSION}" / "bin"
    kwok = root / f"kwok-{KWOK_VERSION}"
    crds = root / CRDS_DIR_NAME
    tools = Tools(
        etcd=root / f"etcd-{ETCD_VERSION}" / "bin" / "etcd",
        kube_apiserver=kube / "kube-apiserver",
        kube_controller_manager=kube / "kube-controller-manager",
        kube_scheduler=kube / "kube-scheduler",
        kubectl=kube / "kubectl",
        kwok=kwok / "bin" / "kwok",
        kwok_stages=tuple(kwok / "stages" / f"{name}.yaml" for name in KWOK_STAGES),
        crds=tuple(sorted(crds.glob("*.yaml"))) if crds.is_dir() else (),
    )
    missing = [
        str(p)
        for p in (
            tools.etcd,
            tools.kube_apiserver,
            tools.kube_controller_manager,
            tools.kube_scheduler,
            tools.kubectl,
            tools.kwok,
            *tools.kwok_stages,
        )
        if not p.is_file()
    ]
    if not tools.crds:
        missing.append(f"{crds}/*.yaml")
    if missing:
        raise ToolsMissing(
            "the local control plane's binaries are not built yet; run `make setup` "
            f"(or `bash hack/build-tools.sh`). Missing under {root}: "
            + ", ".join(str(Path(m).relative_to(root)) if m.startswith(str(root)) else m for m in missing)
        )
    return tools


def _built(path: Path, part: str) -> Path:
    if not path.is_file():
        raise ToolsMissing(
            f"{part} is not built: run `make setup` (or `bash hack/build-tools.sh {part}`); looked for {path}"
        )
    return path


def locate_helm(cache: Path | None = None) -> Path:
    root = cache if cache is not None else cache_dir()
    return _built(root / f"helm-{HELM_VERSION}" / "bin" / "helm", "helm")


def locate_prometheus_adapter(cache: Path | None = None) -> Path:
    root = cache if cache is not None else cache_dir()
    return _built(root / f"prometheus-adapter-{ADAPTER_VERSION}" / "bin" / "prometheus-adapter", "adapter")


@dataclass(frozen=True)
class MockNvml:
    """NVIDIA's mock ``libnvidia-ml.so.1`` and the GPU profiles shipped with it."""

    lib_dir: Path
    configs: Path

    @property
    def library(self) -> Path:
        return self.lib_dir / "libnvidia-ml.so.1"

    def profile(self, name: str) -> Path:
        """``name`` as the shipped files spell it: a100, h100, l40s, t4, b200, gb200, gb300."""
        return self.configs / f"mock-nvml-config-{name}.yaml"


def locate_mock_nvml(cache: Path | None = None) -> MockNvml:
    """The mock library built by ``hack/build-tools.sh mocknvml``; raises :class:`ToolsMissing`."""
    root = (cache if cache is not None else cache_dir()) / f"mocknvml-{MOCKNVML_VERSION}"
    mock = MockNvml(lib_dir=root / "lib", configs=root / "configs")
    if not (root / ".done").is_file() or not mock.library.is_file():
        raise ToolsMissing(
            f"NVIDIA's mock NVML is not built under {root}; run `make setup` "
            "(or `bash hack/build-tools.sh mocknvml`)"
        )
    return mock


def _crds(root: Path, part: str) -> tuple[Path, ...]:
    crds = tuple(sorted((root / "crds").glob("*.yaml")))
    if not crds:
        raise ToolsMissing(
            f"{part} is not built: run `make setup` (or `bash hack/build-tools.sh {part}`); no CRDs in {root}"
        )
    return crds


@dataclass(frozen=True)
class ClusterApi:
    """Cluster API's core manager, its CRDs and its webhook configurations (the module's own
    ``config/crd/bases`` and ``config/webhook/manifests.yaml``)."""

    manager: Path
    crds: tuple[Path, ...]
    webhooks: Path


def locate_cluster_api(cache: Path | None = None) -> ClusterApi:
    """What ``hack/build-tools.sh capi`` built; raises :class:`ToolsMissing`."""
    root = (cache if cache is not None else cache_dir()) / f"cluster-api-{CLUSTER_API_VERSION}"
    return ClusterApi(
        manager=_built(root / "bin" / "cluster-api-manager", "capi"),
        crds=_crds(root, "capi"),
        webhooks=_built(root / "webhook" / "manifests.yaml", "capi"),
    )


@dataclass(frozen=True)
class Karpenter:
    """Karpenter's kwok provider, its kwok DRA driver and their CRDs."""

    controller: Path
    dra_driver: Path
    crds: tuple[Path, ...]


def locate_karpenter(cache: Path | None = None) -> Karpenter:
    """What ``hack/build-tools.sh karpenter`` built; raises :class:`ToolsMissing`."""
    root = (cache if cache is not None else cache_dir()) / f"karpenter-{KARPENTER_VERSION}"
    return Karpenter(
        controller=_built(root / "bin" / "karpenter-kwok", "karpenter"),
        dra_driver=_built(root / "bin" / "karpenter-dra-kwok-driver", "karpenter"),
        crds=_crds(root, "karpenter"),
    )
