"""GPUs handed out through DRA, drained on the real control plane: pods get their GPUs through
ResourceClaims (from a ResourceClaimTemplate, or the claim kube-scheduler makes for a plain
``nvidia.com/gpu`` request on a DRA-only node), the real kube-scheduler allocates each claim a
device of the node's ResourceSlice (published by the devcluster's stand-in for NVIDIA's DRA
driver, with the UUIDs of the node's simulated exporter), a GPU goes bad, and the controller
evicts exactly the pods whose claims hold a device of that GPU, read from the claims'
allocations and the slice: the exporter names no pods here.

Where the replacement's new claim lands shows which of gpumon's marks kept it off the bad GPU:
the node taint (a pod that does not tolerate it goes to another node), or the DeviceTaintRule
(a pod that tolerates every node taint comes back to the same node and is given a healthy
device)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import controller_harness as h
from controller_harness import Exporter, Scene, sa_kubeconfig_for_fixture, scene_fixture  # noqa: F401 - fixtures
from kubernetes_asyncio import client

from gpumon.controller.core.contract import MANAGED_BY_LABEL
from gpumon.controller.core.device_taints import RESOURCE
from gpumon.devcluster import nodes, resourceslices, workloads
from gpumon.devcluster.waiting import eventually
from gpumon.k8s.dra import ClaimRef, claim_devices, pod_claims

APP = "dra-train"
TEMPLATE = "one-gpu"


def _template(scene: Scene, gpus: int, **kw: Any) -> nodes.NodeTemplate:
    return nodes.NodeTemplate(gpus=gpus, dra=True, labels={h.TEST_LABEL: scene.test_id}, **kw)


async def _dra_node(scene: Scene, template: nodes.NodeTemplate) -> tuple[str, Any]:
    """A DRA node (its slice published) and the simulated GPUs its exporter reads."""
    (node,) = await scene.make_nodes(1, template)
    return node, resourceslices.simulated_backend(node, template)


async def _deploy(scene: Scene, replicas: int, body: dict[str, Any], template: dict[str, Any] | None) -> None:
    if template is not None:
        await client.ResourceV1Api(scene.api).create_namespaced_resource_claim_template(
            scene.namespace, template
        )
    await client.AppsV1Api(scene.api).create_namespaced_deployment(scene.namespace, body)


def _claimed(scene: Scene, replicas: int, device_class: str, *, tolerate_all: bool = False) -> dict[str, Any]:
    body = workloads.dra_deployment(
        APP, replicas=replicas, claim_template_name=TEMPLATE, node_selector={h.TEST_LABEL: scene.test_id}
    )
    if tolerate_all:
        body["spec"]["template"]["spec"]["tolerations"] = [{"operator": "Exists"}]
    return body


async def _running(scene: Scene, count: int, but: frozenset[str] = frozenset()) -> dict[str, dict[str, Any]]:
    """The app's ``count`` Running pods (JSON, by name), ``but`` those named, once each one's
    claims are allocated."""
    core, resource = scene.core, client.ResourceV1Api(scene.api)

    async def ready() -> dict[str, dict[str, Any]] | None:
        pods = (await core.list_namespaced_pod(scene.namespace, label_selector=f"app={APP}")).items
        out = {
            p.metadata.name: scene.api.sanitize_for_serialization(p)
            for p in pods
            if p.status.phase == "Running"
            and p.metadata.deletion_timestamp is None
            and p.metadata.name not in but
        }
        if len(out) != count or not all(pod_claims(p) for p in out.values()):
            return None
        for p in out.values():
            for ref in pod_claims(p):
                claim = await resource.read_namespaced_resource_claim(ref.name, ref.namespace)
                if not claim_devices(scene.api.sanitize_for_serialization(claim)):
                    return None
        return out

    return await eventually(
        ready, what=f"{count} pods of {APP} Running with allocated claims", timeout_seconds=90
    )


async def _held(scene: Scene, pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The (pool/device) names the pod's claims were allocated, as the scheduler wrote them."""
    out = []
    for ref in pod_claims(pod):
        claim = await client.ResourceV1Api(scene.api).read_namespaced_resource_claim(ref.name, ref.namespace)
        out += [
            f"{d.ref.pool}/{d.ref.device}" for d in claim_devices(scene.api.sanitize_for_serialization(claim))
        ]
    return tuple(out)


