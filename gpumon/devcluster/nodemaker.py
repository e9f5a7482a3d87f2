"""Create kwok GPU nodes through the API, wait until kwok reports them Ready, and delete them
again; for tests and the demo."""

from __future__ import annotations

import functools

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpumon.devcluster import nodes, resourceslices
from gpumon.devcluster.waiting import eventually


async def node_ready(core: client.CoreV1Api, name: str) -> bool | None:
    """True once the node's Ready condition is True, else None (for :func:`eventually`)."""
    node = await core.read_node(name)
    conditions = (node.status and node.status.conditions) or []
    return True if any(c.type == "Ready" and c.status == "True" for c in conditions) else None


class NodeMaker:
    """Names nodes ``<prefix>-<n>`` and remembers them, so :meth:`delete_all` removes exactly
    what it made."""

    def __init__(self, api: client.ApiClient, prefix: str) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)
        self._prefix = prefix
        self.created: list[str] = []

    async def __call__(
        self,
        count: int = 1,
        template: nodes.NodeTemplate | None = None,
        *,
        ready: bool = True,
        timeout_seconds: float = 60.0,
    ) -> list[str]:
        names = [f"{self._prefix}-{len(self.created) + i}" for i in range(count)]
        template = template or nodes.NodeTemplate()
        for name in names:
            await self._core.create_node(nodes.manifest(name, template))
            self.created.append(name)
            if template.dra:  # its DRA driver's plugin publishes the node's devices
                await resourceslices.publish(self._api, name, template)
        if ready:
            for name in names:
                await eventually(
                    functools.partial(node_ready, self._core, name),
                    what=f"node {name} Ready",
                    timeout_seconds=timeout_seconds,
                )
        return names

    async def delete_all(self) -> None:
        for name in self.created:
            try:
                await self._core.delete_node(name)
            except ApiException as e:
                if e.status != 404:
                    raise
        self.created.clear()
