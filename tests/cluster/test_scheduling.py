"""The scheduler, the controllers and the Eviction API behave as in a real cluster: GPU
requests are placed by capacity, a NoSchedule taint keeps pods off, a PDB blocks evictions."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpumon.devcluster import nodes, workloads
from gpumon.devcluster.nodemaker import NodeMaker
from gpumon.devcluster.waiting import eventually

TEST_LABEL = "test.gpumon.io/id"


def own_nodes(test_id: str, gpus: int) -> nodes.NodeTemplate:
    return nodes.NodeTemplate(gpus=gpus, labels={TEST_LABEL: test_id})


def gpu_deployment(name: str, replicas: int, test_id: str, gpus: int = 1) -> dict[str, Any]:
    # Only this test's nodes (see own_nodes).
    return workloads.gpu_deployment(
        name, replicas=replicas, limits={nodes.GPU: str(gpus)}, node_selector={TEST_LABEL: test_id}
    )


async def _pods(core: client.CoreV1Api, namespace: str, app: str) -> list[client.V1Pod]:
    return list((await core.list_namespaced_pod(namespace, label_selector=f"app={app}")).items)


async def _running(core: client.CoreV1Api, namespace: str, app: str, count: int) -> list[client.V1Pod] | None:
    pods = [
        p
        for p in await _pods(core, namespace, app)
        if p.status.phase == "Running" and p.metadata.deletion_timestamp is None
    ]
    return pods if len(pods) == count else None


async def test_gpu_pods_land_one_per_single_gpu_node_and_run(
    api: client.ApiClient, namespace: str, make_nodes: NodeMaker, test_id: str
) -> None:
    node_names = await make_nodes(3, own_nodes(test_id, 1))
    await client.AppsV1Api(api).create_namespaced_deployment(namespace, gpu_deployment("train", 3, test_id))
    core = client.CoreV1Api(api)

    pods = await eventually(lambda: _running(core, namespace, "train", 3), what="3 GPU pods Running")
    # One GPU per node: the scheduler had to spread them, which proves it counted nvidia.com/gpu.
    assert sorted(p.spec.node_name for p in pods) == sorted(node_names)
    assert all(p.status.container_statuses[0].ready for p in pods)


async def test_noschedule_taint_keeps_new_pods_off_the_node(
    api: client.ApiClient, namespace: str, make_nodes: NodeMaker, test_id: str
) -> None:
    bad, good = await make_nodes(2, own_nodes(test_id, 2))
    core = client.CoreV1Api(api)
    taint = {"key": "gpumon.io/gpu-unhealthy", "value": "true", "effect": "NoSchedule"}
    await core.patch_node(bad, {"spec": {"taints": [taint]}})
    await client.AppsV1Api(api).create_namespaced_deployment(namespace, gpu_deployment("infer", 4, test_id))

    running = await eventually(lambda: _running(core, namespace, "infer", 2), what="2 pods Running")
    assert {p.spec.node_name for p in running} == {good}

    async def two_unschedulable() -> list[client.V1Pod] | None:
        pending = [
            p
            for p in await _pods(core, namespace, "infer")
            if p.status.phase == "Pending"
            and any(
                c.type == "PodScheduled" and c.reason == "Unschedulable" for c in p.status.conditions or []
            )
        ]
        return pending if len(pending) == 2 else None

    pending = await eventually(two_unschedulable, what="2 pods Unschedulable")
    assert all(p.spec.node_name is None for p in pending)
    messages = " ".join(c.message for p in pending for c in p.status.conditions if c.type == "PodScheduled")
    assert "1 node(s) had untolerated taint" in messages


async def test_eviction_blocked_by_pdb_returns_429_and_passes_once_allowed(
    api: client.ApiClient, namespace: str, make_nodes: NodeMaker, test_id: str
) -> None:
    await make_nodes(2, own_nodes(test_id, 1))
    core = client.CoreV1Api(api)
    policy = client.PolicyV1Api(api)
    await client.AppsV1Api(api).create_namespaced_deployment(namespace, gpu_deployment("serve", 2, test_id))
    pods = await eventually(lambda: _running(core, namespace, "serve", 2), what="2 pods Running")
    await policy.create_namespaced_pod_disruption_budget(
        namespace,
        {
            "metadata": {"name": "serve"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "serve"}}},
        },
    )

    async def pdb_observed() -> client.V1PodDisruptionBudget | None:
        pdb = await policy.read_namespaced_pod_disruption_budget("serve", namespace)
        s = pdb.status
        observed = s is not None and s.observed_generation == pdb.metadata.generation
        return pdb if observed and s.current_healthy == 2 else None

    await eventually(pdb_observed, what="PDB status computed by the disruption controller")
    victim = pods[0].metadata.name
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": victim, "namespace": namespace},
    }

    with pytest.raises(ApiException) as blocked:
        await core.create_namespaced_pod_eviction(victim, namespace, eviction)
    assert blocked.value.status == 429
    assert "disruption budget" in str(blocked.value.body)

    await policy.patch_namespaced_pod_disruption_budget("serve", namespace, {"spec": {"minAvailable": 1}})

    async def evicted() -> bool | None:
        try:
            await core.create_namespaced_pod_eviction(victim, namespace, eviction)
        except ApiException as e:
            if e.status == 429:  # until the controller has observed the relaxed budget
                return None
            raise
        return True

    await eventually(evicted, what="eviction allowed by the relaxed PDB")
    # The ReplicaSet replaces the evicted pod.
    replaced = await eventually(lambda: _running(core, namespace, "serve", 2), what="replacement Running")
    assert victim not in {p.metadata.name for p in replaced}
