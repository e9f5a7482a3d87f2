"""The repair ladder's replacement: the Machine or NodeClaim behind a Node, read and deleted
through the API (or, where a MachineHealthCheck covers the Machine, the Node's condition it
watches set), and the pool's nodes read to see the new one join."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumon.controller.core.contract import MACHINE_API_VERSION
from gpumon.controller.core.node_owner import NodeOwner
from gpumon.kube.client import Json, KubeApi, NotFound


async def read_node(api: KubeApi, node: str) -> Json | None:
    try:
        return await api.get(f"/api/v1/nodes/{node}")
    except NotFound:
        return None


async def read_owner(api: KubeApi, path: str) -> Json | None:
    """The Machine or NodeClaim at ``path`` (:attr:`NodeOwner.path`); None: gone."""
    try:
        return await api.get(path)
    except NotFound:
        return None


async def health_checks(api: KubeApi, namespace: str) -> list[Json]:
    """The MachineHealthChecks of a Machine's namespace (a namespace holds a cluster's few)."""
    listed = await api.get(f"/apis/{MACHINE_API_VERSION}/namespaces/{namespace}/machinehealthchecks")
    return list(listed.get("items") or ())


async def patch_node_status(api: KubeApi, node: str, patch: Mapping[str, Any]) -> None:
    await api.patch(f"/api/v1/nodes/{node}/status", patch, strategic=True)


async def delete_owner(api: KubeApi, owner: NodeOwner) -> None:
    """Delete the Machine or NodeClaim: its own controllers drain and remove the Node. Gone
    already is done."""
    try:
        await api.delete(owner.path)
    except NotFound:
        return


async def pool_nodes(api: KubeApi, selector: str) -> list[Json]:
    listed = await api.get("/api/v1/nodes", {"labelSelector": selector})
    return list(listed.get("items") or ())
