"""Shared-GPU allocations written on pods by the sharing schedulers. Pure: no I/O.

gpushare and cGPU (AliyunContainerService/gpushare-scheduler-extender and -device-plugin):
  the scheduler extender writes ``ALIYUN_COM_GPU_MEM_IDX`` (the GPU *index*),
  ``ALIYUN_COM_GPU_MEM_POD`` (sum of the containers' ``aliyun.com/gpu-mem`` limits) and
  ``ALIYUN_COM_GPU_MEM_ASSIGNED="false"``; the device plugin flips ``ASSIGNED`` to ``"true"``
  when the kubelet allocates the containers. Each container gets its own
  ``aliyun.com/gpu-mem`` limit on that GPU, in the device plugin's ``--memory-unit`` (``GiB``
  by default, ``MiB`` optional; config ``pods.gpushare_memory_unit``). cGPU adds the limit
  ``aliyun.com/gpu-core.percentage`` (percent of the GPU's SMs, multiples of 5 in ACK).
HAMi (Project-HAMi/HAMi ``pkg/device/devices.go``):
  ``hami.io/vgpu-devices-allocated`` holds one entry per container, each ended by ``;``;
  an entry lists its devices as ``UUID,Type,memMiB,cores:`` (cores in percent, 0 = no core
  limit). Entries are aligned with the pod's containers, empty ones kept; releases since the
  init-container support also list init containers first. Both layouts are recognised by the
  entry count.

Both programs read shared pods through this module: the exporter for its per-pod allocation
series, the controller for which card a pod holds when it drains a bad one (:func:`pod_cards`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpumon.k8s.resources import CGPU_CORE_RESOURCE, GPUSHARE_MEMORY_RESOURCE, whole_quantity

GPUSHARE_INDEX = "ALIYUN_COM_GPU_MEM_IDX"
GPUSHARE_POD_MEMORY = "ALIYUN_COM_GPU_MEM_POD"
GPUSHARE_ASSIGNED = "ALIYUN_COM_GPU_MEM_ASSIGNED"
HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"

ANNOTATIONS = frozenset({GPUSHARE_INDEX, GPUSHARE_POD_MEMORY, GPUSHARE_ASSIGNED, HAMI_ALLOCATED})
"""The pod annotations this module reads: all the pod projection needs to keep."""
RESOURCES = frozenset({GPUSHARE_MEMORY_RESOURCE, CGPU_CORE_RESOURCE})
"""The container resources this module reads."""

MEMORY_UNITS: Mapping[str, int] = {"GiB": 1 << 30, "MiB": 1 << 20}
_MIB = 1 << 20


class ContainerSpec(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def limits(self) -> Mapping[str, str]: ...


@dataclass(frozen=True, slots=True)
class ContainerLimits:
    name: str
    # The shared-GPU resources (RESOURCES) from limits, else requests, as quantities.
    limits: Mapping[str, str]


def container_limits(c: Mapping[str, Any]) -> ContainerLimits:
    """A container of a raw Pod object as this module reads it. Raises KeyError without a name."""
    resources = c.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    picked = {r: str(limits.get(r, requests.get(r))) for r in RESOURCES if r in limits or r in requests}
    return ContainerLimits(name=c["name"], limits=picked)


@dataclass(frozen=True, slots=True)
class SharedAllocation:
    """What one container was given on one GPU, which is named by ``gpu_uuid`` or ``gpu_index``."""

    container: str
    gpu_uuid: str | None
    gpu_index: int | None
    memory_bytes: int | None
    core_ratio: float | None


@dataclass(frozen=True, slots=True)
class SharingResult:
    allocations: tuple[SharedAllocation, ...] = ()
    # Error-metric kinds for annotations or limits that could not be used.
    problems: tuple[str, ...] = ()


def shared_allocations(
    annotations: Mapping[str, str],
    init_containers: Sequence[ContainerSpec],
    containers: Sequence[ContainerSpec],
    *,
    gpushare_unit_bytes: int,
) -> SharingResult:
    """Every shared-GPU allocation a pod's annotations and limits describe."""
    gpushare = _gpushare(annotations, (*init_containers, *containers), gpushare_unit_bytes)
    hami = _hami(annotations.get(HAMI_ALLOCATED), init_containers, containers)
    return SharingResult(gpushare.allocations + hami.allocations, gpushare.problems + hami.problems)


@dataclass(frozen=True, slots=True)
class CardRef:
    """A GPU a pod holds a share of, as its annotations name it: by UUID (HAMi) or by index
    (gpushare, cGPU)."""

    uuid: str | None
    index: int | None

    def names(self, uuid: str, index: int) -> bool:
        return self.uuid == uuid if self.uuid is not None else self.index == index


