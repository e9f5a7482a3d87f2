"""Marks the Machine (and Node) a scale-down removes, so Cluster API deletes that one."""

from __future__ import annotations

import contextlib

from gpumon.controller.core.contract import DELETE_MACHINE_ANNOTATION
from gpumon.controller.core.pools import PoolNode, ScaleTarget
from gpumon.kube.client import KubeApi, NotFound


async def mark_for_deletion(api: KubeApi, node: PoolNode, target: ScaleTarget) -> None:
    """``cluster.x-k8s.io/delete-machine`` on the node's Machine (Cluster API deletes marked
    Machines first when replicas go down) and on the Node itself, where people and providers
    without Machine objects look."""
    mark = {"metadata": {"annotations": {DELETE_MACHINE_ANNOTATION: "gpumon"}}}
    if target.is_cluster_api and node.machine:
        ns = node.machine_namespace or target.namespace
        path = f"/apis/{target.group}/{target.version}/namespaces/{ns}/machines/{node.machine}"
        with contextlib.suppress(NotFound):
            await api.patch(path, mark)
    await api.patch(f"/api/v1/nodes/{node.name}", mark)
