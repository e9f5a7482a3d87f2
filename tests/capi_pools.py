"""Node pools on Cluster API's own controllers, for every tier that scales pools: a
MachineDeployment reconciled by cluster-api v1.13.6's core manager (MachineDeployment ->
MachineSet -> Machine), whose Machines the devcluster's kwok infrastructure provider
(gpumon.devcluster.capi_infra) turns into kwok Nodes of the pool's template, in a Cluster made
for the test's namespace (a self-hosted management cluster: gpumon.devcluster.cluster_api).

Cluster API names each Node after its Machine's KwokMachine (the MachineDeployment's name and
random suffixes): tests find a pool's Nodes by its label and never predict their names.
Its fixture ``capi_pool`` is registered for the whole suite (tests/conftest.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes_asyncio import client

from gpumon.devcluster import capi, nodes
from gpumon.devcluster.cluster_api import ClusterApiRunning
from gpumon.devcluster.nodes import POOL_LABEL

TEST_LABEL = "test.gpumon.io/id"  # as tests/cluster/controller_harness.py: the test's own nodes


async def create(api: client.ApiClient, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    """Create a Cluster API object (or a Secret) as the API server answers it."""
    if obj["kind"] == "Secret":
        await client.CoreV1Api(api).create_namespaced_secret(namespace, obj)
        return obj
    group, version = obj["apiVersion"].split("/")
    created: dict[str, Any] = await client.CustomObjectsApi(api).create_namespaced_custom_object(
        group, version, namespace, capi.PLURALS[obj["kind"]], obj
    )
    return created


def _ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or ()
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@dataclass
class CapiPool:
    """A MachineDeployment reconciled by Cluster API's manager, and ways to read what it made."""

    api: client.ApiClient
    namespace: str
    name: str
    template: nodes.NodeTemplate  # what each of its Nodes is
    created: dict[str, Any]  # the MachineDeployment as the API server answered its creation

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    async def md(self) -> dict[str, Any]:
        found: dict[str, Any] = await self.custom.get_namespaced_custom_object(
            capi.GROUP, capi.VERSION, self.namespace, capi.MACHINE_DEPLOYMENTS, self.name
        )
        return found

    async def replicas(self) -> int:
        scale = await self.custom.get_namespaced_custom_object_scale(
            capi.GROUP, capi.VERSION, self.namespace, capi.MACHINE_DEPLOYMENTS, self.name
        )
        return int(scale["spec"].get("replicas", 0))  # a Scale omits 0

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

    async def all_nodes(self) -> list[dict[str, Any]]:
        """Every Node of the pool, whatever its state, by name."""
        listed = await client.CoreV1Api(self.api).list_node(
            label_selector=f"{POOL_LABEL}={self.name}", _preload_content=False
        )
        items: list[dict[str, Any]] = json.loads(await listed.read())["items"]
        return sorted(items, key=lambda n: n["metadata"]["name"])

    async def nodes(self) -> list[dict[str, Any]]:
        """The pool's Nodes that are Ready and offer their device plugin's resources, by name
        (a DRA template's devices are in ResourceSlices instead, not looked at here)."""
        return [
            n
            for n in await self.all_nodes()
            if _ready(n) and nodes.has_gpus_allocatable(n["status"].get("allocatable"), self.template)
        ]

    async def node_names(self) -> set[str]:
        return {n["metadata"]["name"] for n in await self.nodes()}

    async def linked(self) -> dict[str, str]:
        """Machine name -> the Node Cluster API linked it to (``status.nodeRef``)."""
        return {
            m["metadata"]["name"]: m["status"]["nodeRef"]["name"]
            for m in await self.machines()
            if (m.get("status") or {}).get("nodeRef")
        }


PoolFactory = Callable[..., Awaitable[CapiPool]]


@pytest.fixture
async def capi_pool(
    api: client.ApiClient, namespace: str, test_id: str, cluster_api: ClusterApiRunning
) -> AsyncIterator[PoolFactory]:
    """``await capi_pool(replicas=…, suffix=…, template=…, annotations=…,
    devices_after_seconds=…, **machine_deployment_spec)``: a pool of kwok nodes of
    ``template`` (8 whole GPUs by default) labelled with the test's id and the pool's name, in a
    Cluster made for the test's namespace on the first call. ``devices_after_seconds``: each
    Node's GPUs register that long after it joined, as a device plugin's do."""
    made: list[str] = []

    async def make(
        *,
        replicas: int,
        suffix: str = "gpu",
        template: nodes.NodeTemplate | None = None,
        annotations: Mapping[str, str] | None = None,
        devices_after_seconds: float = 0.0,
        **md_spec: Any,
    ) -> CapiPool:
        if not made:
            for obj in capi.management_cluster(namespace, cluster_api.kubeconfig_yaml):
                await create(api, namespace, obj)
        name = f"{test_id}-{suffix}"
        tpl = template or nodes.NodeTemplate(gpus=8)
        shape = nodes.shape(tpl, {TEST_LABEL: test_id, POOL_LABEL: name})
        machine_template, md = capi.machine_pool(
            name,
            namespace,
            shape,
            replicas=replicas,
            annotations=annotations,
            devices_after_seconds=devices_after_seconds,
        )
        md["spec"].update(md_spec)
        await create(api, namespace, machine_template)
        created = await create(api, namespace, md)
        made.append(name)
        return CapiPool(api, namespace, name, tpl, created)

    yield make
    if made:
        # Deleting the Cluster deletes what it owns; its Nodes go with their KwokMachines.
        await client.CustomObjectsApi(api).delete_namespaced_custom_object(
            capi.GROUP, capi.VERSION, namespace, capi.CLUSTERS, capi.DEFAULT_CLUSTER_NAME
        )


async def at_size(pool: CapiPool, count: int) -> set[str] | None:
    """The pool's node names once exactly ``count`` are Ready with their GPUs and linked to
    Machines."""
    names = await pool.node_names()
    linked = set((await pool.linked()).values())
    return names if len(names) == count and names == linked else None
