"""GPUs handed out through DRA, drained on the real control plane: a Deployment asks for one
GPU per pod through a ResourceClaimTemplate, the real kube-scheduler allocates each pod's claim
a device of the node's ResourceSlice and binds it, a GPU goes bad, and the controller evicts
exactly the pod whose claim holds a device of that GPU (read from the claims' allocations and
the slice, not from the exporter, which names no pods here). Where the replacement's new claim
lands shows which of gpumon's marks kept it off the bad GPU: the node taint (a pod that does not
tolerate it goes to another node), or the DeviceTaintRule (a pod that tolerates every node
taint comes back to the same node and is given a healthy device)."""

from __future__ import annotations

import json
from typing import Any

import controller_harness as h
from controller_harness import Scene, sa_kubeconfig_for_fixture, scene_fixture  # noqa: F401 - fixtures
from kubernetes_asyncio import client

from gpumon.controller.core.device_taints import MANAGED_BY_LABEL
from gpumon.devcluster import nodes
from gpumon.devcluster.waiting import eventually
from gpumon.dra import NVIDIA_GPU_DRIVER, claim_devices, pod_claims

GROUP, VERSION = "resource.k8s.io", "v1"
APP = "dra-train"
TEMPLATE = "one-gpu"
MERGE_PATCH = "application/merge-patch+json"


def _custom(scene: Scene) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(scene.api)


