"""``gpumon status allocation``: what each GPU node's cards are given, to whom, and what those
pods really use, like ``kubectl inspect gpushare``. Pure: built from raw Node and Pod objects and,
when they answered, the nodes' exporter snapshots; no I/O (the reads are in :mod:`read`).

Where each fact comes from (docs/status.md):

- **cards and their size**: gpushare/cGPU nodes from capacity (``aliyun.com/gpu-count`` cards,
  ``aliyun.com/gpu-mem`` GiB split evenly, 100 % core each); HAMi nodes from the device plugin's
  ``hami.io/node-nvidia-register`` annotation (UUID, memory MiB, core %); otherwise from the
  node's exporter snapshot (index, UUID, framebuffer) when it answered.
- **which card a share is on**: gpushare/cGPU from ``ALIYUN_COM_GPU_MEM_IDX``, HAMi from
  ``hami.io/vgpu-devices-allocated`` (both written by their scheduler extenders, not by the
  Kubernetes scheduler); whole GPUs and MIG devices are picked by the kubelet's device manager,
  so their card is known only from the exporter (its pod-resources view); without it they are
  counted per node.
- **what they use**: the exporter snapshot's per-pod entries (memory, SM ratio), per card.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpumon.k8s import sharing
from gpumon.k8s.resources import (
    CGPU_CORE_RESOURCE,
    GPUSHARE_COUNT_RESOURCE,
    GPUSHARE_MEMORY_RESOURCE,
    NVIDIA_GPU_RESOURCE,
    NVIDIA_MIG_PREFIX,
    whole_quantity,
)
from gpumon.wire.v1 import SnapshotDoc

GIB = 1 << 30
MIB = 1 << 20
HAMI_REGISTER = "hami.io/node-nvidia-register"

OVER_MEMORY = "over-memory"  # uses more framebuffer than it was given
OVER_CORE = "over-core"  # keeps more of the SMs busy than its core share
IDLE = "idle"  # holds a share and uses none of it
OVER_ALLOCATED = "over-allocated"  # a card given out beyond its size


@dataclass(frozen=True, slots=True)
class Holder:
    """One pod's share of one card (or, card unknown, of its node)."""

    pod: str  # namespace/name
    scheme: str  # gpushare | cgpu | hami | gpu | mig
    memory_gib: float | None = None  # allocated
    core_percent: int | None = None  # allocated; None: no core limit
    gpus: int = 0  # whole GPUs or MIG devices held
    mig_profile: str | None = None
    used_memory_gib: float | None = None
    utilization_percent: float | None = None
    flags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CardAllocation:
    index: int | None
    uuid: str | None
    memory_total_gib: float | None
    memory_allocated_gib: float
    core_allocated_percent: int  # of 100
    holders: tuple[Holder, ...]
    memory_used_gib: float | None = None  # the card's own reading
    utilization_percent: float | None = None
    flags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeAllocation:
    name: str
    schemes: tuple[str, ...]
    cards: tuple[CardAllocation, ...]
    # Whole GPUs and MIG devices by resource: (allocated, allocatable) from pod requests.
    devices: Mapping[str, tuple[int, int]]
    unplaced: tuple[Holder, ...]  # shares whose card is not known
    usage_source: str = ""
    usage_error: str | None = None


@dataclass(frozen=True, slots=True)
class AllocationView:
    taken_at: str
    nodes: tuple[NodeAllocation, ...]
    problems: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Card:
    index: int | None
    uuid: str | None
    memory_bytes: int | None
    cores: int = 100


@dataclass(slots=True)
class _Share:
    pod: str
    scheme: str
    card: tuple[int | None, str | None]  # (index, uuid): as the source names it
    memory_bytes: int | None = None
    core_percent: int | None = None
    gpus: int = 0
    mig_profile: str | None = None


@dataclass(frozen=True, slots=True)
class _PodCardUse:
    memory_bytes: int | None
    utilization: float | None


_Pod = Mapping[str, Any]


