"""What the sampler knows about each GPU between ticks, and how a reading changes it.

Pure: values in, values out, no clock (``now`` is a parameter), no I/O and no log. The sampler
(:mod:`gpumon.exporter.sampler`) holds one :class:`GpuState` per GPU and replaces it with the
functions here as reads, losses and Xid events arrive; :func:`to_sample` turns it into the
:class:`~gpumon.gpu.model.GpuSample` a snapshot carries, judged once by
:func:`gpumon.gpu.health.judge`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gpumon.gpu.health import HealthPolicy, judge
from gpumon.gpu.model import (
    XID_OTHER,
    FastFields,
    GpuIdentity,
    GpuSample,
    RecoveryAction,
    SlowFields,
    XidEvent,
    documented_xid,
)
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
    # Xid code -> events seen; at most MAX_XIDS_PER_GPU codes plus XID_OTHER (see xid_counter).
    xid_counts: Mapping[int, int] = field(default_factory=lambda: _NO_COUNTS)
    # Xid code -> its latest event, as the backend delivered it (timestamp included), oldest
    # first; at most MAX_XIDS_PER_GPU codes, so a storm of new codes cannot grow it.
    xids: Mapping[int, XidEvent] = field(default_factory=lambda: _NO_XIDS)
    last_xid: int | None = None


def with_fast(state: GpuState, fields: FastFields, now: float) -> GpuState:
    return replace(state, fast=fields, sampled_at=now, lost=False)


def with_slow(state: GpuState, fields: SlowFields) -> GpuState:
    return replace(state, slow=fields, lost=False)


def with_recovery_action(state: GpuState, action: RecoveryAction | None) -> GpuState:
    """The recovery action read again on its own (after an Xid), kept with the slow fields it
    belongs to; before the first slow reading there is nothing to keep it with."""
    if state.slow is None or state.slow.recovery_action == action:
        return state
    return replace(state, slow=replace(state.slow, recovery_action=action))


def with_lost(state: GpuState) -> GpuState:
    # A lost GPU reports nothing: keeping its last readings would pretend it still works.
    return replace(state, fast=None, slow=None, lost=True)


def xid_counter(counts: Mapping[int, int], code: int) -> int:
    """The key ``code`` is counted under: itself if documented and already counted or there is
    room for one more code, else XID_OTHER. Each key is a series of
    ``gpumon_gpu_xid_errors_total``, so a storm of new codes must not add keys without end."""
    if not documented_xid(code):
        return XID_OTHER
    if code in counts or len(counts.keys() - {XID_OTHER}) < MAX_XIDS_PER_GPU:
        return code
    return XID_OTHER


def with_xids(state: GpuState, events: Iterable[XidEvent]) -> GpuState:
    """The state after ``events`` (in the order they came), folded in one step: a storm comes in
    batches of hundreds, and copying the maps once per event was most of its cost."""
    counts = dict(state.xid_counts)
    latest = dict(state.xids)
    last = state.last_xid
    for event in events:
        key = xid_counter(counts, event.xid)
        counts[key] = counts.get(key, 0) + 1
        latest.pop(event.xid, None)  # seen again: now the newest
        latest[event.xid] = event
        last = event.xid
    while len(latest) > MAX_XIDS_PER_GPU:
        del latest[next(iter(latest))]
    return replace(
        state,
        xid_counts=MappingProxyType(counts),
        xids=MappingProxyType(latest),
        last_xid=last,
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
