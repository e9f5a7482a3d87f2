"""What the sampler knows about each GPU between ticks, and how a reading changes it.

Pure: values in, values out, no clock (``now`` is a parameter), no I/O and no log. The sampler
(:mod:`gpumon.exporter.sampler`) holds one :class:`GpuState` per GPU and replaces it with the
functions here as reads, losses and Xid events arrive; :func:`to_sample` turns it into the
:class:`~gpumon.devices.model.GpuSample` a snapshot carries, judged once by
:func:`gpumon.gpu_health.judge`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gpumon.devices.model import FastFields, GpuIdentity, GpuSample, SlowFields, XidEvent
from gpumon.gpu_health import HealthPolicy, judge
from gpumon.wire.v1 import MAX_XIDS_PER_GPU

_NO_COUNTS: Mapping[int, int] = MappingProxyType({})
_NO_XIDS: Mapping[int, XidEvent] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class GpuState:
    """What the sampler knows about one GPU between ticks."""

    identity: GpuIdentity
    fast: FastFields | None = None
    slow: SlowFields | None = None
    sampled_at: float = 0.0  # wall time of the last good fast read; 0 = never
    lost: bool = False
    xid_counts: Mapping[int, int] = field(default_factory=lambda: _NO_COUNTS)
    # Xid code -> its latest event, as the backend delivered it (timestamp included), oldest
    # first; at most MAX_XIDS_PER_GPU codes, so a storm of new codes cannot grow it.
    xids: Mapping[int, XidEvent] = field(default_factory=lambda: _NO_XIDS)
    last_xid: int | None = None


def with_fast(state: GpuState, fields: FastFields, now: float) -> GpuState:
    return replace(state, fast=fields, sampled_at=now, lost=False)


def with_slow(state: GpuState, fields: SlowFields) -> GpuState:
    return replace(state, slow=fields, lost=False)


def with_lost(state: GpuState) -> GpuState:
    # A lost GPU reports nothing: keeping its last readings would pretend it still works.
    return replace(state, fast=None, slow=None, lost=True)


def with_xid(state: GpuState, event: XidEvent) -> GpuState:
    counts = dict(state.xid_counts)
    counts[event.xid] = counts.get(event.xid, 0) + 1
    latest = {code: ev for code, ev in state.xids.items() if code != event.xid}
    latest[event.xid] = event
    while len(latest) > MAX_XIDS_PER_GPU:
        del latest[next(iter(latest))]
    return replace(
        state,
        xid_counts=MappingProxyType(counts),
        xids=MappingProxyType(latest),
        last_xid=event.xid,
    )


def to_sample(state: GpuState, *, now: float, policy: HealthPolicy) -> GpuSample:
    verdict = judge(
        fast=state.fast,
        slow=state.slow,
        recent_xids=state.xids.values(),
        lost=state.lost,
        now=now,
        policy=policy,
    )
    return GpuSample(
        identity=state.identity,
        fast=state.fast,
        slow=state.slow,
        health=verdict,
        sampled_at=state.sampled_at,
        xid_counts=state.xid_counts,
        lost=state.lost,
        last_xid=state.last_xid,
        xids=tuple(sorted(state.xids.values(), key=lambda e: e.xid)),
    )


def carry_over(old: Mapping[int, GpuState], identities: Sequence[GpuIdentity]) -> dict[int, GpuState]:
    """States for a fresh device list: a GPU seen before (same UUID) keeps its counters."""
    by_uuid = {s.identity.uuid: s for s in old.values()}
    out = {}
    for ident in identities:
        prev = by_uuid.get(ident.uuid)
        out[ident.index] = replace(prev, identity=ident) if prev is not None else GpuState(ident)
    return out
