"""Every field of the controller's GpuReading comes from the device model through the wire, in
both of the direct source's readers (a watch line, an /api/v1/snapshot), or is listed as unknown
to that reader with why (NOT_ON_THE_STREAM, NOT_IN_THE_SNAPSHOT in
gpumon/controller/shell/signal_sources/direct.py).

A GPU with every field set (tests/unit/every_field.py) is written by the exporter's writer, parsed
and folded as the controller does; each reading field must hold the device-model value
:func:`from_the_model` says it comes from. A field added to GpuReading fails here until it is
given its origin below and filled by the readers, or listed as unknown to them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from every_field import every_field

from gpumon.controller.core.signals import GpuReading, XidSeen
from gpumon.controller.shell.signal_sources.direct import (
    NOT_IN_THE_SNAPSHOT,
    NOT_ON_THE_STREAM,
    ExporterView,
    on_line,
    on_snapshot,
    reading_of,
)
from gpumon.gpu.model import GpuSample, HealthState, PodGpuUsage, Snapshot
from gpumon.wire import v1 as wire

NOW = 2_000_000_000.0


def from_the_model(g: GpuSample, pods: tuple[PodGpuUsage, ...]) -> dict[str, object]:
    """Where each GpuReading field comes from in the device model (``observed_at`` aside: each
    reader has its own time)."""
    assert g.fast is not None and g.slow is not None
    return {
        "uuid": g.identity.uuid,
        "index": g.identity.index,
        "temperature_celsius": g.fast.temperature_gpu_celsius,
        "memory_utilization_ratio": g.fast.memory_utilization_ratio,
        "ecc_uncorrectable": g.slow.ecc_uncorrected,
        "row_remap_failure": g.slow.row_remap_failure,
        "recovery_action": g.slow.recovery_action,
        "lost": g.lost,
        "health": g.health,
        "xids": tuple(XidSeen(e.xid, e.timestamp) for e in sorted(g.xids, key=lambda e: e.xid)),
        "pods": tuple(p.ref for p in pods),
    }


def _gpu_and_pods() -> tuple[GpuSample, tuple[PodGpuUsage, ...]]:
    g = every_field(GpuSample)
    pods = every_field(Snapshot).pods
    return g, tuple(
        sorted((dataclasses.replace(p, gpu_uuid=g.identity.uuid) for p in pods), key=lambda p: p.ref.pod)
    )


def _check(
    reading: GpuReading, expected: Mapping[str, object], unknown: Mapping[str, str], reader: str
) -> None:
    problems = []
    for f in dataclasses.fields(GpuReading):
        got = getattr(reading, f.name)
        if f.name in unknown:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if got != default:
                problems.append(
                    f"GpuReading.{f.name} is listed as unknown to the {reader}, yet read: {got!r}"
                )
        elif f.name == "observed_at":
            continue
        elif f.name not in expected:
            problems.append(
                f"GpuReading.{f.name}: say where it comes from in the device model (from_the_model in "
                f"tests/unit/test_gpu_reading_coverage.py) and read it in the direct source's {reader} "
                f"reader (carrying it on the wire if it is not there), or list it with why in "
                f"NOT_ON_THE_STREAM / NOT_IN_THE_SNAPSHOT in "
                f"gpumon/controller/shell/signal_sources/direct.py."
            )
        elif got != expected[f.name]:
            problems.append(f"GpuReading.{f.name} from the {reader}: {expected[f.name]!r} sent, {got!r} read")
    assert not problems, "\n".join(problems)


def test_every_reading_field_comes_through_a_watch_line_or_is_listed_unknown() -> None:
    g, pods = _gpu_and_pods()
    line = wire.parse_watch_line(
        wire.encode(wire.health_line(g, tuple(p.ref for p in pods), HealthState.HEALTHY, node="n1", at=NOW))
    )
    view, _ = on_line(ExporterView("n1"), line, now=NOW + 1)
    node = reading_of(view)
    assert node is not None
    (reading,) = node.gpus
    assert reading.observed_at == NOW + 1, "the stream confirms a GPU until it changes"
    _check(reading, from_the_model(g, pods), NOT_ON_THE_STREAM, "stream")


def test_every_reading_field_comes_through_a_snapshot_or_is_listed_unknown() -> None:
    g, pods = _gpu_and_pods()
    snapshot = Snapshot("n1", None, (g,), pods, NOW, True, True)
    doc = wire.parse_snapshot(wire.encode(wire.snapshot_document(snapshot)))
    node = reading_of(on_snapshot(ExporterView("n1"), doc, now=NOW + 1))
    assert node is not None
    (reading,) = node.gpus
    assert reading.observed_at == g.sampled_at, "the exporter's sample time, not the fetch"
    _check(reading, from_the_model(g, pods), NOT_IN_THE_SNAPSHOT, "snapshot")
