"""GPUs handed out through DRA on the local control plane: kwok nodes whose devices the test
driver (gpumon.devcluster.resourceslices) published in ResourceSlices, claims made from a
ResourceClaimTemplate by the real resourceclaim controller and allocated by the real
kube-scheduler, and the node's pod-resources fixture serving each pod the device its claim got."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
from capi_pools import PoolFactory
from kubernetes_asyncio import client

from gpumon.devcluster import nodes, podresources_server, resourceslices, workloads
from gpumon.devcluster.nodemaker import NodeMaker
from gpumon.devcluster.nodes import POOL_LABEL
from gpumon.devcluster.waiting import eventually
from gpumon.exporter.podresources import api_pb2, api_pb2_grpc
from gpumon.k8s import dra
from gpumon.kube.client import KubeClient

TEST_LABEL = "test.gpumon.io/id"


def dra_nodes(test_id: str, gpus: int, **template: Any) -> nodes.NodeTemplate:
    return nodes.NodeTemplate(gpus=gpus, dra=True, labels={TEST_LABEL: test_id}, **template)


async def _json(api: client.ApiClient, objects: Sequence[Any]) -> list[dict[str, Any]]:
    return [api.sanitize_for_serialization(o) for o in objects]


async def _placed(
    api: client.ApiClient, namespace: str, app: str, count: int
) -> tuple[list[dict[str, Any]], dict[dra.ClaimRef, dict[str, Any]]] | None:
    """The app's pods once ``count`` are bound and each one's claim is allocated, with the claims."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    pods = await _json(api, (await core.list_namespaced_pod(namespace, label_selector=f"app={app}")).items)
    claims = {
        dra.ClaimRef(namespace, c["metadata"]["name"]): c
        for c in await _json(api, (await resource.list_namespaced_resource_claim(namespace)).items)
    }
    bound = [p for p in pods if p["spec"].get("nodeName")]
    allocated = [
        p
        for p in bound
        if (refs := dra.pod_claims(p)) and all(dra.claim_devices(claims.get(r, {})) for r in refs)
    ]
    return (allocated, claims) if len(allocated) == count else None


async def _pending_reason(api: client.ApiClient, namespace: str, app: str) -> str | None:
    """The scheduler's message on the app's one unschedulable pod."""
    pods = (await client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"app={app}")).items
    for p in pods:
        for c in (p.status and p.status.conditions) or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return str(c.message)
    return None


def _listed(socket: Path) -> dict[str, api_pb2.PodResources]:
    """What the node's pod-resources endpoint lists, over real gRPC, by pod name."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        answer = api_pb2_grpc.PodResourcesListerStub(channel).List(
            api_pb2.ListPodResourcesRequest(), timeout=10
        )
    return {p.name: p for p in answer.pod_resources}


async def _check_pod_resources(
    kube: KubeClient,
    node: str,
    pods: Sequence[dict[str, Any]],
    claims: dict[dra.ClaimRef, dict[str, Any]],
    tmp_path: Path,
) -> None:
    """The node's fixture serves each of its pods the device the scheduler allocated to it."""
    fixture = podresources_server.PodResourcesFixture()
    fixture.pods = tuple(await podresources_server.node_pods(kube, node))
    with podresources_server.serve(tmp_path / f"{node[-12:]}.sock", fixture) as served:
        listed = _listed(tmp_path / f"{node[-12:]}.sock")
        assert served is fixture
    mine = [p for p in pods if p["spec"]["nodeName"] == node]
    assert set(listed) == {p["metadata"]["name"] for p in mine}
    for p in mine:
        [ref] = dra.pod_claims(p)
        claim = claims[ref]
        [allocated] = dra.claim_devices(claim)
        [container] = listed[p["metadata"]["name"]].containers
        assert container.name == "cuda" and not container.devices
        [dynamic] = container.dynamic_resources
        assert (dynamic.claim_namespace, dynamic.claim_name) == (ref.namespace, ref.name)
        [resource] = dynamic.claim_resources
        assert dra.DeviceRef(resource.driver_name, resource.pool_name, resource.device_name) == allocated.ref
        assert not resource.HasField("share_id")
        assert [c.name for c in resource.cdi_devices] == [
            f"k8s.gpu.nvidia.com/claim={claim['metadata']['uid']}-{allocated.ref.device}"
        ]


