"""Writes to a Node: a quarantine plan's patches, and cordoning a node a pool gives up."""

from __future__ import annotations

from collections.abc import Callable

from gpumon.controller.act.retry import DEFAULT_RETRY, RetryPolicy, write_replanned
from gpumon.controller.core import contract as c
from gpumon.controller.core.objects import NodeView, node_from_json, to_rfc3339
from gpumon.controller.core.plans import NodeWrite
from gpumon.kube.client import KubeApi


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{name}"


async def apply_node_write(
    api: KubeApi,
    write: NodeWrite,
    replan: Callable[[NodeView], NodeWrite | None],
    policy: RetryPolicy = DEFAULT_RETRY,
) -> NodeView | None:
    """Apply a plan's writes (the merge patch, then the status patch). On 409 the node changed
    since the cache saw it: re-read it, re-plan against it and try again (:mod:`.retry`).
    Returns the node as written, or None if nothing was left to write."""
    path = node_path(write.node)

    async def apply(w: NodeWrite) -> NodeView | None:
        result: NodeView | None = None
        if w.merge_patch is not None:
            result = node_from_json(await api.patch(path, w.merge_patch))
        if w.status_patch is not None:
            result = node_from_json(await api.patch(path + "/status", w.status_patch, strategic=True))
        return result

    async def reread_and_replan() -> NodeWrite | None:
        return replan(node_from_json(await api.get(path)))

    return await write_replanned(write, apply, reread_and_replan, policy=policy, what=path)


async def cordon_for_removal(api: KubeApi, node: str, now: float) -> None:
    body = {
        "metadata": {"annotations": {c.REMOVING_ANNOTATION: to_rfc3339(now)}},
        "spec": {"unschedulable": True},
    }
    await api.patch(node_path(node), body)


async def uncordon(api: KubeApi, node: str) -> None:
    body = {"metadata": {"annotations": {c.REMOVING_ANNOTATION: None}}, "spec": {"unschedulable": None}}
    await api.patch(node_path(node), body)
