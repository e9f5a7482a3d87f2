"""What ``/api/v1/watch`` streams: the changes between two snapshots that a reader acts on.

Pure: two snapshots in, events out, no queue, no clock and no log. The sampler computes the
events after each render and hands them to every subscriber's queue
(:mod:`gpumon.exporter.watchers`); the server turns each into a wire line (docs/exporter.md,
"The watch stream").
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumon.gpu.model import GpuSample, HealthVerdict, PodRef, SlowFields, Snapshot
from gpumon.wire.v1 import placement


@dataclass(frozen=True, slots=True)
class HealthChange:
    """A GPU changed in something its watch line carries (docs/exporter.md)."""

    sample: GpuSample
    pods: tuple[PodRef, ...]  # the pods attributed to the GPU
    previous: HealthVerdict | None  # None: a GPU seen for the first time
    at: float

    @property
    def verdict_changed(self) -> bool:
        """The verdict's state or reason codes moved, not only a number, an Xid's time or the
        pods; a GPU seen for the first time has no verdict to change from."""
        return self.previous is not None and _codes(self.sample.health) != _codes(self.previous)


@dataclass(frozen=True, slots=True)
class BackendChange:
    up: bool
    at: float


WatchEvent = HealthChange | BackendChange


def _codes(v: HealthVerdict) -> tuple[str, ...]:
    return (v.state.value, *(r.code for r in v.reasons))


def _line_key(g: GpuSample, pods: tuple[PodRef, ...], hot_celsius: float) -> tuple[object, ...]:
    """What makes a GPU's watch line worth sending again. Discrete evidence counts on every
    change; the temperature only at or above ``hot_celsius`` (the exporter's degraded
    threshold), to the whole degree, so the cool majority of a fleet is quiet on the wire."""
    temp = g.fast.temperature_gpu_celsius if g.fast is not None else None
    # Unknown, cool (any value below the threshold), or hot to the degree.
    heat = None if temp is None else round(temp) if temp >= hot_celsius else "cool"
    slow = g.slow or SlowFields()
    return (
        _codes(g.health),
        heat,
        slow.ecc_uncorrected,
        slow.row_remap_pending,
        slow.row_remap_failure,
        slow.recovery_action,
        g.lost,
        tuple((e.xid, e.timestamp) for e in g.xids),
        pods,
    )


def watch_events(
    previous: Snapshot | None, current: Snapshot, *, hot_celsius: float
) -> tuple[WatchEvent, ...]:
    """What changed between two snapshots: the backend going up or down, and every GPU whose
    watch line would differ (see :func:`_line_key`)."""
    events: list[WatchEvent] = []
    if previous is None or previous.backend_up != current.backend_up:
        events.append(BackendChange(current.backend_up, current.taken_at))
    before = {g.identity.uuid: g for g in previous.gpus} if previous else {}
    pods_before = placement(previous.pods) if previous else {}
    pods_now = placement(current.pods)
    for g in current.gpus:
        uuid = g.identity.uuid
        old, pods = before.get(uuid), pods_now.get(uuid, ())
        if old is None or _line_key(old, pods_before.get(uuid, ()), hot_celsius) != _line_key(
            g, pods, hot_celsius
        ):
            events.append(HealthChange(g, pods, old.health if old else None, current.taken_at))
    return tuple(events)
