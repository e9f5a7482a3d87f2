"""Shared, partitioned and Windows GPUs drained on the real control plane: the scheduler places
the pods by their GPU resources, a card goes bad, and the controller evicts exactly the pods on
that card (gpushare, cGPU, MIG), or every GPU pod where no card is named (DirectX). A node
labelled ``gpumon.io/exclude=true`` reports its fault and is never acted on.

kwok runs no kubelet, device plugin or gpushare scheduler extender: what they would write (the
extender's ``ALIYUN_COM_GPU_MEM_*`` annotations, the kubelet's pod-resources answer naming MIG
devices) the test writes, as they would, after the real scheduler has bound each pod."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import controller_harness as h
import pytest
from controller_harness import Exporter, Scene, sa_kubeconfig_for_fixture, scene_fixture  # noqa: F401 - fixtures
from kubernetes_asyncio import client

from gpumon.devcluster import nodes, workloads
from gpumon.devcluster.podresources_server import pod_resources
from gpumon.devcluster.waiting import eventually
from gpumon.devices.simulated import FaultScenario, ScenarioMig
from gpumon.k8s.resources import (
    CGPU_CORE_RESOURCE,
    DIRECTX_RESOURCE,
    GPUSHARE_MEMORY_RESOURCE,
    NVIDIA_MIG_PREFIX,
)
from gpumon.k8s.sharing import GPUSHARE_ASSIGNED, GPUSHARE_INDEX, GPUSHARE_POD_MEMORY, HAMI_ALLOCATED

MERGE_PATCH = "application/merge-patch+json"
MIG_PROFILE = "3g.40gb"
APP = "share"


async def _pods_running(
    scene: Scene, limits: dict[str, str], replicas: int, **selector: str
) -> list[client.V1Pod]:
    """A Deployment of ``replicas`` pods asking ``limits`` on this test's nodes, once all Running
    (sorted by name)."""
    body = workloads.gpu_deployment(
        APP, replicas=replicas, limits=limits, node_selector={h.TEST_LABEL: scene.test_id, **selector}
    )
    await client.AppsV1Api(scene.api).create_namespaced_deployment(scene.namespace, body)

    async def all_running() -> list[client.V1Pod] | None:
        pods = await h.running_pods(scene.core, scene.namespace, APP)
        return pods if len(pods) == replicas else None

    pods = await eventually(all_running, what=f"{replicas} pods of {APP} Running")
    return sorted(pods, key=lambda p: p.metadata.name)


async def _extender_places(scene: Scene, pod: client.V1Pod, index: int, memory: int) -> None:
    """The annotations the gpushare scheduler extender writes when it binds a pod to card
    ``index`` (AliyunContainerService/gpushare-scheduler-extender), as the device plugin
    leaves them once the kubelet allocated it."""
    annotations = {GPUSHARE_INDEX: str(index), GPUSHARE_POD_MEMORY: str(memory), GPUSHARE_ASSIGNED: "true"}
    await scene.core.patch_namespaced_pod(
        pod.metadata.name,
        scene.namespace,
        {"metadata": {"annotations": annotations}},
        _content_type=MERGE_PATCH,
    )


async def _exactly_evicted(
    scene: Scene, node: str, gone: list[client.V1Pod], stay: list[client.V1Pod]
) -> None:
    """The node drains (state ``drained``): ``gone`` were evicted, ``stay`` are the same pods
    on the same node."""
    core, namespace = scene.core, scene.namespace

    async def drained() -> bool | None:
        labels = (await h.node_obj(core, node))["metadata"].get("labels", {})
        return True if labels.get("gpumon.io/state") == "drained" else None

    await eventually(drained, what=f"{node} drained", timeout_seconds=90)
    for pod in gone:
        await h.wait_for_event(core, namespace, pod.metadata.name, "GpuPodEvicted")
    now = {p.metadata.name: p for p in await h.running_pods(core, namespace, APP)}
    assert not {p.metadata.name for p in gone} & set(now), "a pod on the bad card is still running"
    for pod in stay:
        assert pod.metadata.name in now, f"{pod.metadata.name} (not on the bad card) was evicted"
        assert now[pod.metadata.name].metadata.uid == pod.metadata.uid
        assert now[pod.metadata.name].spec.node_name == node
        assert not await h.events(core, namespace, pod.metadata.name, "GpuPodEvicted")


@pytest.mark.parametrize("scheme", ["gpushare", "cgpu", "hami"])
async def test_one_bad_card_of_a_shared_node_evicts_exactly_the_pods_on_it(
    scene: Scene, scheme: str, tmp_path: Path
) -> None:
    """Three pods share a node's two cards (one on card 0, two on card 1); card 1 goes bad.
    gpushare and HAMi: the exporter names no pods (as with ``pods.api: false``), so the
    controller's own reading of the scheduler's annotations places them (gpushare by card
    index, HAMi by card UUID). cGPU: the exporter runs its real attribution and names them from
    the same annotations; both readings agree."""
    if scheme == "hami":
        # HAMi's device plugin offers each card as vGPUs (deviceSplitCount): 4 a card here.
        template = nodes.NodeTemplate(gpus=8, labels={h.TEST_LABEL: scene.test_id})
        limits = {nodes.GPU: "1"}
    else:
        shared = nodes.SharedGpus(gpus=2, memory_gib_per_gpu=16)
        template = nodes.NodeTemplate(gpus=0, shared=shared, labels={h.TEST_LABEL: scene.test_id})
        limits = {GPUSHARE_MEMORY_RESOURCE: "4"} | ({CGPU_CORE_RESOURCE: "30"} if scheme == "cgpu" else {})
    (node,) = await scene.make_nodes(1, template)
    pods = await _pods_running(scene, limits, 3)
    assert {p.spec.node_name for p in pods} == {node}
    on_good, on_bad = pods[:1], pods[1:]
    if scheme == "cgpu":
        ctx = h.attributing_exporter(node, scene.kubeconfig, tmp_path, gpus=2)
    else:
        ctx = h.exporters([node], gpus=2)
    async with ctx as made:
        ex: dict[str, Exporter] = made if isinstance(made, dict) else {node: made}
        for pod, card in [(on_good[0], 0), (on_bad[0], 1), (on_bad[1], 1)]:
            if scheme == "hami":
                await _hami_places(scene, pod, ex[node].uuid(card))
            else:
                await _extender_places(scene, pod, card, 4)
        if scheme == "cgpu":
            kubelet = ex[node].kubelet
            assert kubelet is not None
            # The kubelet lists the pods it runs; a sharing plugin's devices are virtual, so the
            # annotations alone name the card.
            kubelet.pods = tuple(pod_resources(scene.namespace, p.metadata.name, {"cuda": {}}) for p in pods)
            await _exporter_names(ex[node], {p.metadata.name for p in pods})
        async with scene.controller(ex):
            ex[node].fault(gpu=1, fault="xid", code=79)
            await eventually(lambda: h.tainted(scene.core, node), what="the shared node tainted")
            await _exactly_evicted(scene, node, on_bad, on_good)


async def _hami_places(scene: Scene, pod: client.V1Pod, uuid: str) -> None:
    """What HAMi's scheduler writes for a one-container pod given 4 GiB and 25 % of card
    ``uuid`` (Project-HAMi/HAMi ``hami.io/vgpu-devices-allocated``: ``UUID,Type,MiB,cores:``,
    ``;`` after each container)."""
    annotations = {HAMI_ALLOCATED: f"{uuid},NVIDIA,4096,25:;"}
    await scene.core.patch_namespaced_pod(
        pod.metadata.name,
        scene.namespace,
        {"metadata": {"annotations": annotations}},
        _content_type=MERGE_PATCH,
    )


async def _exporter_names(ex: Exporter, pods: set[str]) -> None:
    """Wait until the exporter's snapshot attributes every one of ``pods`` to a GPU."""

    seen: set[str] = set()

    async def named() -> bool | None:
        async with aiohttp.ClientSession() as s, s.get(ex.url + "/api/v1/snapshot") as r:
            doc = await r.json()
        seen.clear()
        seen.update(p["ref"]["pod"] for p in doc.get("pods") or ())
        return True if pods <= seen else None

    await eventually(
        named, what=f"the exporter of {ex.node} attributes {sorted(pods)}", seen=lambda: sorted(seen)
    )


