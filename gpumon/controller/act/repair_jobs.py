"""The repair ladder's calls to the API: its record on the Node and a node-local step's Job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumon.controller.core import contract as c
from gpumon.controller.core.contract.repair import RepairRecord, record_to_json
from gpumon.kube.client import Conflict, Json, KubeApi, NotFound


def jobs_path(namespace: str) -> str:
    return f"/apis/batch/v1/namespaces/{namespace}/jobs"


async def write_record(api: KubeApi, node: str, record: RepairRecord) -> Json:
    """The record as the node's ``gpumon.io/repair`` annotation. A JSON merge patch of that one
    key: the quarantine's own writes (other keys, guarded by resourceVersion) are untouched."""
    patch = {"metadata": {"annotations": {c.ANNOTATION_REPAIR: record_to_json(record)}}}
    return await api.patch(f"/api/v1/nodes/{node}", patch)


async def ensure_job(api: KubeApi, manifest: Mapping[str, Any]) -> bool:
    """Create the Job; False when it is there already (its name is the attempt's)."""
    try:
        await api.post(jobs_path(manifest["metadata"]["namespace"]), manifest)
    except Conflict:
        return False
    return True


async def read_job(api: KubeApi, namespace: str, name: str) -> Json | None:
    try:
        return await api.get(f"{jobs_path(namespace)}/{name}")
    except NotFound:
        return None
