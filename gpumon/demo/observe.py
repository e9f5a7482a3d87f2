"""Reading the demo cluster into a :class:`~gpumon.demo.views.ClusterView`: nodes, the demo's
pods, the pool's MachineDeployment, the controller's Events (by their source component) and
every running exporter's snapshot. Raw JSON throughout: the client's model classes cost more
than the cluster is big."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpumon.controller.act.events import COMPONENT
from gpumon.demo import fleet
from gpumon.demo.exporters import ExporterFleet
from gpumon.demo.views import ClusterView, cluster_view
from gpumon.devcluster import capi


async def _raw(call: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
    resp = await call(*args, _preload_content=False, **kwargs)
    try:
        return json.loads(await resp.read())
    finally:
        resp.release()


class Observer:
    def __init__(
        self, api: client.ApiClient, exporters: ExporterFleet, session: aiohttp.ClientSession
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._exporters = exporters
        self._session = session

    async def _pool(self) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._custom.get_namespaced_custom_object(
                capi.GROUP, capi.VERSION, fleet.NAMESPACE, capi.MACHINE_DEPLOYMENTS, fleet.POOL
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return result

    async def view(self) -> ClusterView:
        """One consistent-enough picture (the reads run side by side)."""
        node_list, pod_list, pool, event_list, snapshots = await asyncio.gather(
            _raw(self._core.list_node),
            _raw(self._core.list_namespaced_pod, fleet.NAMESPACE),
            self._pool(),
            _raw(self._core.list_event_for_all_namespaces, field_selector=f"source={COMPONENT}"),
            self._exporters.snapshots(self._session),
        )
        return cluster_view(
            time.time(),
            node_objs=node_list["items"],
            pod_objs=pod_list["items"],
            pool_obj=pool,
            event_objs=event_list["items"],
            snapshots=snapshots,
        )
