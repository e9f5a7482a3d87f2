"""The pool simulator's loop: reads each simulated MachineDeployment and its Nodes, asks
:func:`gpumon.devcluster.poolplan.plan` what to do, and does it through the API.

It polls (every ``interval_seconds``, sooner when a boot or a GPU delay ends) instead of
watching: it is a test stand-in for a cloud provider, and a scale request is noticed within
half a second, well inside what any autoscaling test waits for."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpumon.devcluster import capi, nodes, resourceslices
from gpumon.devcluster.poolplan import (
    BOOTING_ANNOTATION,
    JOINED_AT_ANNOTATION,
    POOL_LABEL,
    Plan,
    SimulatedNode,
    Timing,
    decode_boots,
    encode_boots,
    plan,
)
from gpumon.k8s import dra
from gpumon.kube.client import Conflict, KubeApi, KubeError, NotFound
from gpumon.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)
NODES = "/api/v1/nodes"


@dataclass(frozen=True)
class SimulatedPool:
    namespace: str
    name: str  # the MachineDeployment; also its Nodes' POOL_LABEL value, so unique per cluster
    template: nodes.NodeTemplate
    timing: Timing = field(default_factory=Timing)


def _machine_deployment(pool: SimulatedPool) -> str:
    return capi.machine_deployments_path(pool.namespace, pool.name)


def _pool_node(node: Mapping[str, Any], template: nodes.NodeTemplate, sliced: set[str]) -> SimulatedNode:
    meta = node["metadata"]
    annotations = meta.get("annotations") or {}
    try:
        joined_at = float(annotations[JOINED_AT_ANNOTATION])
    except (KeyError, ValueError):
        joined_at = datetime.fromisoformat(meta["creationTimestamp"].replace("Z", "+00:00")).timestamp()
    return SimulatedNode(
        name=meta["name"],
        joined_at=joined_at,
        gpus_allocatable=(
            meta["name"] in sliced
            if template.dra
            else nodes.has_gpus_allocatable((node.get("status") or {}).get("allocatable"), template)
        ),
        marked_for_deletion=capi.DELETE_MACHINE_ANNOTATION in annotations,
    )


class PoolSimulator:
    def __init__(
        self,
        api: KubeApi,
        pools: Sequence[SimulatedPool],
        *,
        clock: Callable[[], float] = time.time,
        interval_seconds: float = 0.5,
    ) -> None:
        # Wall-clock time: boot and join times are kept in the cluster and outlive this process.
        self._api = api
        self._pools = tuple(pools)
        self._clock = clock
        self._interval = interval_seconds

    async def step(self, pool: SimulatedPool) -> float | None:
        """One reconcile of one pool; returns seconds until its next timed event."""
        try:
            md = await self._api.get(_machine_deployment(pool))
        except NotFound:
            return None
        selector = {"labelSelector": f"{POOL_LABEL}={pool.name}"}
        listed = (await self._api.get(NODES, selector)).get("items") or ()
        # A DRA node's GPUs are up once its driver published its slice (labelled like the node).
        sliced = (
            {
                s["spec"]["nodeName"]
                for s in (await self._api.get(dra.RESOURCE_SLICES_PATH, selector))["items"]
            }
            if pool.template.dra
            else set()
        )
        annotations = md["metadata"].get("annotations") or {}
        now = self._clock()
        desired = int(md["spec"].get("replicas", 1))  # Cluster API's default
        p = plan(
            pool.name,
            desired,
            [_pool_node(n, pool.template, sliced) for n in listed],
            decode_boots(annotations.get(BOOTING_ANNOTATION)),
            pool.timing,
            now,
        )
        await self._apply(pool, md, desired, p, now)
        return p.wake_in

    async def _apply(
        self, pool: SimulatedPool, md: dict[str, Any], desired: int, p: Plan, now: float
    ) -> None:
        for name in p.join:
            body = nodes.manifest(
                name,
                pool.template,
                gpus_allocatable=p.join_with_gpus,
                annotations={
                    JOINED_AT_ANNOTATION: repr(now),
                    # What Cluster API puts on the Nodes of its Machines.
                    "cluster.x-k8s.io/cluster-name": md["spec"]["clusterName"],
                    "cluster.x-k8s.io/cluster-namespace": pool.namespace,
                    "cluster.x-k8s.io/machine": name,
                    "cluster.x-k8s.io/owner-kind": "MachineDeployment",
                    "cluster.x-k8s.io/owner-name": pool.name,
                },
                extra_labels={POOL_LABEL: pool.name},
            )
            try:
                await self._api.post(NODES, body)
                log.info("pool node joined", extra={"pool": pool.name, "node": name})
            except Conflict:
                pass
            if p.join_with_gpus and pool.template.dra:
                await self._publish(pool, name)
        for name in p.delete:
            try:
                await self._api.delete(f"{NODES}/{name}")
                log.info("pool node deleted", extra={"pool": pool.name, "node": name})
            except NotFound:
                pass
        for name in p.enable_gpus:
            if pool.template.dra:
                await self._publish(pool, name)
                continue
            with contextlib.suppress(NotFound):
                await self._api.patch(f"{NODES}/{name}/status", nodes.gpus_allocatable_patch(pool.template))
        booting = encode_boots(p.boots)
        if (md["metadata"].get("annotations") or {}).get(BOOTING_ANNOTATION) != booting:
            await self._api.patch(
                _machine_deployment(pool), {"metadata": {"annotations": {BOOTING_ANNOTATION: booting}}}
            )
        status = capi.status(
            p.status,
            desired=desired,
            generation=int(md["metadata"].get("generation", 1)),
            selector=capi.selector_string(md["spec"]["selector"].get("matchLabels") or {}),
        )
        current = md.get("status") or {}
        if any(current.get(k) != v for k, v in status.items()):
            await self._api.patch(_machine_deployment(pool) + "/status", {"status": status})

    async def _publish(self, pool: SimulatedPool, node: str) -> None:
        """The node's DRA driver registers: its slice appears (and goes with the node)."""
        with contextlib.suppress(NotFound):  # the node was deleted meanwhile
            await resourceslices.publish(self._api, node, pool.template, labels={POOL_LABEL: pool.name})

    async def run(self) -> None:
        """Reconcile every pool until cancelled; API errors are logged and retried."""
        while True:
            waits: list[float] = [self._interval]
            for pool in self._pools:
                try:
                    wake = await self.step(pool)
                except KubeError as e:
                    log.warning("pool simulator step failed", extra={"pool": pool.name, "error": str(e)})
                    continue
                if wake is not None:
                    waits.append(wake)
            await asyncio.sleep(max(0.05, min(waits)))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[PoolSimulator]:
        task = asyncio.create_task(self.run(), name="pool-simulator")
        try:
            yield self
        finally:
            await cancel_and_wait([task])
