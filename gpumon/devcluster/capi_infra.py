"""The devcluster's kwok infrastructure provider for Cluster API: the one project-written stand-in
beside Cluster API's own manager (what it does: gpumon.devcluster.capi_infra_plan).

A separate process (``python -m gpumon.devcluster.capi_infra --kubeconfig K --health-port P``),
started and stopped with the manager by gpumon.devcluster.cluster_api. It polls every
``interval`` instead of watching: it is a test stand-in for a cloud, and a quarter of a second is
far inside what any test waits for a machine. ``/healthz`` answers 200 once a round succeeded
and while the last one did."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from pathlib import Path

from aiohttp import web

from gpumon.devcluster import capi, resourceslices
from gpumon.devcluster.capi_infra_plan import MACHINE_NAMESPACE_LABEL, InfraPlan, plan
from gpumon.k8s import dra
from gpumon.kube.client import Conflict, KubeApi, KubeError, NotFound, connected
from gpumon.runtime import logs

log = logging.getLogger(__name__)

_MACHINES = f"/apis/{capi.INFRA_GROUP}/{capi.PROVIDER_VERSION}"


class KwokInfraProvider:
    def __init__(self, api: KubeApi, *, interval_seconds: float = 0.25) -> None:
        self._api = api
        self._interval = interval_seconds
        self.healthy = False

    async def step(self) -> InfraPlan:
        machines = await self._api.get(f"{_MACHINES}/{capi.KWOK_MACHINES}")
        made = await self._api.get("/api/v1/nodes", {"labelSelector": MACHINE_NAMESPACE_LABEL})
        slices = await self._api.get(dra.RESOURCE_SLICES_PATH, {"labelSelector": MACHINE_NAMESPACE_LABEL})
        ready = {
            r: (await self._api.get(f"/apis/{r.api_version}/{r.plural}")).get("items") or []
            for r in capi.READY_AT_ONCE
        }
        p = plan(
            machines.get("items") or [],
            made.get("items") or [],
            ready,
            sliced=[s["spec"]["nodeName"] for s in slices.get("items") or ()],
            now=time.time(),  # wall clock: a Node's creation time is kept in the cluster
        )
        await self._apply(p)
        return p

    async def _apply(self, p: InfraPlan) -> None:
        for body in p.create_nodes:
            try:
                await self._api.post("/api/v1/nodes", body)
                log.info("node created", extra={"node": body["metadata"]["name"]})
            except Conflict:
                pass  # made in a round whose list did not show it yet
        for m in p.provision:
            path = f"{_MACHINES}/namespaces/{m.namespace}/{capi.KWOK_MACHINES}/{m.name}"
            try:
                if m.set_provider_id:
                    await self._api.patch(path, {"spec": {"providerID": m.provider_id}})
                if m.set_provisioned:
                    await self._api.patch(
                        f"{path}/status", {"status": {"initialization": {"provisioned": True}}}
                    )
                    log.info("machine provisioned", extra={"machine": f"{m.namespace}/{m.name}"})
            except NotFound:
                pass  # deleted meanwhile; its Node goes next round
        for name in p.delete_nodes:
            try:
                await self._api.delete(f"/api/v1/nodes/{name}")
                log.info("node of a deleted machine deleted", extra={"node": name})
            except NotFound:
                pass
        for up in p.devices_up:
            with contextlib.suppress(NotFound):  # the Node was deleted meanwhile
                if up.dra is not None:
                    await resourceslices.publish(self._api, up.node, up.dra, labels=up.labels)
                else:
                    patch = {"status": {"capacity": dict(up.resources), "allocatable": dict(up.resources)}}
                    await self._api.patch(f"/api/v1/nodes/{up.node}/status", patch)
                log.info("node's devices registered", extra={"node": up.node})
        for kind, namespace, name in p.make_ready:
            path = f"/apis/{kind.api_version}/namespaces/{namespace}/{kind.plural}/{name}/status"
            with contextlib.suppress(NotFound):
                await self._api.patch(path, {"status": kind.status})

    async def run(self) -> None:
        """Reconcile until cancelled; API errors are logged and the round tried again."""
        while True:
            try:
                await self.step()
                self.healthy = True
            except KubeError as e:
                self.healthy = False
                log.warning("kwok infrastructure provider round failed", extra={"error": str(e)})
            await asyncio.sleep(self._interval)


async def serve(kubeconfig: Path, health_port: int) -> None:
    async with connected(kubeconfig) as api:
        provider = KwokInfraProvider(api)

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(
                status=200 if provider.healthy else 503, text="ok" if provider.healthy else "not yet"
            )

        app = web.Application()
        app.router.add_get("/healthz", healthz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", health_port).start()
        try:
            await provider.run()
        finally:
            await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m gpumon.devcluster.capi_infra", description=__doc__)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--health-port", type=int, required=True)
    args = parser.parse_args()
    logs.configure("text", "info")
    asyncio.run(serve(args.kubeconfig, args.health_port))


if __name__ == "__main__":
    main()