async def _publish_slice(scene: Scene, node: str, uuids: list[str]) -> None:
    """What NVIDIA's kubelet plugin publishes for ``node``: one pool named after it, GPUs
    ``gpu-<i>`` with ``type``, ``uuid`` and ``productName``."""
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": uuid},
                "productName": {"string": "NVIDIA A100-SXM4-80GB"},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for i, uuid in enumerate(uuids)
    ]
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu"},
        "spec": {
            "driver": NVIDIA_GPU_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
    await _custom(scene).create_cluster_custom_object(GROUP, VERSION, "resourceslices", body)


async def _device_class(scene: Scene) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DeviceClass",
        "metadata": {"name": NVIDIA_GPU_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{NVIDIA_GPU_DRIVER}'"}}]},
    }
    try:
        await _custom(scene).create_cluster_custom_object(GROUP, VERSION, "deviceclasses", body)
    except client.exceptions.ApiException as e:
        if e.status != 409:  # shared by the session's tests
            raise


async def _dra_deployment(scene: Scene, replicas: int, *, tolerate_all: bool = False) -> list[dict[str, Any]]:
    """``replicas`` pods each asking for one GPU through the template, on this test's nodes;
    the pods (JSON, by name) once all Running."""
    template = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE},
        "spec": {
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": NVIDIA_GPU_DRIVER}}]}
            }
        },
    }
    await _custom(scene).create_namespaced_custom_object(
        GROUP, VERSION, scene.namespace, "resourceclaimtemplates", template
    )
    labels = {"app": APP}
    pod_spec: dict[str, Any] = {
        "nodeSelector": {h.TEST_LABEL: scene.test_id},
        "terminationGracePeriodSeconds": 0,
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}],
        "containers": [{"name": "cuda", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
    }
    if tolerate_all:
        pod_spec["tolerations"] = [{"operator": "Exists"}]
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": APP, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    await client.AppsV1Api(scene.api).create_namespaced_deployment(scene.namespace, body)
    return await _running(scene, replicas)


async def _running(scene: Scene, count: int, without: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    async def all_running() -> list[dict[str, Any]] | None:
        pods = [p for p in await _pods(scene) if p["metadata"]["name"] not in without]
        running = [
            p
            for p in pods
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]
        return sorted(running, key=lambda p: p["metadata"]["name"]) if len(running) == count else None

    return await eventually(all_running, what=f"{count} pods of {APP} Running", timeout_seconds=90)


async def _pods(scene: Scene) -> list[dict[str, Any]]:
    resp = await scene.core.list_namespaced_pod(
        scene.namespace, label_selector=f"app={APP}", _preload_content=False
    )
    try:
        return json.loads(await resp.read())["items"]
    finally:
        resp.release()


async def _held(scene: Scene, pod: dict[str, Any]) -> tuple[str, str]:
    """(pool, device) the pod's claim was allocated, read from the claim as the scheduler wrote it."""
    (ref,) = pod_claims(pod)
    obj = await _custom(scene).get_namespaced_custom_object(
        GROUP, VERSION, ref.namespace, "resourceclaims", ref.name
    )
    (device,) = claim_devices(obj)
    return device.ref.pool, device.ref.device


async def _dra_nodes(scene: Scene, count: int) -> list[str]:
    return await scene.make_nodes(count, nodes.NodeTemplate(gpus=0, labels={h.TEST_LABEL: scene.test_id}))


async def test_a_fault_evicts_exactly_the_pod_whose_claim_holds_the_gpu_and_the_node_taint_moves_it(
    scene: Scene,
) -> None:
    """Three pods on node A's three GPUs; GPU 1 goes bad: the pod holding gpu-1 is evicted, the
    other two keep their uid and node; the replacement (no toleration) is kept off A by the node
    taint and its new claim gets B's healthy GPU."""
    await _device_class(scene)
    (node_a,) = await _dra_nodes(scene, 1)
    async with h.exporters([node_a], gpus=3) as ex:
        await _publish_slice(scene, node_a, [ex[node_a].uuid(i) for i in range(3)])
        pods = await _dra_deployment(scene, 3)
        held = {p["metadata"]["name"]: await _held(scene, p) for p in pods}
        assert sorted(held.values()) == [(node_a, f"gpu-{i}") for i in range(3)]
        victim = next(name for name, (_, device) in held.items() if device == "gpu-1")
        stay = {p["metadata"]["name"]: p for p in pods if p["metadata"]["name"] != victim}
        (node_b,) = await _dra_nodes(scene, 1)
        await _publish_slice(scene, node_b, ["GPU-b0000000-0000-0000-0000-000000000000"])
        async with scene.controller(ex):
            ex[node_a].fault(gpu=1, fault="xid", code=79)
            await h.wait_for_event(scene.core, scene.namespace, victim, "GpuPodEvicted")
            now = await _running(scene, 3)
            names = {p["metadata"]["name"]: p for p in now}
            assert victim not in names
            for name, before in stay.items():
                assert names[name]["metadata"]["uid"] == before["metadata"]["uid"]
                assert names[name]["spec"]["nodeName"] == node_a
            (replacement,) = [p for n, p in names.items() if n not in stay]
            assert replacement["spec"]["nodeName"] == node_b
            assert await _held(scene, replacement) == (node_b, "gpu-0")
            for name in stay:
                assert not await h.events(scene.core, scene.namespace, name, "GpuPodEvicted")


async def test_a_replacement_tolerating_the_node_taint_gets_a_healthy_device_through_the_device_taint(
    scene: Scene,
) -> None:
    """Pods tolerating every node taint: after the eviction the replacement comes back to the
    same node, where the freed device of the bad GPU is the first free one; the DeviceTaintRules
    gpumon wrote for that GPU make the scheduler give it the healthy free GPU instead."""
    await _device_class(scene)
    (node,) = await _dra_nodes(scene, 1)
    async with h.exporters([node], gpus=4) as ex:
        await _publish_slice(scene, node, [ex[node].uuid(i) for i in range(4)])
        pods = await _dra_deployment(scene, 3, tolerate_all=True)
        held = {p["metadata"]["name"]: await _held(scene, p) for p in pods}
        assert sorted(d for _, d in held.values()) == ["gpu-0", "gpu-1", "gpu-2"]
        victim = next(name for name, (_, device) in held.items() if device == "gpu-0")
        async with scene.controller(ex) as ctl:
            registry = ctl.controller.metrics.registry

            async def discovered() -> bool | None:
                state = registry.get_sample_value("gpumon_controller_device_taints", {"state": "active"})
                return True if state == 1 else None

            await eventually(discovered, what="DeviceTaintRules found served")
            ex[node].fault(gpu=0, fault="xid", code=79)
            await h.wait_for_event(scene.core, scene.namespace, victim, "GpuPodEvicted")
            rules = await _custom(scene).list_cluster_custom_object(
                GROUP, "v1beta2", "devicetaintrules", label_selector=f"{MANAGED_BY_LABEL}=gpumon"
            )
            tainted = [r["spec"]["deviceSelector"]["device"] for r in rules["items"]]
            assert tainted == ["gpu-0"]
            now = await _running(scene, 3, without=frozenset({victim}))
            (replacement,) = [p for p in now if p["metadata"]["name"] not in held]
            assert replacement["spec"]["nodeName"] == node
            assert await _held(scene, replacement) == (node, "gpu-3")
