"""Raw API objects and views for the demo's unit tests."""

from __future__ import annotations

from typing import Any

from gpumon.demo.views import ClusterView, cluster_view
from gpumon.gpu.model import (
    FastFields,
    GpuIdentity,
    GpuSample,
    HealthState,
    HealthVerdict,
    PodGpuUsage,
    PodRef,
    Snapshot,
)
from gpumon.wire import v1 as wire

POOL_LABEL = "devcluster.gpumon.io/pool"


def node(
    name: str,
    *,
    pool: str | None = "gpu-pool",
    ready: bool = True,
    taint: str | None = None,
    condition: str | None = None,
    gpus: int = 4,
    unschedulable: bool = False,
) -> dict[str, Any]:
    labels = {"kubernetes.io/os": "linux", **({POOL_LABEL: pool} if pool else {})}
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if condition is not None:
        conditions.append({"type": "GpuUnhealthy", "status": "True", "reason": condition})
    spec: dict[str, Any] = {"unschedulable": unschedulable}
    if taint is not None:
        spec["taints"] = [{"key": "gpumon.io/gpu-unhealthy", "value": "unhealthy", "effect": taint}]
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {"conditions": conditions, "allocatable": {"nvidia.com/gpu": str(gpus)} if gpus else {}},
    }


def pod(
    name: str,
    node_name: str | None,
    *,
    app: str = "trainer",
    phase: str = "Running",
    gpus: int = 1,
    gpu_mem: int = 0,
    created: str = "2026-01-01T00:00:00Z",
    deleting: bool = False,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    if gpu_mem:
        limits["aliyun.com/gpu-mem"] = str(gpu_mem)
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "gpumon-demo",
        "labels": {"app": app},
        "creationTimestamp": created,
        "annotations": annotations or {},
    }
    if deleting:
        meta["deletionTimestamp"] = created
    spec: dict[str, Any] = {"containers": [{"name": "cuda", "resources": {"limits": limits}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def pool(desired: int, replicas: int | None = None, available: int | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "gpu-pool"},
        "spec": {"replicas": desired},
        "status": {
            "replicas": desired if replicas is None else replicas,
            "availableReplicas": desired if available is None else available,
        },
    }


def snapshot(
    gpus: int,
    pods: dict[int, list[str]] | None = None,
    states: dict[int, str] | None = None,
) -> wire.SnapshotDoc:
    """An exporter's snapshot as the exporter builds it: ``pods`` by GPU index, ``states`` the
    verdicts of the GPUs that are not healthy."""
    return wire.snapshot_document(
        Snapshot(
            node="n",
            driver=None,
            gpus=tuple(
                GpuSample(
                    identity=GpuIdentity(i, f"GPU-{i}", "A100", f"0000:0{i}:00.0"),
                    fast=FastFields(utilization_ratio=0.5),
                    slow=None,
                    health=HealthVerdict(HealthState((states or {}).get(i, "healthy"))),
                    sampled_at=1.0,
                )
                for i in range(gpus)
            ),
            pods=tuple(
                PodGpuUsage(PodRef("gpumon-demo", p, "cuda"), i, f"GPU-{i}")
                for i, names in (pods or {}).items()
                for p in names
            ),
            taken_at=1.0,
            backend_up=True,
            complete=True,
        )
    )


def view(
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    md: dict[str, Any] | None = None,
    snapshots: dict[str, wire.SnapshotDoc] | None = None,
    events: list[dict[str, Any]] | None = None,
    at: float = 100.0,
    jobs: list[dict[str, Any]] | None = None,
) -> ClusterView:
    return cluster_view(
        at,
        node_objs=nodes,
        pod_objs=pods,
        pool_obj=md,
        event_objs=events or [],
        snapshots=snapshots or {},
        job_objs=jobs or [],
    )


def job(
    node: str, step: str, *, succeeded: bool = True, created: str = "2026-01-01T00:00:00Z"
) -> dict[str, Any]:
    """A repair step's Job as the controller makes it, and as the Job controller leaves it."""
    return {
        "metadata": {
            "name": f"gpumon-{step}-{node}-1",
            "labels": {"gpumon.io/repair-step": step},
            "annotations": {"gpumon.io/repair-node": node},
            "creationTimestamp": created,
        },
        "status": {"succeeded": 1} if succeeded else {"active": 1},
    }