async def test_one_bad_gpu_of_a_mig_node_evicts_exactly_the_pods_on_its_instances(
    scene: Scene, tmp_path: Path
) -> None:
    """Two A100s, each split into two 3g.40gb instances (NVIDIA's mixed strategy offers
    nvidia.com/mig-3g.40gb: 4). The kubelet gives one pod an instance of GPU 0 and two pods the
    instances of GPU 1; GPU 1 goes bad: its two pods go, the one on GPU 0 stays."""
    template = nodes.NodeTemplate(gpus=2, mig={MIG_PROFILE: 2}, labels={h.TEST_LABEL: scene.test_id})
    (node,) = await scene.make_nodes(1, template)
    resource = NVIDIA_MIG_PREFIX + MIG_PROFILE
    pods = await _pods_running(scene, {resource: "1"}, 3)
    on_good, on_bad = pods[:1], pods[1:]
    scenario = FaultScenario(
        mig=tuple(ScenarioMig(gpu=i, profiles=(MIG_PROFILE, MIG_PROFILE)) for i in (0, 1))
    )
    async with h.attributing_exporter(node, scene.kubeconfig, tmp_path, gpus=2, scenario=scenario) as ex:
        instances = [[m.uuid for m in ex.backend.read_slow(i).mig_instances] for i in (0, 1)]
        held = [instances[0][0], instances[1][0], instances[1][1]]
        assert ex.kubelet is not None
        ex.kubelet.pods = tuple(
            pod_resources(scene.namespace, p.metadata.name, {"cuda": {resource: [uuid]}})
            for p, uuid in zip(pods, held, strict=True)
        )
        await _exporter_names(ex, {p.metadata.name for p in pods})
        async with scene.controller({node: ex}):
            ex.fault(gpu=1, fault="xid", code=79)
            await eventually(lambda: h.tainted(scene.core, node), what="the MIG node tainted")
            await _exactly_evicted(scene, node, on_bad, on_good)


