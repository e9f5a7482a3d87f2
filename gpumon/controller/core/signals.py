"""What the controller knows about each GPU, and the one interface its two sources implement.

Purely data: a source (:mod:`gpumon.controller.shell.signal_sources`) keeps the latest
:class:`FleetSignals` up to date in the background; policy reads it. Every reading carries the
time it was observed, so its age is always known: a reading older than the policy's
``stale_after`` counts as unknown, and unknown never causes remediation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from operator import attrgetter
from types import MappingProxyType
from typing import Protocol

from gpumon.gpu.health import Signal
from gpumon.gpu.model import HealthState, HealthVerdict, PodRef, RecoveryAction

_NO_VALUES: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class XidSeen:
    """An Xid code and the Unix time it was last seen on the GPU."""

    code: int
    at: float


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU as last observed. ``None`` fields were not reported (unsupported or not fetched)."""

    uuid: str
    index: int
    observed_at: float
    temperature_celsius: float | None = None
    memory_utilization_ratio: float | None = None
    ecc_uncorrectable: int | None = None
    row_remap_failure: bool | None = None
    lost: bool | None = None
    # What the driver says the GPU needs; None when the driver does not report it.
    recovery_action: RecoveryAction | None = None
    # The exporter's own verdict (gpumon_gpu_health), with its reasons.
    health: HealthVerdict | None = None
    # Xid codes with when each was last seen; None when the source cannot tell. Which of them
    # count as recent is the policy's call (its own Xid window), never the source's.
    xids: tuple[XidSeen, ...] | None = None
    # Pods the exporter attributes to this GPU (meaningful when the node's pods_attributed).
    pods: tuple[PodRef, ...] = ()
    # Values of gpu-scoped PromQL rules, by rule name.
    custom: Mapping[str, float] = field(default_factory=lambda: _NO_VALUES)
    # Signals whose value the source did not fetch because no rule holds for it: judged "does
    # not hold", unlike None (unknown). The Prometheus source asks only for the values some rule
    # could hold for, so that its answers follow what is wrong, not the size of the fleet.
    quiet: frozenset[Signal] = frozenset()


@dataclass(frozen=True, slots=True)
class NodeReading:
    """One node's GPUs as last observed by a source."""

    node: str
    # When the node's data was last confirmed (a heartbeat counts: it says nothing changed).
    observed_at: float
    gpus: tuple[GpuReading, ...]
    # True when the exporter reports which pods use which GPU on this node (a partial drain).
    pods_attributed: bool = False
    # Values of node-scoped PromQL rules, by rule name.
    custom: Mapping[str, float] = field(default_factory=lambda: _NO_VALUES)
    # The exporter places some pod on one of the node's GPUs: the node is busy, without asking
    # the API (the autoscaler's scale-down reads this).
    busy: bool = False
    # False for a summary: the Prometheus source reads a node that no answer names as wrong and
    # that the reconciler holds nothing on as a whole (fresh, busy, nothing wrong), not GPU by
    # GPU, so ``gpus`` is empty. A node gpumon holds is decided only on a reading GPU by GPU.
    gpus_read: bool = True

    def gpu(self, uuid: str) -> GpuReading | None:
        for g in self.gpus:
            if g.uuid == uuid:
                return g
        return None


@dataclass(frozen=True, slots=True)
class FleetSignals:
    nodes: Mapping[str, NodeReading]
    # False while the source itself cannot be reached (Prometheus down, API down).
    source_up: bool = True


EMPTY_FLEET = FleetSignals(MappingProxyType({}), source_up=False)

# What a reading says, apart from when it was taken.
_NODE_SAYS = attrgetter(*(f.name for f in fields(NodeReading) if f.name not in ("observed_at", "gpus")))
_GPU_SAYS = attrgetter(*(f.name for f in fields(GpuReading) if f.name not in ("observed_at", "xids")))


def _xid_codes(g: GpuReading) -> tuple[int, ...] | None:
    return None if g.xids is None else tuple(x.code for x in g.xids)


def says_the_same(a: NodeReading, b: NodeReading) -> bool:
    """Whether two readings of a node differ only in when they were taken (the Xids' times
    included: a polled source stamps each with its scrape). A GPU falling behind its node's
    reading is not the same (it goes stale on its own)."""
    if _NODE_SAYS(a) != _NODE_SAYS(b) or len(a.gpus) != len(b.gpus):
        return False
    return all(
        _GPU_SAYS(x) == _GPU_SAYS(y)
        and _xid_codes(x) == _xid_codes(y)
        and a.observed_at - x.observed_at == b.observed_at - y.observed_at
        for x, y in zip(a.gpus, b.gpus, strict=True)
    )


def is_news(old: NodeReading, new: NodeReading, at: float, stale_after_seconds: float) -> bool:
    """Whether a polled source must tell the reconciler of ``new``, replacing ``old`` at time
    ``at``. A newer scrape of the same values is not news while ``old`` is still fresh: the
    reconciler's staleness check reads the newest reading when ``old`` would go stale, and
    told of every scrape, it evaluated every node of the fleet every round. Once ``old`` may
    have gone stale, the reconciler may have judged the node so, and only news brings it back
    (a node whose exporter or Prometheus was away returns with the values it left with)."""
    return at >= old.observed_at + stale_after_seconds or not says_the_same(old, new)


def exporter_says_wrong(reading: NodeReading | None) -> bool:
    """Whether the exporter judged any GPU of ``reading`` worse than healthy. Only the order in
    which the reconciler looks at nodes follows it (those first); the policy decides."""
    return reading is not None and any(
        g.health is not None and g.health.state is not HealthState.HEALTHY for g in reading.gpus
    )


ChangeCallback = Callable[[Iterable[str]], None]
"""Told the names of nodes whose readings changed, so the reconciler looks at them soon."""


class SignalSource(Protocol):
    name: str

    def current(self) -> FleetSignals:
        """The latest readings; cheap, never blocks."""

    async def run(self, on_change: ChangeCallback) -> None:
        """Keep :meth:`current` fresh until cancelled; never raises on network failures."""
