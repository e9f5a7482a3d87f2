"""Pool autoscaling against the real control plane: the controller (as the shipped ServiceAccount
plus the autoscaling rules of docs/autoscaling.md) scales a Cluster API MachineDeployment that
Cluster API's own manager (v1.13.6) reconciles into Machines, which the devcluster's kwok
infrastructure provider turns into kwok Nodes whose GPUs register a further delay after they
join (tests/capi_pools.py); the real scheduler places the pods. Cluster API names the Nodes:
the tests find them by the pool's label, never by a predicted name."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from capi_pools import CapiPool, PoolFactory, at_size
from controller_harness import (  # noqa: F401 - fixtures
    TEST_LABEL,
    KubeconfigFactory,
    Running,
    controller_config,
    events,
    exporters,
    fresh_signals,
    node_obj,
    running,
    sa_kubeconfig_for_fixture,
    wait_for_event,
)
from kubernetes_asyncio import client, watch

from gpumon.controller.core.contract import RECORD_ANNOTATION, REMOVING_ANNOTATION
from gpumon.devcluster import capi, nodes
from gpumon.devcluster.nodes import POOL_LABEL
from gpumon.devcluster.waiting import eventually

# cluster-autoscaler's node-group bounds on a Cluster API target.
CA = {
    "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "0",
    "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "1",
}
# A pool Node's GPUs register this long after it joined (its device plugin's start): the
# controller sees nodes that joined without GPUs as well as Machines without Nodes.
DEVICES_AFTER_SECONDS = 3.0
Pool = CapiPool


@pytest.fixture
def make_pool(capi_pool: PoolFactory) -> PoolFactory:
    """``await make_pool(suffix, template, replicas=0, annotations=None)``: a Cluster API pool
    of ``template`` nodes (8 whole GPUs by default) whose GPUs register ``devices_after_seconds``
    (:data:`DEVICES_AFTER_SECONDS` unless told) after a Node joins."""

    async def make(
        suffix: str = "gpu",
        template: nodes.NodeTemplate | None = None,
        replicas: int = 0,
        annotations: dict[str, str] | None = None,
        devices_after_seconds: float = DEVICES_AFTER_SECONDS,
    ) -> Pool:
        return await capi_pool(
            replicas=replicas,
            suffix=suffix,
            template=template,
            annotations=annotations,
            devices_after_seconds=devices_after_seconds,
        )

    return make


@pytest.fixture
async def kubeconfig(sa_kubeconfig_for: KubeconfigFactory) -> Path:
    """The shipped ServiceAccount and its RBAC, autoscaling rules included."""
    return await sa_kubeconfig_for(autoscaling=True)


def pool_config(pool: Pool, test_id: str, **over: Any) -> dict[str, Any]:
    template: dict[str, Any] = {"resources": {"nvidia.com/gpu": 8}, "labels": {TEST_LABEL: test_id}}
    shared = pool.template.shared
    if shared is not None:
        template = {
            "shared_gpus": {"cards": shared.gpus, "memory_per_card": shared.memory_gib_per_gpu},
            "labels": {TEST_LABEL: test_id},
        }
    return {
        "name": pool.name,
        "target": {"namespace": pool.namespace, "name": pool.name},
        "node_selector": f"{POOL_LABEL}={pool.name}",
        "template": template,
        "max_replicas": 10,
        **over,
    }


@contextlib.asynccontextmanager
async def autoscaling(
    kubeconfig: Path,
    namespace: str,
    test_id: str,
    pools: list[dict[str, Any]],
    *,
    endpoints: dict[str, str] | None = None,
) -> AsyncIterator[Running]:
    cfg = controller_config(
        kubeconfig=kubeconfig, namespace=namespace, test_id=test_id, endpoints=endpoints or {}, pools=pools
    )
    async with running(cfg) as ctl:
        autoscaler = ctl.controller.autoscaler
        assert autoscaler is not None
        await eventually(lambda: _true(autoscaler.rounds > 0), what="a first autoscaling round")
        yield ctl


async def _true(ok: bool) -> bool | None:
    return True if ok else None


async def rounds(ctl: Running, count: int) -> None:
    """Let the autoscaler plan ``count`` more times."""
    autoscaler = ctl.controller.autoscaler
    assert autoscaler is not None
    until = autoscaler.rounds + count
    await eventually(lambda: _true(autoscaler.rounds >= until), what=f"{count} autoscaling rounds")


def gpu_pod(name: str, test_id: str, limits: dict[str, str], **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": "train", **labels}},
        "spec": {
            "nodeSelector": {TEST_LABEL: test_id},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "cuda", "image": "cuda:12", "resources": {"limits": limits}}],
        },
    }


async def scheduled(core: client.CoreV1Api, namespace: str, count: int) -> list[client.V1Pod] | None:
    pods = (await core.list_namespaced_pod(namespace, label_selector="app=train")).items
    bound = [p for p in pods if p.spec.node_name]
    return bound if len(bound) == count else None


async def all_unschedulable(core: client.CoreV1Api, namespace: str, count: int) -> None:
    """Wait until ``count`` pods are marked Unschedulable. The scheduler marks them one by one;
    on a loaded machine that can take longer than the autoscaler's debounce, and a controller
    that sees 3 of 5 rightly asks for fewer nodes first. A test that holds the plan for all of
    them has them all pending before the controller starts."""

    async def marked() -> bool | None:
        pods = (await core.list_namespaced_pod(namespace)).items

        def unschedulable(pod: client.V1Pod) -> bool:
            conditions = pod.status.conditions or ()
            return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions)

        return True if sum(map(unschedulable, pods)) == count else None

    await eventually(marked, what=f"{count} pods marked Unschedulable", timeout_seconds=60)


async def pool_nodes(core: client.CoreV1Api, pool: Pool) -> list[client.V1Node]:
    listed = await core.list_node(label_selector=f"{POOL_LABEL}={pool.name}")
    return sorted(listed.items, key=lambda n: n.metadata.name)


async def test_pending_pods_scale_a_pool_from_zero_to_exactly_what_they_need(
    api: client.ApiClient, namespace: str, test_id: str, make_pool: PoolFactory, kubeconfig: Path
) -> None:
    core = client.CoreV1Api(api)
    pool = await make_pool()
    for i in range(5):
        await core.create_namespaced_pod(namespace, gpu_pod(f"train-{i}", test_id, {nodes.GPU: "2"}))

    await all_unschedulable(core, namespace, 5)
    async with autoscaling(kubeconfig, namespace, test_id, [pool_config(pool, test_id)]) as ctl:
        seen: list[int] = []

        async def requested() -> int | None:
            n = await pool.replicas()
            seen.append(n)
            return n if n else None

        assert await eventually(requested, what="a scale request", interval_seconds=0.05) == 2

        async def all_scheduled() -> list[client.V1Pod] | None:
            seen.append(await pool.replicas())
            return await scheduled(core, namespace, 5)

        bound = await eventually(all_scheduled, what="5 pods scheduled on the new nodes", timeout_seconds=90)
        names = {n.metadata.name for n in await pool_nodes(core, pool)}
        assert {p.spec.node_name for p in bound} <= names and len(names) == 2
        # Throughout the boot and the GPU-allocatable delay, and after: never more than 2.
        await rounds(ctl, 3)
        seen.append(await pool.replicas())
        assert max(seen) == 2 and seen[-1] == 2
        record = (await pool.md())["metadata"]["annotations"][RECORD_ANNOTATION]
        assert "scaledUpAt" in record
        event = await wait_for_event(core, namespace, pool.name, "GpuPoolScaleUp")
        assert "0 -> 2" in event.message and "5 pending GPU pod(s) need 2 node(s)" in event.message
        # The time to a scale request is measured by bench/ (docs/benchmarks.md), not asserted here.
        metric = ctl.controller.autoscaler.metrics.pending_to_request  # type: ignore[union-attr]
        print(f"Unschedulable -> scale request (controller's own measure): {metric._sum.get():.2f}s")


async def test_shared_gpu_pods_are_bin_packed_per_card(
    api: client.ApiClient, namespace: str, test_id: str, make_pool: PoolFactory, kubeconfig: Path
) -> None:
    core = client.CoreV1Api(api)
    shared = nodes.NodeTemplate(gpus=0, shared=nodes.SharedGpus(4, 16), labels={TEST_LABEL: test_id})
    pool = await make_pool("share", shared)
    async with autoscaling(kubeconfig, namespace, test_id, [pool_config(pool, test_id)]) as ctl:
        for i in range(12):
            await core.create_namespaced_pod(
                namespace, gpu_pod(f"infer-{i}", test_id, {nodes.SHARED_GPU_MEMORY: "5"})
            )

        async def requested() -> int | None:
            return (await pool.replicas()) or None

        # 3 pods of 5 GiB per 16 GiB card, 4 cards a node: one node, not twelve.
        assert await eventually(requested, what="a scale request") == 1
        await eventually(lambda: scheduled(core, namespace, 12), what="12 pods scheduled", timeout_seconds=90)
        await rounds(ctl, 2)
        assert await pool.replicas() == 1


async def test_cgpu_core_share_pods_are_bin_packed_per_card_and_off_step_ones_refused(
    api: client.ApiClient, namespace: str, test_id: str, make_pool: PoolFactory, kubeconfig: Path
) -> None:
    """cGPU: 2 cards of 16 GiB a node; pods of 2 GiB and 30 % of a card's cores fit three to a
    card (90 %), six to a node. Twelve of them need exactly two nodes, and the real scheduler
    puts six on each (its node-wide 200 % allows no seventh). A pod asking 33 % then is
    reported and never makes the pool grow."""
    core = client.CoreV1Api(api)
    shared = nodes.NodeTemplate(gpus=0, shared=nodes.SharedGpus(2, 16), labels={TEST_LABEL: test_id})
    pool = await make_pool("cgpu", shared)
    limits = {nodes.SHARED_GPU_MEMORY: "2", nodes.SHARED_GPU_CORE: "30"}
    for i in range(12):
        await core.create_namespaced_pod(namespace, gpu_pod(f"infer-{i}", test_id, limits))
    await all_unschedulable(core, namespace, 12)
    async with autoscaling(kubeconfig, namespace, test_id, [pool_config(pool, test_id)]) as ctl:

        async def requested() -> int | None:
            return (await pool.replicas()) or None

        assert await eventually(requested, what="a scale request") == 2
        bound = await eventually(
            lambda: scheduled(core, namespace, 12), what="12 pods scheduled", timeout_seconds=90
        )
        per_node: dict[str, int] = {}
        for p in bound:
            per_node[p.spec.node_name] = per_node.get(p.spec.node_name, 0) + 1
        assert sorted(per_node.values()) == [6, 6]
        # Each node has 20 % of its cores left: a pod asking 33 % stays pending. Counted as
        # demand it would ask for a third node; off the 5 % steps, it is refused instead.
        odd = {nodes.SHARED_GPU_MEMORY: "2", nodes.SHARED_GPU_CORE: "33"}
        await core.create_namespaced_pod(namespace, gpu_pod("odd", test_id, odd, app="odd"))
        refused = await wait_for_event(core, namespace, "odd", "GpuRequestRefused")
        assert "33 %" in refused.message and "multiples of 5" in refused.message
        await rounds(ctl, 2)
        assert await pool.replicas() == 2
        metrics = ctl.controller.autoscaler.metrics  # type: ignore[union-attr]
        assert metrics.refused_pods.labels("cgpu_core_step")._value.get() == 1


async def test_mig_profile_pods_scale_a_pool_to_exactly_the_nodes_they_need(
    api: client.ApiClient, namespace: str, test_id: str, make_pool: PoolFactory, kubeconfig: Path
) -> None:
    """A pool of A100 nodes with both GPUs split into two 3g.40gb instances (mixed strategy:
    nvidia.com/mig-3g.40gb: 4 a node). Seven pods of one instance need exactly two nodes."""
    core = client.CoreV1Api(api)
    resource = "nvidia.com/mig-3g.40gb"
    template = nodes.NodeTemplate(gpus=2, mig={"3g.40gb": 2}, labels={TEST_LABEL: test_id})
    pool = await make_pool("mig", template)
    # The pool's template says what such a node offers: nvidia.com/mig-3g.40gb: 4.
    config = pool_config(pool, test_id, template=nodes.pool_template(template))
    assert config["template"]["resources"][resource] == "4"
    for i in range(7):
        await core.create_namespaced_pod(namespace, gpu_pod(f"mig-{i}", test_id, {resource: "1"}))
    await all_unschedulable(core, namespace, 7)
    async with autoscaling(kubeconfig, namespace, test_id, [config]) as ctl:

        async def requested() -> int | None:
            return (await pool.replicas()) or None

        assert await eventually(requested, what="a scale request") == 2
        bound = await eventually(
            lambda: scheduled(core, namespace, 7), what="7 pods scheduled", timeout_seconds=90
        )
        assert len({p.spec.node_name for p in bound}) == 2
        await rounds(ctl, 2)
        assert await pool.replicas() == 2


async def test_a_quarantined_node_gets_a_replacement_before_its_drain_finishes(
    api: client.ApiClient, namespace: str, test_id: str, make_pool: PoolFactory, kubeconfig: Path
) -> None:
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    pool = await make_pool(replicas=2)
    names = await eventually(lambda: at_size(pool, 2), what="2 pool nodes", timeout_seconds=90)
    bad, good = sorted(names)
    async with exporters([bad, good], gpus=8) as ex:
        endpoints = {n: e.url for n, e in ex.items()}
        cfg = [pool_config(pool, test_id)]
        async with autoscaling(kubeconfig, namespace, test_id, cfg, endpoints=endpoints) as ctl:
            await eventually(
                lambda: fresh_signals(ctl, 2),
                what="both pool nodes joined, signals fresh",
                timeout_seconds=60,
            )
            pod = gpu_pod("serve-0", test_id, {nodes.GPU: "1"}, tier="serve")
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": bad}
            await core.create_namespaced_pod(namespace, pod)
            await policy.create_namespaced_pod_disruption_budget(
                namespace,
                {
                    "metadata": {"name": "keep"},
                    "spec": {"minAvailable": 1, "selector": {"matchLabels": {"tier": "serve"}}},
                },
            )
            await eventually(lambda: scheduled(core, namespace, 1), what="the pod on the node to break")
            ex[bad].fault(gpu=0, fault="xid", code=79)

            async def replacement() -> int | None:
                n = await pool.replicas()
                return n if n == 3 else None

            await eventually(replacement, what="a replacement node requested")
            labels = (await node_obj(core, bad))["metadata"]["labels"]
            assert labels.get("gpumon.io/state") == "draining"  # the PDB holds the drain
            event = await wait_for_event(core, namespace, pool.name, "GpuPoolScaleUp")
            assert f"replacing quarantined {bad}" in event.message
            await rounds(ctl, 3)
            assert await pool.replicas() == 3  # once per quarantined node


async def test_idle_nodes_are_drained_respecting_pdbs_and_removed_down_to_min(
    api: client.ApiClient, namespace: str, test_id: str, make_pool: PoolFactory, kubeconfig: Path
) -> None:
    """Which node goes is gpumon's choice, made on Cluster API's side by the
    ``cluster.x-k8s.io/delete-machine`` annotation on its Machine: the MachineSet deletes the
    marked Machine first, whatever its own deletion order would pick."""
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    pool = await make_pool(replicas=2)
    cfg = [
        pool_config(
            pool, test_id, min_replicas=1, scale_down_unneeded_seconds=2, scale_down_cooldown_seconds=0
        )
    ]
    names = await eventually(lambda: at_size(pool, 2), what="2 pool nodes", timeout_seconds=90)
    victim, stays = sorted(names)
    # A CPU pod on the node that will be chosen (idle as long as the other, first by name), held
    # by a PDB.
    cpu = {
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": victim},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "web", "image": "nginx"}],
        },
    }
    await policy.create_namespaced_pod_disruption_budget(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
        },
    )
    await core.create_namespaced_pod(namespace, cpu)

    async def web_running() -> bool | None:
        p = await core.read_namespaced_pod("web", namespace)
        return True if p.status.phase == "Running" else None

    await eventually(web_running, what="the CPU pod Running")
    async with autoscaling(kubeconfig, namespace, test_id, cfg) as ctl:
        blocked = await wait_for_event(core, "default", victim, "GpuPoolEvictionBlocked")
        assert "web" in blocked.message
        node = await node_obj(core, victim)
        assert node["spec"].get("unschedulable") is True
        assert REMOVING_ANNOTATION in node["metadata"]["annotations"]
        await rounds(ctl, 2)
        assert await pool.replicas() == 2  # the PDB holds it
        await policy.delete_namespaced_pod_disruption_budget("web", namespace)

        async def scaled_down() -> bool | None:
            return True if await pool.replicas() == 1 else None

        await eventually(scaled_down, what="replicas lowered to 1", timeout_seconds=60)
        # Cluster API drains the Node of the Machine it deletes before deleting it.
        remaining = await eventually(
            lambda: _len(pool_nodes(core, pool), 1), what="one node left", timeout_seconds=90
        )
        assert remaining[0].metadata.name == stays  # the marked node went, not another

        async def one_machine() -> list[str] | None:
            # Cluster API deletes the Node first, then lets its Machine go.
            linked = [m["status"]["nodeRef"]["name"] for m in await pool.machines()]
            return linked if len(linked) == 1 else None

        assert await eventually(one_machine, what="the marked Machine gone", timeout_seconds=60) == [stays]
        event = await wait_for_event(core, namespace, pool.name, "GpuPoolScaledDown")
        assert victim in event.message and "2 -> 1" in event.message
        await rounds(ctl, 3)
        assert await pool.replicas() == 1  # never below min


async def test_a_node_running_a_gpu_pod_is_kept_by_the_list_of_its_pods(
    api: client.ApiClient, namespace: str, test_id: str, make_pool: PoolFactory, kubeconfig: Path
) -> None:
    """No exporter runs on these nodes and the controller keeps no cache of the fleet's pods:
    which node is busy is one list of each node's pods (``spec.nodeName``), asked of the real
    API server. The idle node goes; the node running a GPU pod is never cordoned."""
    core = client.CoreV1Api(api)
    pool = await make_pool(replicas=2)
    cfg = [pool_config(pool, test_id, scale_down_unneeded_seconds=2, scale_down_cooldown_seconds=0)]
    names = await eventually(lambda: at_size(pool, 2), what="2 pool nodes", timeout_seconds=90)
    busy, idle = sorted(names)
    pod = gpu_pod("train-0", test_id, {"nvidia.com/gpu": "1"})
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": busy}
    await core.create_namespaced_pod(namespace, pod)
    await eventually(lambda: scheduled(core, namespace, 1), what="the GPU pod bound", timeout_seconds=60)
    async with autoscaling(kubeconfig, namespace, test_id, cfg) as ctl:
        remaining = await eventually(
            lambda: _len(pool_nodes(core, pool), 1), what="the idle node removed", timeout_seconds=120
        )
        assert remaining[0].metadata.name == busy
        node = await node_obj(core, busy)
        assert not node["spec"].get("unschedulable") and REMOVING_ANNOTATION not in node["metadata"].get(
            "annotations", {}
        )
        lists = ctl.controller.metrics.pod_lists.labels("scale_down", "ok")._value.get()
        assert lists >= 2, "each node's pods listed"
        fleet_wide = [
            i.selection
            for i in ctl.controller.informers.informers
            if i.selection.path == "/api/v1/pods" and not i.selection.field_selector
        ]
        assert fleet_wide == [], "no cache of every pod"
        assert idle not in {n.metadata.name for n in await pool_nodes(core, pool)}


@dataclass
class ScaleHistory:
    """Every version of a pool's MachineDeployment since its creation, as (``spec.replicas``,
    ``scaledUpAt`` of the autoscaler's record): a watch from the resourceVersion of its creation
    gets each write once, in the API server's order, however late it is read. Polling could
    miss a step between two reads, or see it late, on a loaded machine."""

    pool: Pool
    versions: list[tuple[int, float | None]]
    failed: BaseException | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def of(cls, pool: Pool) -> AsyncIterator[ScaleHistory]:
        history = cls(pool, [cls._entry(pool.created)])
        task = asyncio.create_task(history._follow(), name=f"scale-history-{pool.name}")
        try:
            yield history
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    @staticmethod
    def _entry(md: dict[str, Any]) -> tuple[int, float | None]:
        record = json.loads((md["metadata"].get("annotations") or {}).get(RECORD_ANNOTATION) or "{}")
        return int(md["spec"].get("replicas", 0)), record.get("scaledUpAt")

    async def _follow(self) -> None:
        version = self.pool.created["metadata"]["resourceVersion"]
        try:
            while True:  # each watch ends after timeout_seconds; go on from the last version seen
                async with watch.Watch() as w:
                    events = w.stream(
                        self.pool.custom.list_namespaced_custom_object,
                        capi.GROUP,
                        capi.VERSION,
                        self.pool.namespace,
                        capi.MACHINE_DEPLOYMENTS,
                        field_selector=f"metadata.name={self.pool.name}",
                        resource_version=version,
                        timeout_seconds=30,
                    )
                    async for event in events:
                        md = event["object"]
                        version = md["metadata"]["resourceVersion"]
                        if event["type"] == "MODIFIED":
                            self.versions.append(self._entry(md))
        except Exception as e:  # e.g. 410 Gone: the history has a hole, say so
            self.failed = e

    def replicas(self) -> list[int]:
        """Each value ``spec.replicas`` took, in order."""
        self._check()
        return [n for n, _ in itertools.groupby(n for n, _ in self.versions)]

    def scale_ups(self) -> list[float]:
        """The controller's own time of each scale-up, as it recorded them (to the millisecond)."""
        self._check()
        return list(dict.fromkeys(t for _, t in self.versions if t is not None))

    def _check(self) -> None:
        if self.failed is not None:
            raise AssertionError(f"the watch of {self.pool.name} broke: {self.failed!r}")


