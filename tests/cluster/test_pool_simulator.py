"""A MachineDeployment's /scale subresource is real, and the pool simulator makes its
replica count real: kwok nodes appear after the boot delay, their GPUs after the GPU delay."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from gpumon.devcluster import capi, nodes
from gpumon.devcluster.nodemaker import node_ready
from gpumon.devcluster.poolplan import JOINED_AT_ANNOTATION, POOL_LABEL, Timing
from gpumon.devcluster.poolsim import PoolSimulator, SimulatedPool
from gpumon.devcluster.waiting import eventually
from gpumon.kube.client import KubeClient

TIMING = Timing(boot_delay_seconds=1.0, gpu_delay_seconds=2.0)
TEMPLATE = nodes.NodeTemplate(gpus=4, product="NVIDIA-H100-80GB-HBM3", labels={"pool": "h100"})


@pytest.fixture
async def pool(api: client.ApiClient, namespace: str, test_id: str) -> AsyncIterator[SimulatedPool]:
    custom = client.CustomObjectsApi(api)
    await custom.create_namespaced_custom_object(
        capi.GROUP,
        capi.VERSION,
        namespace,
        capi.MACHINE_DEPLOYMENTS,
        capi.machine_deployment(test_id, namespace, replicas=0),
    )
    yield SimulatedPool(namespace, test_id, TEMPLATE, TIMING)
    core = client.CoreV1Api(api)
    await core.delete_collection_node(label_selector=f"{POOL_LABEL}={test_id}")


async def _scale(custom: client.CustomObjectsApi, pool: SimulatedPool) -> dict[str, Any]:
    result: dict[str, Any] = await custom.get_namespaced_custom_object_scale(
        capi.GROUP, capi.VERSION, pool.namespace, capi.MACHINE_DEPLOYMENTS, pool.name
    )
    return result


async def _patch_scale(custom: client.CustomObjectsApi, pool: SimulatedPool, replicas: int) -> None:
    await custom.patch_namespaced_custom_object_scale(
        capi.GROUP,
        capi.VERSION,
        pool.namespace,
        capi.MACHINE_DEPLOYMENTS,
        pool.name,
        {"spec": {"replicas": replicas}},
        _content_type="application/merge-patch+json",
    )


async def test_scale_subresource_reads_and_patches_spec_replicas(
    api: client.ApiClient, pool: SimulatedPool
) -> None:
    custom = client.CustomObjectsApi(api)
    scale = await _scale(custom, pool)
    assert scale["kind"] == "Scale"
    assert scale["spec"].get("replicas", 0) == 0  # Scale omits a zero (omitempty)
    await _patch_scale(custom, pool, 3)
    assert (await _scale(custom, pool))["spec"]["replicas"] == 3
    md = await custom.get_namespaced_custom_object(
        capi.GROUP, capi.VERSION, pool.namespace, capi.MACHINE_DEPLOYMENTS, pool.name
    )
    assert md["spec"]["replicas"] == 3


async def test_pool_simulator_follows_scale_up_and_down(
    api: client.ApiClient, kube: KubeClient, pool: SimulatedPool
) -> None:
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    seen_without_gpus: list[tuple[float, float]] = []  # (observed at, joined at)

    async def pool_nodes(count: int, *, with_gpus: bool) -> list[client.V1Node] | None:
        listed = (await core.list_node(label_selector=f"{POOL_LABEL}={pool.name}")).items
        now = time.time()
        for n in listed:
            if not nodes.has_gpus_allocatable(n.status.allocatable, TEMPLATE):
                seen_without_gpus.append((now, float(n.metadata.annotations[JOINED_AT_ANNOTATION])))
        ok = [
            n for n in listed if not with_gpus or nodes.has_gpus_allocatable(n.status.allocatable, TEMPLATE)
        ]
        return listed if len(listed) == count and len(ok) == count else None

    async with PoolSimulator(kube, [pool], interval_seconds=0.2).running():
        requested_at = time.time()
        await _patch_scale(custom, pool, 2)
        joined = await eventually(lambda: pool_nodes(2, with_gpus=False), what="2 pool nodes joined")
        for n in joined:
            # Never before the boot delay (the annotation is the simulator's clock, as is ours).
            joined_at = float(n.metadata.annotations[JOINED_AT_ANNOTATION])
            assert joined_at >= requested_at + TIMING.boot_delay_seconds
            assert n.metadata.labels["pool"] == "h100"
            assert n.metadata.annotations["cluster.x-k8s.io/owner-name"] == pool.name
            await eventually(functools.partial(node_ready, kube, n.metadata.name), what="pool node Ready")

        ready = await eventually(lambda: pool_nodes(2, with_gpus=True), what="GPUs allocatable on 2 nodes")
        assert all(n.status.allocatable[nodes.GPU] == "4" for n in ready)
        # Whenever a node was seen without GPUs, its GPU delay had not run out yet.
        assert all(seen < joined_at + TIMING.gpu_delay_seconds + 1.0 for seen, joined_at in seen_without_gpus)

        async def status(replicas: int, available: int) -> dict[str, Any] | None:
            scale = await _scale(custom, pool)
            md = await custom.get_namespaced_custom_object(
                capi.GROUP, capi.VERSION, pool.namespace, capi.MACHINE_DEPLOYMENTS, pool.name
            )
            s = md.get("status") or {}
            done = scale["status"].get("replicas") == replicas and s.get("availableReplicas") == available
            return {"scale": scale, "md": md} if done else None

        seen = await eventually(lambda: status(2, 2), what="MachineDeployment status 2/2 available")
        assert seen["scale"]["status"]["selector"] == f"{capi.DEPLOYMENT_NAME_LABEL}={pool.name}"
        assert seen["md"]["status"]["readyReplicas"] == 2

        # Scale down by one: the node the autoscaler marked is the one that goes.
        marked = ready[1].metadata.name
        await core.patch_node(marked, {"metadata": {"annotations": {capi.DELETE_MACHINE_ANNOTATION: "yes"}}})
        await _patch_scale(custom, pool, 1)
        remaining = await eventually(lambda: pool_nodes(1, with_gpus=True), what="pool scaled down to 1")
        assert remaining[0].metadata.name == ready[0].metadata.name
        await eventually(lambda: status(1, 1), what="MachineDeployment status 1/1 available")