async def _exactly_evicted(
    scene: Scene, gone: set[str], before: Mapping[str, Mapping[str, Any]], replicas: int
) -> dict[str, dict[str, Any]]:
    """``gone`` were evicted; every other pod of ``before`` is the same pod on the same node.
    Returns the pods running once the replacements run."""
    for name in gone:
        await h.wait_for_event(scene.core, scene.namespace, name, "GpuPodEvicted")
    now = await _running(scene, replicas, but=frozenset(gone))
    assert not gone & set(now)
    for name, pod in before.items():
        if name in gone:
            continue
        assert now[name]["metadata"]["uid"] == pod["metadata"]["uid"], f"{name} was replaced"
        assert now[name]["spec"]["nodeName"] == pod["spec"]["nodeName"]
        assert not await h.events(scene.core, scene.namespace, name, "GpuPodEvicted")
    return now


async def _rules(scene: Scene, node: str) -> list[str]:
    """The devices of ``node``'s pool that gpumon's DeviceTaintRules select."""
    found = await client.CustomObjectsApi(scene.api).list_cluster_custom_object(
        "resource.k8s.io", "v1beta2", RESOURCE, label_selector=f"{MANAGED_BY_LABEL}=gpumon"
    )
    found["items"] = [r for r in found["items"] if r["spec"]["deviceSelector"]["pool"] == node]
    return sorted(
        f"{r['spec']['deviceSelector']['pool']}/{r['spec']['deviceSelector']['device']}"
        for r in found["items"]
    )


async def _taints_active(ctl: h.Running) -> None:
    registry = ctl.controller.metrics.registry

    async def active() -> bool | None:
        state = registry.get_sample_value("gpumon_controller_device_taints", {"state": "active"})
        return True if state == 1 else None

    await eventually(active, what="DeviceTaintRules found served")


async def test_a_fault_evicts_exactly_the_pod_whose_claim_holds_the_gpu_and_the_node_taint_moves_it(
    scene: Scene,
) -> None:
    """Three pods on node A's three GPUs; GPU 1 goes bad: the pod holding gpu-1 is evicted, the
    other two keep their uid and node; the replacement (no toleration) is kept off A by the node
    taint and its new claim gets B's GPU."""
    node_a, backend = await _dra_node(scene, _template(scene, 3))
    claim = workloads.claim_template(TEMPLATE, resourceslices.GPU_DEVICE_CLASS)
    await _deploy(scene, 3, _claimed(scene, 3, resourceslices.GPU_DEVICE_CLASS), claim)
    pods = await _running(scene, 3)
    held = {name: await _held(scene, p) for name, p in pods.items()}
    assert sorted(held.values()) == [(f"{node_a}/gpu-{i}",) for i in range(3)]
    (victim,) = [name for name, devices in held.items() if devices == (f"{node_a}/gpu-1",)]
    node_b, _ = await _dra_node(scene, _template(scene, 1))
    async with h.exporters([node_a], backends={node_a: backend}) as ex, scene.controller(ex) as ctl:
        await _taints_active(ctl)
        ex[node_a].fault(gpu=1, fault="xid", code=79)
        now = await _exactly_evicted(scene, {victim}, pods, 3)
        (replacement,) = [p for name, p in now.items() if name not in pods]
        assert replacement["spec"]["nodeName"] == node_b
        assert await _held(scene, replacement) == (f"{node_b}/gpu-0",)
        assert await _rules(scene, node_a) == [f"{node_a}/gpu-1"]


async def test_a_replacement_tolerating_the_node_taint_gets_a_healthy_device_through_the_device_taint(
    scene: Scene,
) -> None:
    """Pods tolerating every node taint: after the eviction the replacement comes back to the
    same node, where the freed device of the bad GPU is the first free one; the DeviceTaintRule
    gpumon wrote for that GPU makes the scheduler give it the healthy free GPU instead."""
    node, backend = await _dra_node(scene, _template(scene, 4))
    claim = workloads.claim_template(TEMPLATE, resourceslices.GPU_DEVICE_CLASS)
    await _deploy(scene, 3, _claimed(scene, 3, resourceslices.GPU_DEVICE_CLASS, tolerate_all=True), claim)
    pods = await _running(scene, 3)
    held = {name: await _held(scene, p) for name, p in pods.items()}
    assert sorted(held.values()) == [(f"{node}/gpu-{i}",) for i in range(3)]
    (victim,) = [name for name, devices in held.items() if devices == (f"{node}/gpu-0",)]
    async with h.exporters([node], backends={node: backend}) as ex, scene.controller(ex) as ctl:
        await _taints_active(ctl)
        ex[node].fault(gpu=0, fault="xid", code=79)
        now = await _exactly_evicted(scene, {victim}, pods, 3)
        assert await _rules(scene, node) == [f"{node}/gpu-0"]
        (replacement,) = [p for name, p in now.items() if name not in pods]
        assert replacement["spec"]["nodeName"] == node
        assert await _held(scene, replacement) == (f"{node}/gpu-3",)


