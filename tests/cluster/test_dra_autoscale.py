"""DRA demand on the real control plane: pods asking for GPUs through ResourceClaimTemplates stay
pending (no node publishes devices yet), the controller scales a Cluster API pool whose template
declares the devices a new node publishes, Cluster API's own controllers make the Machines and
the kwok infrastructure provider their Nodes, which publish the devices in their ResourceSlices
once their driver registers (gpumon.devcluster.resourceslices, NVIDIA's names), and the real
kube-scheduler allocates the claims and binds the pods. A selector the planner cannot evaluate is
reported and scales nothing."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (  # noqa: F401 - fixtures
    TEST_LABEL,
    Running,
    sa_kubeconfig_for_fixture,
    wait_for_event,
)
from kubernetes_asyncio import client
from test_autoscale_pools import (  # noqa: F401 - fixtures
    Pool,
    PoolFactory,
    all_unschedulable,
    autoscaling,
    kubeconfig,
    make_pool,
    pool_config,
    pool_nodes,
    rounds,
)

from gpumon.devcluster import nodes, resourceslices, workloads
from gpumon.devcluster.waiting import eventually


async def _claimed(api: client.ApiClient, namespace: str, app: str, count: int) -> list[Any] | None:
    """The app's pods once ``count`` are bound and each pod's claim is allocated."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    pods = (await core.list_namespaced_pod(namespace, label_selector=f"{workloads.APP_LABEL}={app}")).items
    claims = {c.metadata.name: c for c in (await resource.list_namespaced_resource_claim(namespace)).items}
    done = [
        p
        for p in pods
        if p.spec.node_name
        and all(
            (c := claims.get(s.resource_claim_name)) is not None and c.status and c.status.allocation
            for s in (p.status.resource_claim_statuses or [])
        )
        and p.status.resource_claim_statuses
    ]
    return done if len(done) == count else None


@dataclass
class PendingDra:
    """A pool of DRA nodes (none yet) and an app whose pods claim its devices, all pending."""

    api: client.ApiClient
    namespace: str
    pool: Pool
    app: str

    async def scaled_to(self, replicas: int, pods: int) -> None:
        """The pool asks exactly ``replicas`` nodes, and every pod gets a claim there."""

        async def requested() -> int | None:
            return (await self.pool.replicas()) or None

        assert await eventually(requested, what="a scale request") == replicas
        bound = await eventually(
            lambda: _claimed(self.api, self.namespace, self.app, pods),
            what=f"{pods} pods bound, claims allocated",
            timeout_seconds=120,
        )
        assert len({p.spec.node_name for p in bound}) == replicas
        assert await self.pool.replicas() == replicas  # never more than needed while they were bound


Autoscaled = Callable[..., AbstractAsyncContextManager[tuple[PendingDra, Running]]]


@pytest.fixture
def pending_dra(
    api: client.ApiClient,
    namespace: str,
    test_id: str,
    make_pool: PoolFactory,  # noqa: F811 - the fixture
    kubeconfig: Path,  # noqa: F811 - the fixture
) -> Autoscaled:
    """Pending pods of ``app`` claiming devices (``claim``: workloads.claim_template's), a pool
    of ``template`` nodes whose config declares the devices such a node publishes
    (resourceslices.pool_dra), then the controller autoscaling it."""

    @contextlib.asynccontextmanager
    async def run(
        app: str, replicas: int, template: nodes.NodeTemplate, **claim: Any
    ) -> AsyncIterator[tuple[PendingDra, Running]]:
        core = client.CoreV1Api(api)
        pool = await make_pool(app, template)
        declared = {"labels": {TEST_LABEL: test_id}, "dra": resourceslices.pool_dra(template)}
        config = pool_config(pool, test_id, template=declared)
        await client.ResourceV1Api(api).create_namespaced_resource_claim_template(
            namespace, workloads.claim_template(app, **claim)
        )
        body = workloads.dra_deployment(
            app, replicas=replicas, claim_template_name=app, node_selector={TEST_LABEL: test_id}
        )
        await client.AppsV1Api(api).create_namespaced_deployment(namespace, body)
        await all_unschedulable(core, namespace, replicas)
        async with autoscaling(kubeconfig, namespace, test_id, [config]) as ctl:
            yield PendingDra(api, namespace, pool, app), ctl

    return run


def nodes_of(gpus: int, test_id: str, **template: Any) -> nodes.NodeTemplate:
    return nodes.NodeTemplate(gpus=gpus, dra=True, labels={TEST_LABEL: test_id}, **template)


async def test_whole_gpu_claims_scale_a_pool_from_zero_to_exactly_the_nodes_they_need(
    pending_dra: Autoscaled, test_id: str
) -> None:
    """Ten pods each claiming one GPU of class gpu.nvidia.com with a CEL selector on the
    capacity the template publishes, on 8-GPU nodes: exactly two nodes, then the scheduler
    allocates every claim there."""
    big = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'
    async with pending_dra(
        "train", 10, nodes_of(8, test_id), device_class="gpu.nvidia.com", selectors=[big]
    ) as (
        dra,
        _,
    ):
        await dra.scaled_to(2, pods=10)


async def test_mig_claims_scale_a_pool_to_exactly_the_nodes_they_need(
    pending_dra: Autoscaled, test_id: str
) -> None:
    """Nodes of two A100s, each split into two 3g.40gb instances (four MIG devices a node):
    seven pods claiming one mig.nvidia.com device of profile 3g.40gb need exactly two nodes."""
    template = nodes_of(2, test_id, mig={"3g.40gb": 2})
    assert len(resourceslices.pool_dra(template)["devices"]) == 4
    profile = 'device.attributes["gpu.nvidia.com"].profile == "3g.40gb"'
    async with pending_dra("mig", 7, template, device_class="mig.nvidia.com", selectors=[profile]) as (
        dra,
        _,
    ):
        await dra.scaled_to(2, pods=7)


async def test_a_selector_the_planner_cannot_evaluate_is_reported_and_scales_nothing(
    pending_dra: Autoscaled, test_id: str, api: client.ApiClient, namespace: str
) -> None:
    """lowerAscii is Kubernetes' CEL (ext strings), not the planner's: the pod gets a
    GpuRequestRefused Event, the metric counts it, and the pool stays at zero."""
    core = client.CoreV1Api(api)
    odd = 'device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("a100")'
    async with pending_dra(
        "odd", 1, nodes_of(8, test_id), device_class="gpu.nvidia.com", selectors=[odd]
    ) as (
        dra,
        ctl,
    ):
        (pod,) = (await core.list_namespaced_pod(namespace, label_selector="app=odd")).items
        refused = await wait_for_event(core, namespace, pod.metadata.name, "GpuRequestRefused")
        assert "lowerAscii" in refused.message and refused.type == "Warning"
        await rounds(ctl, 2)
        metrics = ctl.controller.autoscaler.metrics  # type: ignore[union-attr]
        assert metrics.refused_pods.labels("dra_unevaluable")._value.get() == 1
        assert await dra.pool.replicas() == 0 and not await pool_nodes(core, dra.pool)
