"""gpumon with Cluster API's own controllers (cluster-api v1.13.6's core manager, started on the
session's control plane as a self-hosted management cluster), not the pool simulator: the
MachineDeployment, MachineSet, Machine and MachineHealthCheck controllers are Cluster API's; the
kwok infrastructure provider (gpumon.devcluster.capi_infra) only turns KwokMachines into kwok
Nodes. What each test measures is printed (docs/autoscaling.md keeps the figures)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from capi_pools import CapiPool, PoolFactory, at_size, create
from controller_harness import (  # noqa: F401 - fixtures
    TEST_LABEL,
    KubeconfigFactory,
    controller_config,
    exporters,
    gpu_condition,
    node_obj,
    running,
    sa_kubeconfig_for_fixture,
    wait_for_event,
)
from kubernetes_asyncio import client

from gpumon.controller.core.node_owner import node_owner
from gpumon.devcluster import capi, nodes
from gpumon.devcluster.nodes import POOL_LABEL
from gpumon.devcluster.waiting import eventually


@pytest.fixture
async def kubeconfig(sa_kubeconfig_for: KubeconfigFactory) -> Path:
    """The shipped ServiceAccount and its RBAC, autoscaling rules included."""
    return await sa_kubeconfig_for(autoscaling=True)


def gpu_pod(name: str, test_id: str, **over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": {TEST_LABEL: test_id},
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "cuda", "image": "cuda:12", "resources": {"limits": {nodes.GPU: "8"}}}],
    }
    spec.update(over)
    return {"metadata": {"name": name, "labels": {"app": "train"}}, "spec": spec}


async def test_a_new_machine_becomes_a_node_with_gpus(api: client.ApiClient, capi_pool: PoolFactory) -> None:
    """MachineDeployment -> MachineSet -> Machine -> KwokMachine -> Node, each step Cluster API's
    but the last. No bootstrap provider: the Machines name a bootstrap data Secret that does not
    even exist, and Cluster API reads none."""
    t0 = time.monotonic()
    pool = await capi_pool(replicas=2)
    names = await eventually(lambda: at_size(pool, 2), what="2 Machines with Nodes", timeout_seconds=120)
    print(f"MachineDeployment created -> 2 linked Nodes with GPUs: {time.monotonic() - t0:.1f}s")
    for m in await pool.machines():
        assert m["spec"]["providerID"] == f"kwok://{pool.namespace}/{m['metadata']['name']}"
        assert m["status"]["phase"] == "Running"
        assert "configRef" not in m["spec"]["bootstrap"]
    for name in names:
        node = await node_obj(client.CoreV1Api(api), name)
        # What a repair's replacement step deletes: the Machine that owns the Node.
        owner = node_owner(node)
        assert owner is not None and (owner.machinery, owner.kind) == ("cluster-api", "Machine")
        group, version = owner.api_version.split("/")
        machine = await pool.custom.get_namespaced_custom_object(
            group, version, str(owner.namespace), capi.MACHINES, owner.name
        )
        assert machine["status"]["nodeRef"]["name"] == name
        annotations = node["metadata"]["annotations"]
        # What Cluster API writes on the Nodes of its Machines, and gpumon reads.
        assert annotations["cluster.x-k8s.io/machine"] in {
            m["metadata"]["name"] for m in await pool.machines()
        }
        assert annotations["cluster.x-k8s.io/cluster-namespace"] == pool.namespace
        assert annotations["cluster.x-k8s.io/owner-kind"] == "MachineSet"


def pool_config(pool: CapiPool, test_id: str, **over: Any) -> dict[str, Any]:
    return {
        "name": pool.name,
        "target": {"namespace": pool.namespace, "name": pool.name},
        "node_selector": f"{POOL_LABEL}={pool.name}",
        "template": {"resources": {nodes.GPU: 8}, "labels": {TEST_LABEL: test_id}},
        "max_replicas": 3,
        **over,
    }


async def phase(core: client.CoreV1Api, namespace: str, name: str, want: str) -> bool | None:
    pod = await core.read_namespaced_pod(name, namespace)
    return True if pod.status.phase == want else None


async def test_gpumon_scales_a_machine_deployment_up_and_cluster_api_removes_the_machine_it_marked(
    api: client.ApiClient, namespace: str, test_id: str, capi_pool: PoolFactory, kubeconfig: Path
) -> None:
    """Up: a pending 8-GPU pod makes gpumon raise ``/scale`` 1 -> 2 and Cluster API's controllers
    make the Machine and, through the provider, its Node. Down: the first node goes idle; gpumon
    marks its Machine ``cluster.x-k8s.io/delete-machine`` and lowers replicas, and Cluster API's
    MachineSet deletes that Machine although its own order (``Newest``) would pick the other."""
    core = client.CoreV1Api(api)
    pool = await capi_pool(replicas=1, deletion={"order": "Newest"})
    (first,) = await eventually(lambda: at_size(pool, 1), what="the first node", timeout_seconds=60)
    await core.create_namespaced_pod(namespace, gpu_pod("on-first", test_id, nodeName=first))
    await eventually(lambda: phase(core, namespace, "on-first", "Running"), what="the first node busy")
    cfg = controller_config(
        kubeconfig=kubeconfig,
        namespace=namespace,
        test_id=test_id,
        endpoints={},
        pools=[
            pool_config(
                pool, test_id, min_replicas=1, scale_down_unneeded_seconds=2, scale_down_cooldown_seconds=0
            )
        ],
    )
    async with running(cfg):
        await core.create_namespaced_pod(namespace, gpu_pod("pending", test_id))

        async def raised() -> float | None:
            return time.monotonic() if await pool.replicas() == 2 else None

        requested_at = await eventually(raised, what="replicas raised to 2", interval_seconds=0.05)
        both = await eventually(lambda: at_size(pool, 2), what="a second Machine's Node", timeout_seconds=60)
        joined = time.monotonic() - requested_at
        await eventually(lambda: phase(core, namespace, "pending", "Running"), what="the pending pod Running")
        print(f"/scale raised -> new Machine's Node Ready with allocatable GPUs and linked: {joined:.1f}s")
        (second,) = both - {first}

        await core.delete_namespaced_pod("on-first", namespace, grace_period_seconds=0)
        left = await eventually(lambda: at_size(pool, 1), what="one node left", timeout_seconds=90)
        assert left == {second}, f"Cluster API removed {second}, not the node gpumon marked ({first})"
        assert await pool.replicas() == 1
        event = await wait_for_event(core, namespace, pool.name, "GpuPoolScaledDown")
        assert first in event.message and "2 -> 1" in event.message
        assert [m["status"]["nodeRef"]["name"] for m in await pool.machines()] == [second]


async def test_a_deleted_machine_is_replaced_by_its_machine_set_and_the_pool_keeps_its_size(
    api: client.ApiClient, namespace: str, test_id: str, capi_pool: PoolFactory, kubeconfig: Path
) -> None:
    """The replacement step of a repair (delete the Machine): Cluster API drains and deletes its
    Node and the MachineSet makes a new Machine; gpumon's autoscaler, watching the pool, neither
    scales it up for the missing node nor down."""
    pool = await capi_pool(replicas=2)
    before = await eventually(lambda: at_size(pool, 2), what="2 nodes", timeout_seconds=60)
    linked = await pool.linked()
    victim_machine, victim_node = sorted(linked.items())[0]
    cfg = controller_config(
        kubeconfig=kubeconfig,
        namespace=namespace,
        test_id=test_id,
        endpoints={},
        pools=[pool_config(pool, test_id, min_replicas=2, max_replicas=4)],
    )
    async with running(cfg):
        deleted_at = time.monotonic()
        await pool.custom.delete_namespaced_custom_object(
            capi.GROUP, capi.VERSION, pool.namespace, capi.MACHINES, victim_machine
        )
        seen: list[int] = []

        async def replaced() -> set[str] | None:
            seen.append(await pool.replicas())
            names = await at_size(pool, 2)
            return names if names and victim_node not in names else None

        after = await eventually(replaced, what="a replacement node", timeout_seconds=90)
        took = time.monotonic() - deleted_at
        print(f"Machine deleted -> replacement Node Ready with GPUs and linked: {took:.1f}s")
        assert len(after - before) == 1 and victim_machine not in {
            m["metadata"]["name"] for m in await pool.machines()
        }
        assert set(seen) == {2}, f"the pool's replicas moved during the swap: {seen}"


async def test_a_machine_health_check_replaces_the_machine_gpumon_marks_gpu_unhealthy(
    api: client.ApiClient, namespace: str, test_id: str, capi_pool: PoolFactory, kubeconfig: Path
) -> None:
    """gpumon's ``GpuUnhealthy=True`` node condition (an Xid 79 on one GPU) is what a
    MachineHealthCheck watches: Cluster API marks the Machine unhealthy, its MachineSet deletes it
    (draining the Node) and makes a new one."""
    core = client.CoreV1Api(api)
    pool = await capi_pool(replicas=2)
    names = sorted(await eventually(lambda: at_size(pool, 2), what="2 nodes", timeout_seconds=60))
    mhc = capi.machine_health_check(
        pool.name, namespace, deployment=pool.name, conditions=[("GpuUnhealthy", "True", 1)]
    )
    created_at = time.monotonic()
    await create(api, namespace, mhc)

    async def watching() -> float | None:
        status = (await mhc_object(pool)).get("status") or {}
        return time.monotonic() if status.get("expectedMachines") == 2 else None

    judged_at = await eventually(
        watching, what="the MachineHealthCheck judging both Machines", timeout_seconds=90
    )
    print(f"MachineHealthCheck created -> first judgement of its Machines: {judged_at - created_at:.1f}s")
    bad = names[0]
    machine = {node: m for m, node in (await pool.linked()).items()}[bad]
    async with exporters(names, gpus=8) as ex:
        cfg = controller_config(
            kubeconfig=kubeconfig,
            namespace=namespace,
            test_id=test_id,
            endpoints={n: e.url for n, e in ex.items()},
        )
        async with running(cfg):
            ex[bad].fault(gpu=0, fault="xid", code=79)

            async def condition_set() -> float | None:
                cond = gpu_condition(await node_obj(core, bad))
                return time.monotonic() if cond and cond["status"] == "True" else None

            marked_at = await eventually(condition_set, what="GpuUnhealthy=True on the bad node")

            async def machine_deleting() -> float | None:
                machines = {m["metadata"]["name"]: m for m in await pool.machines()}
                m = machines.get(machine)
                return time.monotonic() if m is None or m["metadata"].get("deletionTimestamp") else None

            async def machine_gone() -> float | None:
                machines = {m["metadata"]["name"] for m in await pool.machines()}
                return time.monotonic() if machine not in machines else None

            deleting_at = await eventually(
                machine_deleting, what="the unhealthy Machine deleting", timeout_seconds=90
            )
            gone_at = await eventually(machine_gone, what="the unhealthy Machine deleted", timeout_seconds=90)
            after = await eventually(
                lambda: at_size(pool, 2), what="a replacement Machine's Node", timeout_seconds=90
            )
            done_at = time.monotonic()
    assert bad not in after
    print(
        f"GpuUnhealthy=True -> Machine deleting: {deleting_at - marked_at:.1f}s, gone (Node drained and "
        f"deleted): {gone_at - marked_at:.1f}s; "
        f"-> replacement Node Ready with GPUs: {done_at - marked_at:.1f}s"
    )
    assert (await mhc_object(pool))["status"]["expectedMachines"] == 2


async def mhc_object(pool: CapiPool) -> dict[str, Any]:
    found: dict[str, Any] = await pool.custom.get_namespaced_custom_object(
        capi.GROUP, capi.VERSION, pool.namespace, capi.MACHINE_HEALTH_CHECKS, pool.name
    )
    return found
