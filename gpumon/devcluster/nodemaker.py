"""Create kwok GPU nodes through the API, wait until kwok reports them Ready, and delete them
again; for tests and the demo."""

from __future__ import annotations

import contextlib
import functools

from gpumon.devcluster import nodes, resourceslices
from gpumon.devcluster.waiting import eventually
from gpumon.kube.client import KubeApi, NotFound

NODES = "/api/v1/nodes"


async def node_ready(api: KubeApi, name: str) -> bool | None:
    """True once the node's Ready condition is True, else None (for :func:`eventually`)."""
    node = await api.get(f"{NODES}/{name}")
    conditions = (node.get("status") or {}).get("conditions") or ()
    return True if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions) else None


class NodeMaker:
    """Names nodes ``<prefix>-<n>`` and remembers them, so :meth:`delete_all` removes exactly
    what it made."""

    def __init__(self, api: KubeApi, prefix: str) -> None:
        self._api = api
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
            await self._api.post(NODES, nodes.manifest(name, template))
            self.created.append(name)
            if template.dra:  # its DRA driver's plugin publishes the node's devices
                await resourceslices.publish(self._api, name, template)
        if ready:
            for name in names:
                await eventually(
                    functools.partial(node_ready, self._api, name),
                    what=f"node {name} Ready",
                    timeout_seconds=timeout_seconds,
                )
        return names

    async def delete_all(self) -> None:
        for name in self.created:
            with contextlib.suppress(NotFound):
                await self._api.delete(f"{NODES}/{name}")
        self.created.clear()
