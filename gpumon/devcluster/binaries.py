"""Where the control plane's binaries, kwok's stages and the CRDs are: the cache that
``hack/build-tools.sh`` fills, keyed by version (keep the versions here in step with it)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.8"
KWOK_VERSION = "v0.8.0"
CRDS_DIR_NAME = "crds-capi-v1.13.5-promop-v0.93.0"

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
        for p in (tools.etcd, tools.kube_apiserver, tools.kube_controller_manager, tools.kube_scheduler,
                  tools.kubectl, tools.kwok, *tools.kwok_stages)
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