async def test_dra_deployment_gets_a_distinct_whole_gpu_per_pod_and_kubelet_serves_it(
    api: client.ApiClient,
    kube: KubeClient,
    namespace: str,
    make_nodes: NodeMaker,
    test_id: str,
    tmp_path: Path,
) -> None:
    names = await make_nodes(2, dra_nodes(test_id, 2))
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    for name in names:  # DRA-only: no device plugin resource
        node = await core.read_node(name)
        assert not any(k.startswith("nvidia.com/") for k in node.status.allocatable), node.status.allocatable
    slices = [s for s in (await resource.list_resource_slice()).items if s.spec.node_name in names]
    assert sorted((s.spec.driver, s.spec.pool.name, len(s.spec.devices)) for s in slices) == [
        (dra.NVIDIA_GPU_DRIVER, n, 2) for n in sorted(names)
    ]
    published = {d.ref: d for s in slices for d in dra.slice_devices(api.sanitize_for_serialization(s))}

    await resource.create_namespaced_resource_claim_template(
        namespace, workloads.claim_template("one-gpu", resourceslices.GPU_DEVICE_CLASS)
    )
    deployment = workloads.dra_deployment(
        "train", replicas=3, claim_template_name="one-gpu", node_selector={TEST_LABEL: test_id}
    )
    await client.AppsV1Api(api).create_namespaced_deployment(namespace, deployment)
    pods, claims = await eventually(
        lambda: _placed(api, namespace, "train", 3), what="3 DRA pods bound, each claim allocated"
    )

    devices = []
    for p in pods:
        [ref] = dra.pod_claims(p)
        [allocated] = dra.claim_devices(claims[ref])
        # The device is on the node the pod was bound to, and it is a whole GPU the driver published.
        assert allocated.ref.pool == p["spec"]["nodeName"]
        assert published[allocated.ref].kind == dra.GPU_TYPE and published[allocated.ref].uuid
        reserved = [r["name"] for r in claims[ref]["status"].get("reservedFor", [])]
        assert reserved == [p["metadata"]["name"]]
        devices.append(allocated.ref)
    assert len(set(devices)) == 3, devices
    for name in names:
        await _check_pod_resources(kube, name, pods, claims, tmp_path)


async def test_mig_claims_get_the_profile_they_select_and_the_rest_stays_pending(
    api: client.ApiClient,
    kube: KubeClient,
    namespace: str,
    make_nodes: NodeMaker,
    test_id: str,
    tmp_path: Path,
) -> None:
    # One GPU in MIG mode: two 3g.40gb and one 1g.10gb instance, no whole GPU to hand out.
    [name] = await make_nodes(1, dra_nodes(test_id, 1, mig={"3g.40gb": 1, "1g.10gb": 2}))
    resource = client.ResourceV1Api(api)
    [published] = [
        dra.slice_devices(api.sanitize_for_serialization(s))
        for s in (await resource.list_resource_slice()).items
        if s.spec.node_name == name
    ]
    assert sorted((d.kind, d.profile) for d in published) == [
        ("mig", "1g.10gb"),
        ("mig", "1g.10gb"),
        ("mig", "3g.40gb"),
    ]
    by_ref = {d.ref: d for d in published}

    selector = f"device.attributes['{dra.NVIDIA_GPU_DRIVER}'].profile == '1g.10gb'"
    await resource.create_namespaced_resource_claim_template(
        namespace,
        workloads.claim_template("small-mig", resourceslices.MIG_DEVICE_CLASS, selectors=[selector]),
    )
    deployment = workloads.dra_deployment(
        "infer", replicas=3, claim_template_name="small-mig", node_selector={TEST_LABEL: test_id}
    )
    await client.AppsV1Api(api).create_namespaced_deployment(namespace, deployment)
    pods, claims = await eventually(
        lambda: _placed(api, namespace, "infer", 2), what="2 MIG pods bound, each claim allocated"
    )
    got = [by_ref[dra.claim_devices(claims[dra.pod_claims(p)[0]])[0].ref] for p in pods]
    assert sorted(d.profile or "" for d in got) == ["1g.10gb", "1g.10gb"]
    assert len({d.uuid for d in got}) == 2 and {d.card_uuid for d in got} == {published[0].card_uuid}
    await _check_pod_resources(kube, name, pods, claims, tmp_path)

    # The third pod asks for a third 1g.10gb the node does not have (the 3g.40gb does not match):
    # the real scheduler leaves it Pending and says why.
    reason = await eventually(
        lambda: _pending_reason(api, namespace, "infer"), what="the third MIG pod Unschedulable"
    )
    assert "cannot allocate all claims" in reason, reason