async def test_a_fault_on_a_windows_directx_node_evicts_its_directx_pods(scene: Scene) -> None:
    """The remediation test once on a Windows node: its GPUs are offered as
    windows.alibabacloud.com/directx, which names no card, so every DirectX pod goes when one
    GPU is bad; a CPU-only pod on the node stays."""
    template = nodes.NodeTemplate(gpus=2, os="windows", labels={h.TEST_LABEL: scene.test_id})
    (node,) = await scene.make_nodes(1, template)
    allocatable = (await h.node_obj(scene.core, node))["status"]["allocatable"]
    assert allocatable[DIRECTX_RESOURCE] == "2" and nodes.GPU not in allocatable
    windows = {"kubernetes.io/os": "windows"}
    gpu_pods = await _pods_running(scene, {DIRECTX_RESOURCE: "1"}, 2, **windows)
    cpu = workloads.gpu_deployment(
        "cpu", replicas=1, limits={"cpu": "1"}, node_selector={h.TEST_LABEL: scene.test_id, **windows}
    )
    await client.AppsV1Api(scene.api).create_namespaced_deployment(scene.namespace, cpu)
    (cpu_pod,) = await eventually(
        lambda: _some(h.running_pods(scene.core, scene.namespace, "cpu")), what="the CPU pod Running"
    )
    async with h.exporters([node], gpus=2) as ex, scene.controller(ex):
        ex[node].fault(gpu=0, fault="xid", code=79)
        tainted_node = await eventually(lambda: h.tainted(scene.core, node), what="the Windows node tainted")
        assert h.our_taint(tainted_node) == {
            "key": "gpumon.io/gpu-unhealthy",
            "value": "unhealthy",
            "effect": "NoSchedule",
        }
        await _exactly_evicted(scene, node, gpu_pods, [])
        (still,) = await h.running_pods(scene.core, scene.namespace, "cpu")
        assert still.metadata.uid == cpu_pod.metadata.uid


async def _some(pods_coro) -> list[client.V1Pod] | None:  # type: ignore[no-untyped-def]
    pods = await pods_coro
    return pods or None


async def test_an_excluded_node_reports_its_fault_and_is_never_acted_on(scene: Scene) -> None:
    """``gpumon.io/exclude=true``: the fault is reported (a GpuQuarantineSkipped Event naming
    the GPU, counted as action "skipped"), and the node gets no taint, no condition, no label,
    and its GPU pod stays."""
    template = nodes.NodeTemplate(gpus=2, labels={h.TEST_LABEL: scene.test_id, "gpumon.io/exclude": "true"})
    (node,) = await scene.make_nodes(1, template)
    (pod,) = await _pods_running(scene, {nodes.GPU: "1"}, 1)
    async with h.exporters([node], gpus=2) as ex:
        ex[node].placement.pods[0] = (scene.namespace, pod.metadata.name)
        async with scene.controller(ex) as ctl:
            ex[node].fault(gpu=0, fault="xid", code=79)
            skipped = await h.wait_for_event(scene.core, "default", node, "GpuQuarantineSkipped")
            assert "gpumon.io/exclude=true" in skipped.message and ex[node].uuid(0) in skipped.message
            actions = ctl.controller.metrics.actions
            assert actions.labels("skipped", "refused")._value.get() >= 1
            # Later rounds see the same fault and still do nothing. Each is asked for: a fresh
            # node is not looked at again on its own (f7d70d7), so no round comes unbidden.
            for _ in range(2):
                rounds = ctl.controller.reconciler.rounds
                ctl.controller.reconciler.mark([node])

                async def another_round(before: int = rounds) -> bool | None:
                    return True if ctl.controller.reconciler.rounds > before else None

                await eventually(another_round, what="one more reconcile round of the node")
            after = await h.node_obj(scene.core, node)
            assert h.our_taint(after) is None
            assert "gpumon.io/state" not in after["metadata"].get("labels", {})
            assert not any(c["type"] == "GpuUnhealthy" for c in after["status"].get("conditions") or ())
            assert not (after["spec"].get("unschedulable"))
            (still,) = await h.running_pods(scene.core, scene.namespace, APP)
            assert still.metadata.uid == pod.metadata.uid
            assert not await h.events(scene.core, scene.namespace, pod.metadata.name, "GpuPodEvicted")
            assert actions.labels("quarantine", "success")._value.get() == 0
