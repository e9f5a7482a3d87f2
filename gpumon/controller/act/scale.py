"""A pool target's ``/scale``: set its replicas, and keep the autoscaler's record on it (both
read back by :func:`gpumon.controller.read.read_scale`).

Both writes are JSON merge patches guarded by the resourceVersion that was read, so a
concurrent change answers 409 and the round is planned again (:mod:`.retry`); replicas are
written as an explicit integer, so 0 is written, not dropped.
"""

from __future__ import annotations

from gpumon.controller.core.contract import RECORD_ANNOTATION
from gpumon.controller.core.contract.autoscaler import Record, record_to_annotation
from gpumon.controller.core.pools import ScaleTarget
from gpumon.kube.client import KubeApi


async def set_replicas(api: KubeApi, target: ScaleTarget, replicas: int, resource_version: str) -> str:
    """Patch ``spec.replicas``; raises Conflict when the target changed since it was read.
    Returns the new resourceVersion."""
    body = {"metadata": {"resourceVersion": resource_version}, "spec": {"replicas": int(replicas)}}
    answer = await api.patch(target.scale_path, body)
    return str((answer.get("metadata") or {}).get("resourceVersion", ""))


async def write_record(api: KubeApi, target: ScaleTarget, record: Record, resource_version: str) -> str:
    """Write the record on the target, guarded like :func:`set_replicas`; returns the new
    resourceVersion."""
    body = {
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": {RECORD_ANNOTATION: record_to_annotation(record)},
        }
    }
    answer = await api.patch(target.path, body)
    return str((answer.get("metadata") or {}).get("resourceVersion", ""))
