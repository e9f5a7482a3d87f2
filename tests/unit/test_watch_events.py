"""What a watcher is told (gpumon.exporter.watch_events, pure) and how its queue behaves when
it falls behind (gpumon.exporter.watchers)."""

from __future__ import annotations

from gpumon.exporter.watch_events import BackendChange, HealthChange, watch_events
from gpumon.exporter.watchers import Watcher
from gpumon.gpu.model import (
    FastFields,
    GpuIdentity,
    GpuSample,
    HealthReason,
    HealthState,
    HealthVerdict,
    PodGpuUsage,
    PodRef,
    Snapshot,
    XidEvent,
)


def _xid13(at: float) -> XidEvent:
    return XidEvent("GPU-0", 13, at, 0)


def _snap(
    up: bool,
    *verdicts: HealthVerdict,
    xids: tuple[XidEvent, ...] = (),
    celsius: float | None = None,
    pods: tuple[PodGpuUsage, ...] = (),
) -> Snapshot:
    gpus = tuple(
        GpuSample(
            GpuIdentity(i, f"GPU-{i}", "m", "b"),
            FastFields(temperature_gpu_celsius=celsius),
            None,
            v,
            0.0,
            xids=xids,
        )
        for i, v in enumerate(verdicts)
    )
    return Snapshot("n", None, gpus, pods, 5.0, up, up)


def test_watch_events_are_changes_of_what_a_watch_line_carries() -> None:
    ok = HealthVerdict(HealthState.HEALTHY)
    hot = HealthVerdict(HealthState.DEGRADED, (HealthReason("Thermal", "88 C", HealthState.DEGRADED),))
    hotter = HealthVerdict(HealthState.DEGRADED, (HealthReason("Thermal", "89 C", HealthState.DEGRADED),))
    ecc = HealthVerdict(HealthState.DEGRADED, (HealthReason("EccContained", "Xid 94", HealthState.DEGRADED),))

    def events(before: Snapshot | None, after: Snapshot) -> tuple[object, ...]:
        return watch_events(before, after, hot_celsius=87.0)

    assert [type(e).__name__ for e in events(None, _snap(True, ok))] == ["BackendChange", "HealthChange"]
    assert events(_snap(True, ok, hot), _snap(True, ok, hotter)) == (), "same reason, new detail"
    (change,) = events(_snap(True, ok, hot), _snap(True, ok, ecc))
    assert isinstance(change, HealthChange) and change.sample.identity.index == 1 and change.previous == hot
    assert change.verdict_changed, "a new reason code: the sampler logs it"
    assert events(_snap(True, ok), _snap(False, ok)) == (BackendChange(False, 5.0),)
    # An informational Xid leaves the verdict healthy but is news to the controller, and so is
    # the same code seen again (a new time).
    (news,) = events(_snap(True, ok), _snap(True, ok, xids=(_xid13(1.0),)))
    assert isinstance(news, HealthChange) and news.sample.xids == (_xid13(1.0),) and news.previous == ok
    assert not news.verdict_changed
    assert len(events(_snap(True, ok, xids=(_xid13(1.0),)), _snap(True, ok, xids=(_xid13(2.0),)))) == 1
    # The temperature is news at or above the exporter's degraded threshold, by the whole degree.
    assert events(_snap(True, ok, celsius=60.0), _snap(True, ok, celsius=80.0)) == (), "cool: quiet"
    assert len(events(_snap(True, ok), _snap(True, ok, celsius=60.0))) == 1, "first known"
    assert len(events(_snap(True, ok, celsius=86.0), _snap(True, ok, celsius=87.0))) == 1, "crossing"
    assert len(events(_snap(True, hot, celsius=88.0), _snap(True, hot, celsius=89.0))) == 1
    assert events(_snap(True, hot, celsius=88.0), _snap(True, hot, celsius=88.2)) == ()
    # So are the pods on a GPU.
    usage = PodGpuUsage(PodRef("ml", "a", "main"), 0, "GPU-0")
    (placed,) = events(_snap(True, ok), _snap(True, ok, pods=(usage,)))
    assert isinstance(placed, HealthChange) and placed.pods == (usage.ref,)


async def test_a_watcher_that_falls_behind_is_told_to_resync() -> None:
    w = Watcher(maxsize=2)
    w.push([BackendChange(True, 1.0), BackendChange(False, 2.0), BackendChange(True, 3.0)])
    assert w.queue.qsize() == 1 and w.queue.get_nowait() is None
