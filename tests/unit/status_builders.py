"""Raw API objects for the status unit tests, written as the API server and gpumon's controller
write them (the annotation through the controller's own encoder)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpumon.controller.core.contract.node import GpuRecord, records_to_json
from gpumon.controller.core.objects import GpuResources, to_rfc3339
from gpumon.gpu.health import Severity
from gpumon.gpu.model import (
    FastFields,
    GpuIdentity,
    GpuSample,
    HealthReason,
    HealthState,
    HealthVerdict,
    SlowFields,
    Snapshot,
    XidEvent,
)
from gpumon.status.state import ClusterState, EventInfo, event_info, node_info, pod_info
from gpumon.wire import v1 as wire

NOW = 1_800_000_000.0
RESOURCES = GpuResources()


def at(seconds_ago: float) -> str:
    return to_rfc3339(NOW - seconds_ago)


def record(
    index: int | None, reason: str = "XidFatal", severity: Severity = Severity.UNHEALTHY, **kw: Any
) -> GpuRecord:
    return GpuRecord(
        uuid="" if index is None else f"GPU-{index}",
        index=index,
        reason=reason,
        severity=severity,
        rules=kw.pop("rules", ("xid-unhealthy",)),
        first_seen=kw.pop("first_seen", NOW - 300),
        evidence=kw.pop("evidence", "Xid 79"),
    )


def node(
    name: str,
    *,
    pool: str = "a100",
    gpus: int = 8,
    records: tuple[GpuRecord, ...] = (),
    quarantined_ago: float | None = None,
    state: str | None = None,
    cordoned: bool = False,
    cordon_preexisting: bool | None = None,
    excluded: bool = False,
    ready: bool = True,
    drain_started_ago: float | None = None,
) -> dict[str, Any]:
    labels = {"gpumon.io/pool": pool}
    if state:
        labels["gpumon.io/state"] = state
    if excluded:
        labels["gpumon.io/exclude"] = "true"
    annotations = {}
    taints = []
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if quarantined_ago is not None:
        annotations["gpumon.io/quarantined-at"] = at(quarantined_ago)
        annotations["gpumon.io/unhealthy-gpus"] = records_to_json(records)
        annotations["gpumon.io/cordon-preexisting"] = "true" if cordon_preexisting else "false"
        worst = max((r.severity for r in records), key=lambda s: s.rank)
        effect = "NoSchedule" if worst is Severity.UNHEALTHY else "PreferNoSchedule"
        taints.append({"key": "gpumon.io/gpu-unhealthy", "value": worst.value, "effect": effect})
        conditions.append(
            {
                "type": "GpuUnhealthy",
                "status": "True",
                "reason": records[0].reason,
                "message": "GPU 1 (GPU-1): XidFatal (Xid 79). Recommended: reboot",
                "lastTransitionTime": at(quarantined_ago),
            }
        )
    if drain_started_ago is not None:
        annotations["gpumon.io/drain-started-at"] = at(drain_started_ago)
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": labels, "annotations": annotations},
        "spec": {"taints": taints, "unschedulable": cordoned},
        "status": {"capacity": {"nvidia.com/gpu": str(gpus), "cpu": "96"}, "conditions": conditions},
    }


def pod(
    namespace: str,
    name: str,
    *,
    node_name: str = "",
    gpus: int = 1,
    phase: str = "Running",
    labels: dict[str, str] | None = None,
    owner: str | None = "ReplicaSet",
    created_ago: float = 60,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "namespace": namespace,
        "name": name,
        "uid": f"uid-{namespace}-{name}",
        "labels": labels or {},
        "creationTimestamp": at(created_ago),
    }
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "x", "controller": True}]
    return {
        "metadata": meta,
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": phase},
    }


def event(
    kind: str,
    name: str,
    reason: str,
    message: str,
    *,
    namespace: str = "",
    ago: float = 10,
    warning: bool = False,
) -> EventInfo:
    return event_info(
        {
            "involvedObject": {"kind": kind, "name": name, "namespace": namespace or None},
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "lastTimestamp": at(ago),
        }
    )


def state(
    nodes: Sequence[dict[str, Any]] = (), pods: Sequence[dict[str, Any]] = (), **kw: Any
) -> ClusterState:
    return ClusterState(
        now=NOW,
        nodes=tuple(node_info(n, RESOURCES) for n in nodes),
        pods=tuple(pod_info(p, RESOURCES) for p in pods),
        **kw,
    )


def snapshot_doc(name: str) -> wire.SnapshotDoc:
    """An exporter's snapshot of two GPUs, GPU 1 with Xid 79 twice, built as the exporter builds it."""
    bad = HealthVerdict(HealthState.UNHEALTHY, (HealthReason("XidFatal", "Xid 79", HealthState.UNHEALTHY),))
    gpus = tuple(
        GpuSample(
            identity=GpuIdentity(i, f"GPU-{i}", "A100-SXM4-80GB", f"0000000{i}:00:00.0"),
            fast=FastFields(temperature_gpu_celsius=40.0 + i),
            slow=SlowFields(ecc_uncorrected=0),
            health=bad if i == 1 else HealthVerdict(HealthState.HEALTHY),
            sampled_at=1.0,
            xid_counts={79: 2} if i == 1 else {},
            xids=(XidEvent(f"GPU-{i}", 79, 0.5, i),) if i == 1 else (),
        )
        for i in range(2)
    )
    return wire.snapshot_document(Snapshot(name, None, gpus, (), 1.0, True, True))