async def _len(nodes_: Awaitable[list[client.V1Node]], count: int) -> list[client.V1Node] | None:
    found = await nodes_
    return found if len(found) == count else None


async def test_bounds_step_limit_cooldown_and_cluster_autoscaler_pools(
    api: client.ApiClient, namespace: str, test_id: str, make_pool: PoolFactory, kubeconfig: Path
) -> None:
    core = client.CoreV1Api(api)
    refused = await make_pool("ca", annotations=CA)
    # Cluster API makes each requested Machine and its Node, but the Nodes' GPUs do not register
    # within the test: each step's capacity stays "arriving" (joined without allocatable GPUs,
    # inside the controller's arriving timeout), so what is left over at the max is always the
    # same 2 pods. With GPUs registering, the pods bind as nodes come and how many the max-size
    # Event counts depends on when it is written (pods a scale-up was for get time to bind).
    stepped = await make_pool("step", devices_after_seconds=3600)
    pools = [
        # cluster-autoscaler manages it: refused, though it is first in line for the pods.
        pool_config(refused, test_id),
        pool_config(stepped, test_id, max_replicas=3, max_step=1, scale_up_cooldown_seconds=2),
    ]
    async with (
        ScaleHistory.of(stepped) as history,
        autoscaling(kubeconfig, namespace, test_id, pools) as ctl,
    ):
        for i in range(5):
            await core.create_namespaced_pod(namespace, gpu_pod(f"big-{i}", test_id, {nodes.GPU: "8"}))

        async def at_max() -> list[float] | None:
            ups = history.scale_ups()
            return ups if history.replicas()[-1] == 3 and len(ups) >= 3 else None

        ups = await eventually(at_max, what="the step-limited pool at its max, its record written")
        assert history.replicas() == [0, 1, 2, 3]  # one node per step, every step
        gaps = [round(b - a, 3) for a, b in itertools.pairwise(ups)]
        # The 2 s cooldown, between the controller's own decision times (kept to the millisecond).
        assert len(ups) == 3 and all(g >= 2.0 - 0.001 for g in gaps), ups

        async def at_limit(text: str) -> str | None:
            found = await events(core, namespace, stepped.name, "GpuPoolAtLimit")
            return next((e.message for e in found if text in e.message), None)

        await eventually(lambda: at_limit("step limit (1)"), what="an event naming the step limit")
        message = await eventually(lambda: at_limit("max size"), what="an event naming the max size")
        assert message.startswith("2 pending GPU pod(s)")
        event = await wait_for_event(core, namespace, refused.name, "GpuPoolRefused")
        assert "cluster-autoscaler" in event.message
        await rounds(ctl, 2)
        assert await refused.replicas() == 0 and await stepped.replicas() == 3
        assert ctl.controller.autoscaler.metrics.refused.labels(refused.name)._value.get() == 1  # type: ignore[union-attr]


async def test_cluster_autoscaler_annotations_are_the_bounds_when_allowed(
    api: client.ApiClient, namespace: str, test_id: str, make_pool: PoolFactory, kubeconfig: Path
) -> None:
    core = client.CoreV1Api(api)
    pool = await make_pool("ca", annotations=CA)
    cfg = pool_config(pool, test_id, allow_cluster_autoscaler=True)
    del cfg["max_replicas"]
    async with autoscaling(kubeconfig, namespace, test_id, [cfg]) as ctl:
        for i in range(2):
            await core.create_namespaced_pod(namespace, gpu_pod(f"big-{i}", test_id, {nodes.GPU: "8"}))
        await wait_for_event(core, namespace, pool.name, "GpuPoolAtLimit")
        await rounds(ctl, 2)
        assert await pool.replicas() == 1
