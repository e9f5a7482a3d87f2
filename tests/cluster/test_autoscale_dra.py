"""DRA demand on the real control plane: pods asking for GPUs through ResourceClaimTemplates stay
pending (no node publishes devices yet), the controller scales a Cluster API pool whose template
declares the devices a new node publishes, the pool simulator's nodes publish them in their
ResourceSlices (gpumon.devcluster.resourceslices, NVIDIA's names), and the real kube-scheduler
allocates the claims and binds the pods. A selector the planner cannot evaluate is reported and
scales nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controller_harness import TEST_LABEL, sa_kubeconfig_for_fixture, wait_for_event  # noqa: F401 - fixtures
from kubernetes_asyncio import client
from test_autoscale_pools import (  # noqa: F401 - fixtures
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


async def _deploy(
    api: client.ApiClient, namespace: str, test_id: str, app: str, replicas: int, **claim: Any
) -> None:
    await client.ResourceV1Api(api).create_namespaced_resource_claim_template(
        namespace, workloads.claim_template(app, **claim)
    )
    await client.AppsV1Api(api).create_namespaced_deployment(
        namespace,
        workloads.dra_deployment(
            app, replicas=replicas, claim_template_name=app, node_selector={TEST_LABEL: test_id}
        ),
    )


async def _scaled_to(
    pool: Any, replicas: int, api: client.ApiClient, namespace: str, app: str, count: int
) -> None:
    async def requested() -> int | None:
        return (await pool.replicas()) or None

    assert await eventually(requested, what="a scale request") == replicas
    bound = await eventually(
        lambda: _claimed(api, namespace, app, count),
        what=f"{count} pods bound, claims allocated",
        timeout_seconds=120,
    )
    assert len({p.spec.node_name for p in bound}) == replicas
    assert await pool.replicas() == replicas  # never more than needed while they were bound


async def test_whole_gpu_claims_scale_a_pool_from_zero_to_exactly_the_nodes_they_need(
    api: client.ApiClient,
    namespace: str,
    test_id: str,
    make_pool: PoolFactory,  # noqa: F811 - the fixture
    kubeconfig: Path,  # noqa: F811 - the fixture
) -> None:
    """Ten pods each claiming one GPU of class gpu.nvidia.com with a CEL selector on the
    capacity the template publishes, on 8-GPU nodes: exactly two nodes, then the scheduler
    allocates every claim there."""
    core = client.CoreV1Api(api)
    template = nodes.NodeTemplate(gpus=8, dra=True, labels={TEST_LABEL: test_id})
    pool = await make_pool("dra", template)
    config = pool_config(
        pool, test_id, template={"labels": {TEST_LABEL: test_id}, "dra": resourceslices.pool_dra(template)}
    )
    big = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'
    await _deploy(api, namespace, test_id, "train", 10, device_class="gpu.nvidia.com", selectors=[big])
    await all_unschedulable(core, namespace, 10)
    async with autoscaling(kubeconfig, namespace, test_id, [config], simulate=[pool], api=api):
        await _scaled_to(pool, 2, api, namespace, "train", 10)


async def test_mig_claims_scale_a_pool_to_exactly_the_nodes_they_need(
    api: client.ApiClient,
    namespace: str,
    test_id: str,
    make_pool: PoolFactory,  # noqa: F811 - the fixture
    kubeconfig: Path,  # noqa: F811 - the fixture
) -> None:
    """Nodes of two A100s, each split into two 3g.40gb instances (four MIG devices a node):
    seven pods claiming one mig.nvidia.com device of profile 3g.40gb need exactly two nodes."""
    core = client.CoreV1Api(api)
    template = nodes.NodeTemplate(gpus=2, dra=True, mig={"3g.40gb": 2}, labels={TEST_LABEL: test_id})
    pool = await make_pool("mig", template)
    config = pool_config(
        pool, test_id, template={"labels": {TEST_LABEL: test_id}, "dra": resourceslices.pool_dra(template)}
    )
    assert len(config["template"]["dra"]["devices"]) == 4
    profile = 'device.attributes["gpu.nvidia.com"].profile == "3g.40gb"'
    await _deploy(api, namespace, test_id, "mig", 7, device_class="mig.nvidia.com", selectors=[profile])
    await all_unschedulable(core, namespace, 7)
    async with autoscaling(kubeconfig, namespace, test_id, [config], simulate=[pool], api=api):
        await _scaled_to(pool, 2, api, namespace, "mig", 7)


async def test_a_selector_the_planner_cannot_evaluate_is_reported_and_scales_nothing(
    api: client.ApiClient,
    namespace: str,
    test_id: str,
    make_pool: PoolFactory,  # noqa: F811 - the fixture
    kubeconfig: Path,  # noqa: F811 - the fixture
) -> None:
    """lowerAscii is Kubernetes' CEL (ext strings), not the planner's: the pod gets a
    GpuRequestRefused Event, the metric counts it, and the pool stays at zero."""
    core = client.CoreV1Api(api)
    template = nodes.NodeTemplate(gpus=8, dra=True, labels={TEST_LABEL: test_id})
    pool = await make_pool("odd", template)
    config = pool_config(
        pool, test_id, template={"labels": {TEST_LABEL: test_id}, "dra": resourceslices.pool_dra(template)}
    )
    odd = 'device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("a100")'
    await _deploy(api, namespace, test_id, "odd", 1, device_class="gpu.nvidia.com", selectors=[odd])
    await all_unschedulable(core, namespace, 1)
    async with autoscaling(kubeconfig, namespace, test_id, [config], simulate=[pool], api=api) as ctl:
        (pod,) = (await core.list_namespaced_pod(namespace, label_selector="app=odd")).items
        refused = await wait_for_event(core, namespace, pod.metadata.name, "GpuRequestRefused")
        assert "lowerAscii" in refused.message and refused.type == "Warning"
        await rounds(ctl, 2)
        metrics = ctl.controller.autoscaler.metrics  # type: ignore[union-attr]
        assert metrics.refused_pods.labels("dra_unevaluable")._value.get() == 1
        assert await pool.replicas() == 0 and not await pool_nodes(core, pool)