async def test_a_dra_pool_node_publishes_its_slice_when_its_gpus_come_up_and_takes_it_along(
    api: client.ApiClient, namespace: str, test_id: str, capi_pool: PoolFactory
) -> None:
    """A Cluster API pool of DRA nodes (Cluster API's own controllers, the kwok infrastructure
    provider making the Nodes): a new Machine's Node joins first and its driver publishes the
    devices 1.5 s later; scaled to zero, Cluster API deletes the Node and the garbage collector
    its slice."""
    resource = client.ResourceV1Api(api)
    pool = await capi_pool(
        replicas=0,
        template=dra_nodes(test_id, 2, product="NVIDIA-H100-80GB-HBM3"),
        devices_after_seconds=1.5,
    )
    await resource.create_namespaced_resource_claim_template(
        namespace, workloads.claim_template("one-h100", resourceslices.GPU_DEVICE_CLASS)
    )
    deployment = workloads.dra_deployment(
        "train", replicas=2, claim_template_name="one-h100", node_selector={TEST_LABEL: test_id}
    )
    await client.AppsV1Api(api).create_namespaced_deployment(namespace, deployment)

    async def pool_slices() -> list[Any]:
        return list((await resource.list_resource_slice(label_selector=f"{POOL_LABEL}={pool.name}")).items)

    async def joined_without_slice() -> str | None:
        listed = await pool.all_nodes()
        return listed[0]["metadata"]["name"] if listed and not await pool_slices() else None

    await pool.set_replicas(1)
    # The node joins first, its driver publishes the devices a GPU delay later.
    name = await eventually(joined_without_slice, what="a pool node joined, no slice yet", timeout_seconds=60)
    pods, _ = await eventually(
        lambda: _placed(api, namespace, "train", 2),
        what="both pods placed on the new pool node",
        timeout_seconds=60,
    )
    assert {p["spec"]["nodeName"] for p in pods} == {name}
    [published] = await pool_slices()
    assert published.spec.node_name == name and published.metadata.owner_references[0].name == name
    products = {
        d.attribute(dra.PRODUCT_NAME_ATTRIBUTE)
        for d in dra.slice_devices(api.sanitize_for_serialization(published))
    }
    assert products == {"NVIDIA H100-80GB-HBM3"}
    await client.AppsV1Api(api).delete_namespaced_deployment("train", namespace)
    await pool.set_replicas(0)
    # Cluster API deletes the Machine and its Node, and the garbage collector takes the slice.
    await eventually(
        lambda: _none_left(pool_slices),
        what="the deleted pool node's slice garbage-collected",
        timeout_seconds=90,
    )
    assert await pool.all_nodes() == []


async def _none_left(listing: Any) -> bool | None:
    return True if not await listing() else None