async def test_a_bad_gpu_takes_the_pods_on_its_mig_devices(scene: Scene) -> None:
    """Two A100s, each published as two 3g.40gb MIG devices; three pods each claim one MIG
    device; the GPU two of them are on goes bad: those two go, the third stays, and both MIG
    devices of the bad GPU (not the good GPU's) are tainted."""
    node, backend = await _dra_node(scene, _template(scene, 2, mig={"3g.40gb": 2}))
    claim = workloads.claim_template(TEMPLATE, resourceslices.MIG_DEVICE_CLASS)
    await _deploy(scene, 3, _claimed(scene, 3, resourceslices.MIG_DEVICE_CLASS), claim)
    pods = await _running(scene, 3)
    held = {name: await _held(scene, p) for name, p in pods.items()}
    by_gpu: dict[int, set[str]] = {}
    for name, (device,) in held.items():
        by_gpu.setdefault(int(device.split("/")[1].split("-")[1]), set()).add(name)
    (bad,) = [gpu for gpu, names in by_gpu.items() if len(names) == 2]
    async with h.exporters([node], backends={node: backend}) as ex, scene.controller(ex) as ctl:
        await _taints_active(ctl)
        ex[node].fault(gpu=bad, fault="xid", code=79)
        for name in by_gpu[bad]:
            await h.wait_for_event(scene.core, scene.namespace, name, "GpuPodEvicted")
        (good,) = by_gpu[1 - bad]
        stays = await _running(scene, 1, but=frozenset(by_gpu[bad]))
        assert stays[good]["metadata"]["uid"] == pods[good]["metadata"]["uid"]
        assert not await h.events(scene.core, scene.namespace, good, "GpuPodEvicted")
        mig = [
            f"{node}/{d['name']}"
            for d in resourceslices.devices(node, _template(scene, 2, mig={"3g.40gb": 2}))
        ]
        assert await _rules(scene, node) == sorted(d for d in mig if d.startswith(f"{node}/gpu-{bad}-"))


async def test_a_plain_gpu_request_on_a_dra_node_is_placed_by_the_schedulers_claim(scene: Scene) -> None:
    """Pods asking nvidia.com/gpu on a node whose GPUs only the DRA driver publishes: the
    DeviceClass gpu.nvidia.com backs that extended resource (DRAExtendedResource), so the
    scheduler makes each pod a claim (status.extendedResourceClaimStatus). The pod holding the
    bad GPU goes, the others stay: the controller places them by those claims."""
    node, backend = await _dra_node(scene, _template(scene, 3))
    body = workloads.gpu_deployment(
        APP, replicas=3, limits={nodes.GPU: "1"}, node_selector={h.TEST_LABEL: scene.test_id}
    )
    await _deploy(scene, 3, body, None)
    pods = await _running(scene, 3)
    for p in pods.values():
        (ref,) = pod_claims(p)
        assert ref == ClaimRef(
            scene.namespace, p["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        )
    held = {name: await _held(scene, p) for name, p in pods.items()}
    (victim,) = [name for name, devices in held.items() if devices == (f"{node}/gpu-2",)]
    async with h.exporters([node], backends={node: backend}) as ex, scene.controller(ex):
        ex[node].fault(gpu=2, fault="xid", code=79)
        await h.wait_for_event(scene.core, scene.namespace, victim, "GpuPodEvicted")
        await eventually(lambda: _drained(scene, node), what=f"{node} drained", timeout_seconds=90)
        for name in pods:
            if name != victim:
                assert not await h.events(scene.core, scene.namespace, name, "GpuPodEvicted")


async def _drained(scene: Scene, node: str) -> bool | None:
    labels = (await h.node_obj(scene.core, node))["metadata"].get("labels", {})
    return True if labels.get("gpumon.io/state") == "drained" else None


__all__ = ["Exporter"]
