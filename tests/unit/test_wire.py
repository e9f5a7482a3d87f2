"""The wire schema (gpumon.wire.v1): every message kind survives JSON unchanged, and input
outside the schema or its limits is refused with a kind to count, never half-read."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from gpumon.gpu.model import (
    DriverInfo,
    FastFields,
    GpuIdentity,
    GpuSample,
    HealthReason,
    HealthState,
    HealthVerdict,
    MemoryInfo,
    MigInstance,
    PodGpuUsage,
    PodRef,
    ProcessSample,
    RecoveryAction,
    SlowFields,
    Snapshot,
    XidEvent,
)
from gpumon.k8s.dra import ClaimDevice, ClaimRef, DeviceRef
from gpumon.wire import v1 as wire

BAD = HealthVerdict(
    HealthState.UNHEALTHY,
    (
        HealthReason("XidFatal", "Xid 79", HealthState.UNHEALTHY),
        HealthReason("Thermal", "temperature 96 C", HealthState.UNHEALTHY),
    ),
)


def sample(index: int = 0, **kw: Any) -> GpuSample:
    fields: dict[str, Any] = {
        "identity": GpuIdentity(index, f"GPU-{index}", "A100", "0000:07:00.0", serial="s1", mig_mode=True),
        "fast": FastFields(
            memory=MemoryInfo(80, 10, 60, 10),
            utilization_ratio=0.5,
            memory_utilization_ratio=0.25,
            temperature_gpu_celsius=96.5,
            temperature_memory_celsius=None,
            power_watts=300.0,
            throttle_reasons=frozenset({"hw_thermal", "sw_thermal"}),
            processes=(ProcessSample(42, 1 << 30, 0.5, 0.1, "python"),),
        ),
        "slow": SlowFields(
            pcie_replays=1,
            ecc_corrected=7,
            ecc_uncorrected=3,
            remapped_rows_uncorrectable=1,
            row_remap_pending=False,
            row_remap_failure=True,
            mig_instances=(MigInstance(1, 0, "3g.40gb", "MIG-1", MemoryInfo(40, 1, 39)),),
            recovery_action=RecoveryAction.DRAIN_AND_RESET,
        ),
        "health": BAD,
        "sampled_at": 1700000000.25,
        "xid_counts": {79: 2, 13: 1},
        "last_xid": 79,
        "xids": (
            XidEvent(f"GPU-{index}", 13, 1699999990.5, index),
            XidEvent(f"GPU-{index}", 79, 1699999999.75, index),
        ),
    }
    fields.update(kw)
    return GpuSample(**fields)


POD = PodGpuUsage(
    PodRef("ml", "train-0", "main", "uid-1"),
    0,
    "GPU-0",
    1 << 30,
    0.4,
    allocated_resources=("nvidia.com/gpu",),
)
SNAPSHOT = Snapshot(
    "n1",
    DriverInfo("550.54", "12.4", "12.550"),
    (sample(0), sample(1, fast=None, slow=None, lost=True)),
    (POD,),
    1700000000.5,
    True,
    False,
)


def every_line() -> list[wire.WatchLine]:
    return [
        wire.state_line(SNAPSHOT, node="n1", now=1.5),
        wire.state_line(None, node="n1", now=1.5),
        wire.health_line(SNAPSHOT.gpus[0], (POD.ref,), HealthState.HEALTHY, node="n1", at=2.5),
        wire.health_line(SNAPSHOT.gpus[1], (), None, node="n1", at=2.5),
        wire.backend_line(False, node="n1", at=3.0),
        wire.heartbeat_line(node="n1", at=4.0),
    ]


@pytest.mark.parametrize("line", every_line(), ids=lambda line: line.type)
def test_every_watch_line_round_trips(line: wire.WatchLine) -> None:
    raw = wire.encode(line)
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1
    assert json.loads(raw)["schema"] == 1
    assert wire.parse_watch_line(raw) == line


def test_the_snapshot_document_round_trips_and_keeps_every_number() -> None:
    doc = wire.snapshot_document(SNAPSHOT)
    again = wire.parse_snapshot(wire.encode(doc))
    assert again == doc
    g = again.gpus[0]
    assert g.fast is not None and g.fast.temperature_gpu_celsius == 96.5
    assert g.fast.throttle_reasons == ("hw_thermal", "sw_thermal")
    assert g.slow is not None and (g.slow.ecc_uncorrected, g.slow.row_remap_failure) == (3, True)
    assert g.slow.recovery_action is RecoveryAction.DRAIN_AND_RESET
    assert [(x.code, x.at, x.count) for x in g.xids] == [(13, 1699999990.5, 1), (79, 1699999999.75, 2)]
    assert again.gpus[1].lost and again.gpus[1].fast is None
    assert again.pods[0].ref == wire.Pod(namespace="ml", pod="train-0", container="main", uid="uid-1")


def test_a_gpu_line_carries_the_numbers_the_policy_reads() -> None:
    (g, lost) = wire.state_line(SNAPSHOT, node="n1", now=1.0).gpus
    assert (g.temperature_celsius, g.ecc_uncorrected, g.row_remap_failure, g.row_remap_pending) == (
        96.5,
        3,
        True,
        False,
    )
    assert [(x.code, x.at) for x in g.xids] == [(13, 1699999990.5), (79, 1699999999.75)]
    assert tuple(map(wire.pod_ref, g.pods)) == (POD.ref,) and wire.health_verdict(g.health) == BAD
    assert lost.lost and lost.temperature_celsius is None and lost.ecc_uncorrected is None and lost.pods == ()
    # NVML's number, as a number; unknown (not NONE) for the lost GPU.
    assert (g.recovery_action, lost.recovery_action) == (RecoveryAction.DRAIN_AND_RESET, None)
    assert json.loads(wire.encode(g))["recovery_action"] == 4
    assert _refused(_state(gpus=[{**json.loads(wire.encode(g)), "recovery_action": 8}])) == "invalid"


def _state(**override: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(wire.encode(wire.state_line(SNAPSHOT, node="n1", now=1.0)))
    doc.update(override)
    return doc


def _refused(doc: Any) -> str:
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    with pytest.raises(wire.WireError) as refused:
        wire.parse_watch_line(raw)
    return refused.value.kind


def test_garbage_and_wrong_types_are_refused_as_invalid() -> None:
    gpu = _state()["gpus"][0]
    assert _refused(b"not json") == "invalid"
    assert _refused(b"[]") == "invalid"
    assert _refused(_state(type="mystery")) == "invalid"
    assert _refused(_state(time="1.0")) == "invalid", "a number as a string"
    assert _refused(_state(backend_up=1)) == "invalid"
    assert _refused(_state(gpus=[{**gpu, "temperature_celsius": True}])) == "invalid", (
        "a boolean is no number"
    )
    assert _refused(_state(gpus=[{**gpu, "ecc_uncorrected": "3"}])) == "invalid"
    assert _refused(_state(gpus=[{**gpu, "ecc_uncorrected": -1}])) == "invalid"
    assert _refused(_state(gpus=[{**gpu, "xids": [79]}])) == "invalid", "a bare code has no time"
    assert _refused(_state(gpus=[{**gpu, "health": {"state": "fine", "reasons": []}}])) == "invalid"
    assert _refused(b'{"type":"heartbeat","schema":1,"node":"n1","time":NaN}') == "invalid"


def test_another_or_no_schema_version_is_refused() -> None:
    assert _refused(_state(schema=2)) == "schema"
    assert _refused({k: v for k, v in _state().items() if k != "schema"}) == "schema"
    with pytest.raises(wire.WireError) as refused:
        wire.parse_snapshot(
            json.dumps({**wire.snapshot_document(SNAPSHOT).model_dump(mode="json"), "schema": 0}).encode()
        )
    assert refused.value.kind == "schema"


def test_unknown_fields_are_ignored_for_rolling_upgrades() -> None:
    doc = _state(added_later={"x": 1})
    doc["gpus"][0]["power_watts"] = 300.0
    assert wire.parse_watch_line(json.dumps(doc).encode()) == wire.state_line(SNAPSHOT, node="n1", now=1.0)


def test_limits_are_enforced_on_parse() -> None:
    gpu = _state()["gpus"][1]
    assert _refused(_state(gpus=[gpu] * (wire.MAX_GPUS + 1))) == "invalid"
    assert wire.parse_watch_line(json.dumps(_state(gpus=[gpu] * wire.MAX_GPUS)).encode())
    xid = {"code": 79, "at": 1.0, "count": 1}
    assert _refused(_state(gpus=[{**gpu, "xids": [xid] * (wire.MAX_XIDS_PER_GPU + 1)}])) == "invalid"
    pod = {"namespace": "ml", "pod": "p", "container": "c", "uid": ""}
    half = {**gpu, "pods": [pod] * (wire.MAX_PODS // 2 + 1)}
    assert _refused(_state(gpus=[half, half])) == "invalid", "pods are bounded per node, not only per GPU"
    assert _refused(_state(node="n" * (wire.MAX_TEXT + 1))) == "invalid"
    assert _refused(b" " * (wire.MAX_LINE_BYTES + 1)) == "oversize"
    with pytest.raises(wire.WireError) as refused:
        wire.parse_snapshot(b" " * (wire.MAX_DOCUMENT_BYTES + 1))
    assert refused.value.kind == "oversize"


def test_writers_truncate_what_can_grow_so_readers_never_refuse_it() -> None:
    many = tuple(PodGpuUsage(PodRef("ml", f"p{i}", "c"), 0, "GPU-0") for i in range(wire.MAX_PODS + 10))
    events = tuple(XidEvent("GPU-0", code, float(code)) for code in range(wire.MAX_XIDS_PER_GPU + 10))
    big = Snapshot("n1", None, (sample(0, xids=events),), many, 1.0, True, True)
    line = wire.state_line(big, node="n1", now=1.0)
    assert len(line.gpus[0].pods) == wire.MAX_PODS
    assert [x.code for x in line.gpus[0].xids] == list(range(10, wire.MAX_XIDS_PER_GPU + 10)), "the latest"
    assert wire.parse_watch_line(wire.encode(line)) == line
    doc = wire.snapshot_document(big)
    assert len(doc.pods) == wire.MAX_PODS and wire.parse_snapshot(wire.encode(doc)) == doc


def test_the_snapshot_bounds_nvlink_counters_and_claims_and_its_writer_keeps_within_them() -> None:
    counters = {(link, kind): 1 for link in range(100) for kind in ("replay", "recovery", "crc")}
    device = DeviceRef("gpu.nvidia.com", "n1", "gpu-0")
    claims = tuple(ClaimDevice(ClaimRef("ml", f"c{i}"), device) for i in range(99))
    big = Snapshot(
        "n1",
        None,
        (sample(0, slow=SlowFields(nvlink_errors=counters)),),
        (replace(POD, claims=claims),),
        1.0,
        True,
        True,
    )
    doc = wire.snapshot_document(big)
    slow = doc.gpus[0].slow
    assert slow is not None and len(slow.nvlink_errors) == wire.MAX_NVLINK_COUNTERS
    assert (slow.nvlink_errors[0].link, slow.nvlink_errors[0].kind) == (0, "crc"), "sorted by link, kind"
    assert doc.pods[0].claims == tuple(
        wire.Claim.model_validate(c, from_attributes=True) for c in claims[: wire.MAX_NAMES]
    )
    assert wire.parse_snapshot(wire.encode(doc)) == doc
    raw = json.loads(wire.encode(doc))
    raw["gpus"][0]["slow"]["nvlink_errors"] *= 2
    with pytest.raises(wire.WireError, match="nvlink_errors"):
        wire.parse_snapshot(json.dumps(raw).encode())
    raw = json.loads(wire.encode(doc))
    raw["pods"][0]["claims"] *= 2
    with pytest.raises(wire.WireError, match="claims"):
        wire.parse_snapshot(json.dumps(raw).encode())


def test_lines_are_split_without_buffering_past_the_limit() -> None:
    lines = wire.LineSplitter(limit=10)
    assert lines.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert lines.feed(b":2}\n\n") == [b'{"b":2}'], "blank lines are skipped"
    assert lines.feed(b"0123456789") == []
    with pytest.raises(wire.WireError) as refused:
        lines.feed(b"x")
    assert refused.value.kind == "oversize"
