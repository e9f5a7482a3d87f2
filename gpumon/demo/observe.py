"""Reading the demo cluster into a :class:`~gpumon.demo.views.ClusterView`: nodes, the demo's
pods, the pool's MachineDeployment, the controller's Events (by their source component), its
repair Jobs and every running exporter's snapshot. Raw JSON throughout: the client's model classes cost more
than the cluster is big."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from gpumon.controller.act.events import COMPONENT
from gpumon.controller.core.contract import LABEL_REPAIR_STEP
from gpumon.demo import fleet
from gpumon.demo.exporters import ExporterFleet
from gpumon.demo.views import ClusterView, cluster_view
from gpumon.devcluster import capi
from gpumon.kube.client import KubeApi, NotFound


class Observer:
    def __init__(self, api: KubeApi, exporters: ExporterFleet, session: aiohttp.ClientSession) -> None:
        self._api = api
        self._exporters = exporters
        self._session = session

    async def _pool(self) -> dict[str, Any] | None:
        try:
            return await self._api.get(capi.machine_deployments_path(fleet.NAMESPACE, fleet.POOL))
        except NotFound:
            return None

    async def view(self) -> ClusterView:
        """One consistent-enough picture (the reads run side by side)."""
        node_list, pod_list, pool, event_list, job_list, snapshots = await asyncio.gather(
            self._api.get("/api/v1/nodes"),
            self._api.get(f"/api/v1/namespaces/{fleet.NAMESPACE}/pods"),
            self._pool(),
            self._api.get("/api/v1/events", {"fieldSelector": f"source={COMPONENT}"}),
            self._api.get(
                f"/apis/batch/v1/namespaces/{fleet.CONTROLLER_NAMESPACE}/jobs",
                {"labelSelector": LABEL_REPAIR_STEP},
            ),
            self._exporters.snapshots(self._session),
        )
        return cluster_view(
            time.time(),
            node_objs=node_list["items"],
            pod_objs=pod_list["items"],
            pool_obj=pool,
            event_objs=event_list["items"],
            snapshots=snapshots,
            job_objs=job_list["items"],
        )