async def test_a_plain_nvidia_gpu_request_is_allocated_from_a_dra_node_and_served(
    api: client.ApiClient, kube: KubeClient, namespace: str, make_nodes: NodeMaker, test_id: str
) -> None:
    # DRAExtendedResource (beta, on in 1.36) with gpu.nvidia.com's extendedResourceName: the
    # scheduler satisfies nvidia.com/gpu from the DRA-only node's slice through a claim it makes.
    [name] = await make_nodes(1, dra_nodes(test_id, 1))
    core = client.CoreV1Api(api)
    body = workloads.gpu_deployment(
        "legacy", replicas=1, limits={nodes.GPU: "1"}, node_selector={TEST_LABEL: test_id}
    )
    await client.AppsV1Api(api).create_namespaced_deployment(namespace, body)

    async def claimed() -> dict[str, Any] | None:
        pods = await _json(
            api, (await core.list_namespaced_pod(namespace, label_selector="app=legacy")).items
        )
        # The scheduler writes the claim status before it binds the pod: wait for both.
        return next(
            (
                p
                for p in pods
                if (p.get("status") or {}).get("extendedResourceClaimStatus") and p["spec"].get("nodeName")
            ),
            None,
        )

    pod = await eventually(claimed, what="the scheduler's claim for the pod's nvidia.com/gpu, and its node")
    assert pod["spec"]["nodeName"] == name
    [ref] = dra.pod_claims(pod)

    async def served() -> list[api_pb2.PodResources] | None:
        listed = await podresources_server.node_pods(kube, name)
        return (
            listed if listed and listed[0].containers and listed[0].containers[0].dynamic_resources else None
        )

    [listed] = await eventually(served, what="the pod's DRA device in the node's pod-resources")
    [dynamic] = listed.containers[0].dynamic_resources
    assert (dynamic.claim_namespace, dynamic.claim_name) == (ref.namespace, ref.name)
    assert [(r.pool_name, r.device_name) for r in dynamic.claim_resources] == [(name, "gpu-0")]


async def test_a_device_taint_rule_keeps_new_claims_off_the_device(
    api: client.ApiClient, namespace: str, make_nodes: NodeMaker, test_id: str
) -> None:
    # The DRADeviceTaintRules gate at work in the two components that act on rules: the
    # scheduler does not allocate the tainted device, KCM's device-taint-eviction controller
    # writes the rule's status (docs/devcluster.md, "Dynamic Resource Allocation").
    [name] = await make_nodes(1, dra_nodes(test_id, 2))
    rules = client.ResourceV1beta2Api(api)
    rule = {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": test_id},
        "spec": {
            "deviceSelector": {"driver": dra.NVIDIA_GPU_DRIVER, "pool": name, "device": "gpu-0"},
            "taint": {"key": "gpumon.io/gpu-unhealthy", "value": "XidFatal", "effect": "NoSchedule"},
        },
    }
    await rules.create_device_taint_rule(rule)
    try:

        async def rule_status() -> str | None:
            conditions = (await rules.read_device_taint_rule(test_id)).status
            found = [
                c for c in (conditions and conditions.conditions) or [] if c.type == "EvictionInProgress"
            ]
            return found[0].reason if found else None

        # v1.36.3 says "OtherEffect" for any effect but NoExecute: it evicts nothing for them.
        assert await eventually(rule_status, what="KCM's status on the rule") == "OtherEffect"
        await client.ResourceV1Api(api).create_namespaced_resource_claim_template(
            namespace, workloads.claim_template("one-gpu", resourceslices.GPU_DEVICE_CLASS)
        )
        deployment = workloads.dra_deployment(
            "train", replicas=2, claim_template_name="one-gpu", node_selector={TEST_LABEL: test_id}
        )
        await client.AppsV1Api(api).create_namespaced_deployment(namespace, deployment)
        pods, claims = await eventually(lambda: _placed(api, namespace, "train", 1), what="one pod placed")
        [allocated] = dra.claim_devices(claims[dra.pod_claims(pods[0])[0]])
        assert allocated.ref == dra.DeviceRef(dra.NVIDIA_GPU_DRIVER, name, "gpu-1")
        reason = await eventually(
            lambda: _pending_reason(api, namespace, "train"), what="the second pod Pending"
        )
        assert "cannot allocate all claims" in reason, reason
    finally:
        await rules.delete_device_taint_rule(test_id)