def pod_cards(obj: Mapping[str, Any]) -> tuple[CardRef, ...]:
    """The GPUs a raw Pod object's sharing annotations place it on (none for other pods, and
    for annotations that cannot be read: such a pod is placed on no card)."""
    meta = obj.get("metadata") or {}
    raw = meta.get("annotations") if isinstance(meta, Mapping) else None
    annotations = {k: str(v) for k, v in raw.items() if k in ANNOTATIONS} if isinstance(raw, Mapping) else {}
    if not annotations:
        return ()
    try:
        spec = obj.get("spec") or {}
        init = [container_limits(c) for c in spec.get("initContainers") or ()]
        main = [container_limits(c) for c in spec.get("containers") or ()]
    except (KeyError, TypeError, AttributeError):
        return ()
    # The memory unit only scales the bytes, which do not matter here.
    result = shared_allocations(annotations, init, main, gpushare_unit_bytes=1)
    return tuple(dict.fromkeys(CardRef(a.gpu_uuid, a.gpu_index) for a in result.allocations))


def _gpushare(
    annotations: Mapping[str, str], containers: Sequence[ContainerSpec], unit_bytes: int
) -> SharingResult:
    index_text = annotations.get(GPUSHARE_INDEX)
    # Without an index the extender has not placed the pod; "false" means placed but not yet
    # allocated by the kubelet, so no container holds the memory yet.
    if index_text is None or annotations.get(GPUSHARE_ASSIGNED, "true").strip().lower() == "false":
        return SharingResult()
    index = _int(index_text)
    if index is None or index < 0:
        return SharingResult(problems=("gpushare_invalid_index",))
    problems: list[str] = []
    allocations = []
    total_units = 0
    for c in containers:
        memory = _limit(c, GPUSHARE_MEMORY_RESOURCE, problems)
        core = _limit(c, CGPU_CORE_RESOURCE, problems)
        if core is not None and not 0 < core <= 100:
            problems.append("cgpu_invalid_core")
            core = None
        if memory is None and core is None:
            continue
        total_units += memory or 0
        allocations.append(
            SharedAllocation(
                container=c.name,
                gpu_uuid=None,
                gpu_index=index,
                memory_bytes=memory * unit_bytes if memory else None,
                core_ratio=core / 100 if core else None,
            )
        )
    declared = annotations.get(GPUSHARE_POD_MEMORY)
    if declared is not None and _int(declared) != total_units:
        problems.append("gpushare_pod_memory_mismatch")
    return SharingResult(tuple(allocations), tuple(problems))


def _hami(
    value: str | None, init_containers: Sequence[ContainerSpec], containers: Sequence[ContainerSpec]
) -> SharingResult:
    if not value:
        return SharingResult()
    aligned = _align(value, [c.name for c in (*init_containers, *containers)], [c.name for c in containers])
    if aligned is None:
        return SharingResult(problems=("hami_container_mismatch",))
    allocations = []
    for name, entry in aligned:
        for device in filter(None, entry.split(":")):
            fields = device.split(",")
            memory = _int(fields[2]) if len(fields) >= 4 else None
            cores = _int(fields[3]) if len(fields) >= 4 else None
            if not fields[0] or memory is None or cores is None or memory < 0 or not 0 <= cores <= 100:
                return SharingResult(problems=("hami_invalid",))
            allocations.append(
                SharedAllocation(
                    container=name,
                    # Legacy MIG entries name the parent GPU as "GPU-…[template-slot]".
                    gpu_uuid=fields[0].split("[", 1)[0],
                    gpu_index=None,
                    memory_bytes=memory * _MIB if memory else None,
                    # 0 cores means "no core limit" in HAMi, not "no share of the GPU".
                    core_ratio=cores / 100 if cores else None,
                )
            )
    return SharingResult(tuple(allocations))


def _align(value: str, all_names: list[str], names: list[str]) -> list[tuple[str, str]] | None:
    """Pair HAMi's per-container entries with container names. Current releases end every
    entry with ``;``; older ones joined entries with ``;``, so a trailing empty entry looks
    the same as a terminator: the layout whose entry count fits the pod wins."""
    parts = value.split(";")
    layouts = [parts[:-1], parts] if value.endswith(";") else [parts]
    for entries in layouts:
        for candidate in (all_names, names):
            if len(entries) == len(candidate):
                return list(zip(candidate, entries, strict=True))
    return None


def _limit(container: ContainerSpec, resource: str, problems: list[str]) -> int | None:
    text = container.limits.get(resource)
    if text is None:
        return None
    value = whole_quantity(text)
    if value is None or value < 0:
        problems.append("invalid_quantity")
        return None
    return value


def _int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None
