"""gpumon with Cluster API's own controllers (cluster-api v1.13.6's core manager, started on the
session's control plane as a self-hosted management cluster), not the pool simulator: the
MachineDeployment, MachineSet, Machine and MachineHealthCheck controllers are Cluster API's; the
kwok infrastructure provider (gpumon.devcluster.capi_infra) only turns KwokMachines into kwok
Nodes. What each test measures is printed (docs/autoscaling.md keeps the figures)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from controller_harness import TEST_LABEL, node_obj
from kubernetes_asyncio import client

from gpumon.devcluster import capi, nodes
from gpumon.devcluster.cluster_api import ClusterApiRunning
from gpumon.devcluster.poolplan import POOL_LABEL
from gpumon.devcluster.waiting import eventually

_PLURALS = {
    **{r.kind: r.plural for r in capi.READY_AT_ONCE},
    "Cluster": capi.CLUSTERS,
    "KwokMachineTemplate": capi.KWOK_MACHINE_TEMPLATES,
    "MachineDeployment": capi.MACHINE_DEPLOYMENTS,
    "MachineHealthCheck": capi.MACHINE_HEALTH_CHECKS,
}


async def create(api: client.ApiClient, namespace: str, obj: dict[str, Any]) -> None:
    if obj["kind"] == "Secret":
        await client.CoreV1Api(api).create_namespaced_secret(namespace, obj)
        return
    group, version = obj["apiVersion"].split("/")
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        group, version, namespace, _PLURALS[obj["kind"]], obj
    )


@dataclass
class CapiPool:
    """A MachineDeployment reconciled by Cluster API's manager, and ways to read what it made."""

    api: client.ApiClient
    namespace: str
    name: str

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    async def replicas(self) -> int:
        scale = await self.custom.get_namespaced_custom_object_scale(
            capi.GROUP, capi.VERSION, self.namespace, capi.MACHINE_DEPLOYMENTS, self.name
        )
        return int(scale["spec"].get("replicas", 0))

    async def set_replicas(self, n: int) -> None:
        await self.custom.patch_namespaced_custom_object_scale(
            capi.GROUP,
            capi.VERSION,
            self.namespace,
            capi.MACHINE_DEPLOYMENTS,
            self.name,
            {"spec": {"replicas": n}},
            _content_type="application/merge-patch+json",
        )

    async def machines(self) -> list[dict[str, Any]]:
        listed = await self.custom.list_namespaced_custom_object(
            capi.GROUP,
            capi.VERSION,
            self.namespace,
            capi.MACHINES,
            label_selector=f"{capi.DEPLOYMENT_NAME_LABEL}={self.name}",
        )
        return sorted(listed["items"], key=lambda m: m["metadata"]["name"])

    async def nodes(self) -> list[dict[str, Any]]:
        """The pool's Nodes that are Ready and offer their GPUs, by name."""
        listed = await client.CoreV1Api(self.api).list_node(
            label_selector=f"{POOL_LABEL}={self.name}", _preload_content=False
        )
        items = json.loads(await listed.read())["items"]
        return sorted(
            (n for n in items if _ready(n) and "nvidia.com/gpu" in n["status"].get("allocatable", {})),
            key=lambda n: n["metadata"]["name"],
        )

    async def node_names(self) -> set[str]:
        return {n["metadata"]["name"] for n in await self.nodes()}

    async def linked(self) -> dict[str, str]:
        """Machine name -> the Node Cluster API linked it to (``status.nodeRef``)."""
        return {
            m["metadata"]["name"]: m["status"]["nodeRef"]["name"]
            for m in await self.machines()
            if (m.get("status") or {}).get("nodeRef")
        }


def _ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions") or ())


PoolFactory = Callable[..., Awaitable[CapiPool]]


@pytest.fixture
async def capi_pool(
    api: client.ApiClient, namespace: str, test_id: str, cluster_api: ClusterApiRunning
) -> AsyncIterator[PoolFactory]:
    """``await capi_pool(replicas=…, suffix=…)``: a pool of 8-GPU kwok nodes labelled with the
    test's id, in a Cluster made for the test's namespace."""
    for obj in capi.management_cluster(namespace, cluster_api.kubeconfig_yaml):
        await create(api, namespace, obj)

    async def make(*, replicas: int, suffix: str = "gpu", **md_spec: Any) -> CapiPool:
        name = f"{test_id}-{suffix}"
        shape = nodes.shape(nodes.NodeTemplate(gpus=8), {TEST_LABEL: test_id, POOL_LABEL: name})
        template, md = capi.machine_pool(name, namespace, shape, replicas=replicas)
        md["spec"].update(md_spec)
        for obj in (template, md):
            await create(api, namespace, obj)
        return CapiPool(api, namespace, name)

    yield make
    # Deleting the Cluster deletes what it owns; its Nodes go with their KwokMachines.
    await client.CustomObjectsApi(api).delete_namespaced_custom_object(
        capi.GROUP, capi.VERSION, namespace, capi.CLUSTERS, capi.DEFAULT_CLUSTER_NAME
    )


async def at_size(pool: CapiPool, count: int) -> set[str] | None:
    """The pool's node names once exactly ``count`` are Ready with GPUs and linked to Machines."""
    names = await pool.node_names()
    linked = set((await pool.linked()).values())
    return names if len(names) == count and names == linked else None


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
        annotations = node["metadata"]["annotations"]
        # What Cluster API writes on the Nodes of its Machines, and gpumon reads.
        assert annotations["cluster.x-k8s.io/machine"] in {
            m["metadata"]["name"] for m in await pool.machines()
        }
        assert annotations["cluster.x-k8s.io/cluster-namespace"] == pool.namespace
        assert annotations["cluster.x-k8s.io/owner-kind"] == "MachineSet"