def _int(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def _capacity(node: Mapping[str, Any]) -> Mapping[str, Any]:
    status = node.get("status") or {}
    return status.get("allocatable") or status.get("capacity") or {}


def hami_cards(value: str | None) -> tuple[_Card, ...]:
    """HAMi's node registration: ``uuid,count,memMiB,cores,type,numa,health[,index,mode]:``
    per device (up to v2.4), or a JSON list of devices (``id``, ``devmem``, ``devcore``,
    ``index``) since."""
    if not value:
        return ()
    text = value.strip()
    cards: list[_Card] = []
    if text.startswith("["):
        try:
            devices = json.loads(text)
        except ValueError:
            return ()
        for i, d in enumerate(devices if isinstance(devices, list) else ()):
            if isinstance(d, Mapping) and d.get("id"):
                index = d.get("index")
                cards.append(
                    _Card(
                        index if isinstance(index, int) else i,
                        str(d["id"]),
                        _int(d.get("devmem")) * MIB,
                        _int(d.get("devcore")) or 100,
                    )
                )
        return tuple(cards)
    for i, entry in enumerate(e for e in text.split(":") if e.strip()):
        fields = entry.split(",")
        if len(fields) < 4 or not fields[0]:
            continue
        index = _int(fields[7]) if len(fields) >= 8 and fields[7].strip().isdigit() else i
        cards.append(_Card(index, fields[0], _int(fields[2]) * MIB, _int(fields[3]) or 100))
    return tuple(cards)


def _limits(c: Mapping[str, Any]) -> dict[str, str]:
    res = c.get("resources") or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    return {k: str(limits.get(k, requests.get(k))) for k in {*limits, *requests}}


def _shares(pod: _Pod, hami_node: bool) -> tuple[list[_Share], list[_Share]]:
    """(shares placed on a card, shares whose card is not known) of one pod. On a HAMi node
    ``nvidia.com/gpu`` counts virtual GPUs, placed by HAMi's annotation."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    init = [
        sharing.ContainerLimits(str(c.get("name", "")), _limits(c)) for c in spec.get("initContainers") or ()
    ]
    main = [sharing.ContainerLimits(str(c.get("name", "")), _limits(c)) for c in spec.get("containers") or ()]
    annotations = {k: str(v) for k, v in (meta.get("annotations") or {}).items()}
    result = sharing.shared_allocations(annotations, init, main, gpushare_unit_bytes=GIB)
    placed: dict[tuple[int | None, str | None], _Share] = {}
    for a in result.allocations:
        card = (a.gpu_index, a.gpu_uuid)
        scheme = "hami" if a.gpu_uuid is not None else ("cgpu" if a.core_ratio is not None else "gpushare")
        share = placed.setdefault(card, _Share(key, scheme, card))
        if scheme == "cgpu":
            share.scheme = "cgpu"
        if a.memory_bytes is not None:
            share.memory_bytes = (share.memory_bytes or 0) + a.memory_bytes
        if a.core_ratio is not None:
            share.core_percent = (share.core_percent or 0) + round(a.core_ratio * 100)
    unplaced: list[_Share] = []
    memory = sum(whole_quantity(c.limits.get(GPUSHARE_MEMORY_RESOURCE, "0")) or 0 for c in main)
    core = sum(whole_quantity(c.limits.get(CGPU_CORE_RESOURCE, "0")) or 0 for c in main)
    if not placed and (memory or core):
        # Bound by the scheduler, not yet given a card by the extender (or the kubelet).
        unplaced.append(
            _Share(key, "cgpu" if core else "gpushare", (None, None), memory * GIB or None, core or None)
        )
    # Whole GPUs and MIG devices: the kubelet picks the card; counted here, placed by the exporter.
    whole = sum(_int(c.limits.get(NVIDIA_GPU_RESOURCE)) for c in main)
    if whole and not placed:
        unplaced.append(_Share(key, "hami" if hami_node else "gpu", (None, None), gpus=whole))
    migs: dict[str, int] = {}
    for c in main:
        for r, q in c.limits.items():
            if r.startswith(NVIDIA_MIG_PREFIX):
                migs[r.removeprefix(NVIDIA_MIG_PREFIX)] = migs.get(
                    r.removeprefix(NVIDIA_MIG_PREFIX), 0
                ) + _int(q)
    for profile, n in sorted(migs.items()):
        if n:
            unplaced.append(_Share(key, "mig", (None, None), gpus=n, mig_profile=profile))
    return list(placed.values()), unplaced


def _holds_resources(pod: _Pod) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase not in ("Succeeded", "Failed")


def _snapshot_cards(snap: SnapshotDoc | None) -> tuple[_Card, ...]:
    if snap is None:
        return ()
    return tuple(
        _Card(
            g.identity.index,
            g.identity.uuid,
            g.fast.memory.total_bytes if g.fast is not None and g.fast.memory is not None else None,
        )
        for g in snap.gpus
    )


def _gib(n: int | None) -> float | None:
    return None if n is None else round(n / GIB, 2)


def _percent(r: float | None) -> float | None:
    return None if r is None else round(r * 100, 1)


def node_allocation(
    node: Mapping[str, Any],
    pods: Sequence[_Pod],
    snapshot: SnapshotDoc | None = None,
    snapshot_source: str = "",
    snapshot_error: str | None = None,
) -> NodeAllocation:
    """One node's cards, who holds what on each, and, with its exporter's snapshot, their use."""
    meta = node.get("metadata") or {}
    capacity = _capacity(node)
    from_exporter = _snapshot_cards(snapshot)
    hami = hami_cards((meta.get("annotations") or {}).get(HAMI_REGISTER))
    n_gpushare = _int(capacity.get(GPUSHARE_COUNT_RESOURCE))
    cards: list[_Card]
    if hami:
        cards = list(hami)
    elif n_gpushare:
        per_card = _int(capacity.get(GPUSHARE_MEMORY_RESOURCE)) * GIB // n_gpushare
        cards = [_Card(i, None, per_card) for i in range(n_gpushare)]
    else:
        cards = list(from_exporter)
    # The exporter knows each card's index and UUID: fill in what the other source left out.
    by_uuid = {c.uuid: c for c in from_exporter}
    by_index = {c.index: c for c in from_exporter}
    cards = [
        _Card(
            c.index if c.uuid not in by_uuid else by_uuid[c.uuid].index,
            c.uuid or (by_index[c.index].uuid if c.index in by_index else None),
            c.memory_bytes,
            c.cores,
        )
        for c in cards
    ]

    placed: list[_Share] = []
    unplaced: list[_Share] = []
    requested: dict[str, int] = {}
    for pod in pods:
        if not _holds_resources(pod):
            continue
        on_card, elsewhere = _shares(pod, bool(hami))
        placed += on_card
        unplaced += elsewhere
        for s in elsewhere:
            resource = NVIDIA_GPU_RESOURCE if s.scheme == "gpu" else f"{NVIDIA_MIG_PREFIX}{s.mig_profile}"
            if s.scheme in ("gpu", "mig"):
                requested[resource] = requested.get(resource, 0) + s.gpus

    # What the exporter saw: per (pod, card index) use, and whole-GPU / MIG holders by card.
    uses: dict[tuple[str, int], _PodCardUse] = {}
    exporter_placed: dict[tuple[str, int, str | None], int] = {}
    if snapshot is not None:
        for p in snapshot.pods:
            key = (f"{p.ref.namespace}/{p.ref.pod}", p.gpu_index)
            prev = uses.get(key)
            uses[key] = _PodCardUse(
                _sum(prev.memory_bytes if prev else None, p.used_memory_bytes),
                _sum(prev.utilization if prev else None, p.utilization_ratio),
            )
            if p.allocated_resources:
                profile = p.mig.profile if p.mig is not None else None
                k = (key[0], p.gpu_index, profile)
                exporter_placed[k] = exporter_placed.get(k, 0) + 1
    still_unplaced: list[_Share] = []
    for s in unplaced:
        hits = [
            (index, n)
            for (pod, index, profile), n in exporter_placed.items()
            if pod == s.pod and s.scheme in ("gpu", "mig") and profile == s.mig_profile
        ]
        if not hits:
            still_unplaced.append(s)
            continue
        for index, n in hits:
            placed.append(_Share(s.pod, s.scheme, (index, None), gpus=n, mig_profile=s.mig_profile))

    gpu_reading = {g.identity.index: g for g in snapshot.gpus} if snapshot is not None else {}
    out_cards: list[CardAllocation] = []
    known = {(c.index, c.uuid) for c in cards}
    for c in cards:
        mine = [s for s in placed if _on(s.card, c)]
        holders = tuple(_holder(s, uses.get((s.pod, c.index)) if c.index is not None else None) for s in mine)
        mem = sum(s.memory_bytes or 0 for s in mine)
        core = sum(s.core_percent or 0 for s in mine)
        flags = []
        if (c.memory_bytes is not None and mem > c.memory_bytes) or core > c.cores:
            flags.append(OVER_ALLOCATED)
        reading = gpu_reading.get(c.index) if c.index is not None else None
        fast = reading.fast if reading is not None else None
        out_cards.append(
            CardAllocation(
                index=c.index,
                uuid=c.uuid,
                memory_total_gib=_gib(c.memory_bytes),
                memory_allocated_gib=_gib(mem) or 0.0,
                core_allocated_percent=core,
                holders=tuple(sorted(holders, key=lambda h: h.pod)),
                memory_used_gib=_gib(fast.memory.used_bytes) if fast is not None and fast.memory else None,
                utilization_percent=_percent(fast.utilization_ratio) if fast is not None else None,
                flags=tuple(flags),
            )
        )
    # Shares on a card the node does not list (a stale annotation, a removed card).
    strays = [s for s in placed if not any(_on(s.card, _Card(i, u, None)) for i, u in known)]
    schemes = sorted(
        {s.scheme for s in (*placed, *unplaced)}
        | ({"hami"} if hami else set())
        | ({"gpushare"} if n_gpushare and not hami else set())
    )
    devices = {
        r: (requested.get(r, 0), _int(q))
        for r, q in sorted(capacity.items())
        if (r == NVIDIA_GPU_RESOURCE and not hami) or r.startswith(NVIDIA_MIG_PREFIX)
    }
    for r, n in requested.items():
        devices.setdefault(r, (n, 0))
    return NodeAllocation(
        name=str(meta.get("name", "")),
        schemes=tuple(schemes),
        cards=tuple(sorted(out_cards, key=lambda c: (c.index is None, c.index or 0, c.uuid or ""))),
        devices=devices,
        unplaced=tuple(sorted((_holder(s, None) for s in (*still_unplaced, *strays)), key=lambda h: h.pod)),
        usage_source=snapshot_source,
        usage_error=snapshot_error,
    )


def _on(card: tuple[int | None, str | None], c: _Card) -> bool:
    index, uuid = card
    if uuid is not None:
        return uuid == c.uuid
    return index is not None and index == c.index


def _sum(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else a + b


def _holder(s: _Share, use: _PodCardUse | None) -> Holder:
    flags: list[str] = []
    used = use.memory_bytes if use is not None else None
    util = use.utilization if use is not None else None
    if use is not None:
        if s.memory_bytes is not None and used is not None and used > s.memory_bytes:
            flags.append(OVER_MEMORY)
        if s.core_percent is not None and util is not None and util * 100 > s.core_percent:
            flags.append(OVER_CORE)
        # Idle only on evidence: memory read as 0 (None is "not known", e.g. no /proc).
        if used == 0 and not util:
            flags.append(IDLE)
    return Holder(
        pod=s.pod,
        scheme=s.scheme,
        memory_gib=_gib(s.memory_bytes),
        core_percent=s.core_percent,
        gpus=s.gpus,
        mig_profile=s.mig_profile,
        used_memory_gib=_gib(used),
        utilization_percent=_percent(util),
        flags=tuple(flags),
    )


def is_gpu_node(node: Mapping[str, Any]) -> bool:
    capacity = _capacity(node)
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return HAMI_REGISTER in annotations or any(
        r in (NVIDIA_GPU_RESOURCE, GPUSHARE_COUNT_RESOURCE) or r.startswith(NVIDIA_MIG_PREFIX)
        for r in capacity
        if _int(capacity[r]) > 0
    )


def build_allocation(
    taken_at: str,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[_Pod],
    snapshots: Mapping[str, tuple[SnapshotDoc | None, str, str | None]] | None = None,
    problems: Sequence[str] = (),
) -> AllocationView:
    """Every GPU node's allocation; ``snapshots`` by node name: (snapshot, where from, why not)."""
    snapshots = snapshots or {}
    by_node: dict[str, list[_Pod]] = {}
    for p in pods:
        name = (p.get("spec") or {}).get("nodeName")
        if name:
            by_node.setdefault(name, []).append(p)
    out = []
    for n in sorted(nodes, key=lambda n: str((n.get("metadata") or {}).get("name", ""))):
        if not is_gpu_node(n):
            continue
        name = str((n.get("metadata") or {}).get("name", ""))
        snap, source, error = snapshots.get(name, (None, "", None))
        out.append(node_allocation(n, by_node.get(name, ()), snap, source, error))
    return AllocationView(taken_at=taken_at, nodes=tuple(out), problems=tuple(problems))
