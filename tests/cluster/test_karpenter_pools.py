"""gpumon beside Karpenter v1.15.0 (its own controllers, the kwok cloud provider) on the real
control plane: a gpumon pool whose nodes Karpenter launched is refused, as a pool that
cluster-autoscaler manages is; a Karpenter node gpumon quarantines is held from Karpenter's
consolidation until gpumon lifts the quarantine."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (  # noqa: F401 - fixtures
    TEST_LABEL,
    Exporter,
    KubeconfigFactory,
    Running,
    controller_config,
    exporters,
    fresh_signals,
    node_obj,
    running,
    running_pods,
    sa_kubeconfig_for_fixture,
    tainted,
    wait_for_event,
)
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpumon.controller.core import contract as c
from gpumon.controller.core.node_owner import NodeOwner, node_owner
from gpumon.devcluster import capi, karpenter, nodes
from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.waiting import NotReached, eventually

TAINT_KEY = "test.gpumon.io/karpenter"


@pytest.fixture
async def node_pool(
    api: client.ApiClient, test_id: str, karpenter_instance_types: tuple[karpenter.InstanceType, ...]
) -> AsyncIterator[str]:
    """A NodePool of the session's 8-GPU instance type, its Nodes labelled with the test's id
    and tainted with it, so that no other test's pending pod makes Karpenter launch here."""
    custom = client.CustomObjectsApi(api)
    body = karpenter.node_pool(
        test_id,
        [t.name for t in karpenter_instance_types],
        labels={TEST_LABEL: test_id},
        taints=[{"key": TAINT_KEY, "value": test_id, "effect": "NoSchedule"}],
    )
    await custom.create_cluster_custom_object(karpenter.GROUP, karpenter.VERSION, karpenter.NODE_POOLS, body)
    yield test_id
    await custom.delete_cluster_custom_object(
        karpenter.GROUP, karpenter.VERSION, karpenter.NODE_POOLS, test_id
    )
    # Karpenter removes a deleted pool's nodes in the background; a later test's scheduler would
    # still count them (tainted ones as "untolerated taint" before any node selector is looked at).
    core = client.CoreV1Api(api)

    async def nodes_gone() -> bool | None:
        left = await core.list_node(label_selector=f"{TEST_LABEL}={test_id}")
        return True if not left.items else None

    await eventually(nodes_gone, what=f"NodePool {test_id}'s nodes removed", timeout_seconds=120)


def gpu_pod(name: str, test_id: str, limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": "train"}},
        "spec": {
            "nodeSelector": {TEST_LABEL: test_id},
            "tolerations": [
                {"key": TAINT_KEY, "operator": "Equal", "value": test_id, "effect": "NoSchedule"}
            ],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "cuda", "image": "cuda:12", "resources": {"limits": limits or {nodes.GPU: "8"}}}
            ],
        },
    }


def gpu_deployment(test_id: str) -> dict[str, Any]:
    """One pod ``train`` asking for a GPU on the test's NodePool, put back wherever it can run."""
    template = gpu_pod("train", test_id, {nodes.GPU: "1"})
    return {
        "metadata": {"name": "train"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "train"}},
            "template": {"metadata": template["metadata"], "spec": template["spec"]},
        },
    }


async def test_a_pool_of_karpenter_nodes_is_refused_and_never_scaled(
    api: client.ApiClient,
    namespace: str,
    test_id: str,
    node_pool: str,
    sa_kubeconfig_for: KubeconfigFactory,
) -> None:
    """Karpenter launches a node for a pending 8-GPU pod. A gpumon pool that selects that
    NodePool's nodes (its target a MachineDeployment nothing reconciles) is refused: the
    GpuPoolRefused Event names Karpenter's NodePool, gpumon_autoscaler_pool_refused is 1, and
    with a second pod pending the target's replicas stay 0 while Karpenter serves it."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    await core.create_namespaced_pod(namespace, gpu_pod("first", test_id))

    async def running_pods(count: int) -> list[str] | None:
        pods = (await core.list_namespaced_pod(namespace, label_selector="app=train")).items
        up = [p.spec.node_name for p in pods if p.status.phase == "Running"]
        return up if len(up) == count else None

    (launched,) = await eventually(
        lambda: running_pods(1), what="Karpenter's node running the pod", timeout_seconds=90
    )
    node = await node_obj(core, launched)
    assert node["metadata"]["labels"][karpenter.NODEPOOL_LABEL] == node_pool
    # What a repair's replacement step deletes: the NodeClaim that owns the Node.
    owner = node_owner(node)
    assert owner is not None and (owner.machinery, owner.kind) == ("karpenter", "NodeClaim")

    async def claimed_node() -> str | None:
        claim = await custom.get_cluster_custom_object(
            karpenter.GROUP, karpenter.VERSION, karpenter.NODE_CLAIMS, owner.name
        )
        return (claim.get("status") or {}).get("nodeName")  # written once the Node registered

    assert await eventually(claimed_node, what="the NodeClaim naming its Node") == launched

    md = capi.machine_deployment(test_id, namespace, replicas=0)
    await custom.create_namespaced_custom_object(
        capi.GROUP, capi.VERSION, namespace, capi.MACHINE_DEPLOYMENTS, md
    )
    pool = {
        "name": "gpu",
        "target": {"namespace": namespace, "name": test_id},
        "node_selector": f"{karpenter.NODEPOOL_LABEL}={node_pool}",
        "template": {
            "resources": {nodes.GPU: 8},
            "labels": {TEST_LABEL: test_id},
            "taints": [{"key": TAINT_KEY, "value": test_id, "effect": "NoSchedule"}],
        },
        "max_replicas": 4,
    }
    kubeconfig: Path = await sa_kubeconfig_for(autoscaling=True)
    cfg = controller_config(
        kubeconfig=kubeconfig, namespace=namespace, test_id=test_id, endpoints={}, pools=[pool]
    )
    async with running(cfg) as ctl:
        event = await wait_for_event(core, namespace, test_id, "GpuPoolRefused")
        assert (
            f"NodePool {node_pool}" in event.message
            and "never scales what Karpenter manages" in event.message
        )
        metrics = ctl.controller.autoscaler.metrics  # type: ignore[union-attr]
        assert metrics.refused.labels("gpu")._value.get() == 1
        await core.create_namespaced_pod(namespace, gpu_pod("second", test_id))
        await eventually(lambda: running_pods(2), what="Karpenter serving the second pod", timeout_seconds=90)
        scale = await custom.get_namespaced_custom_object_scale(
            capi.GROUP, capi.VERSION, namespace, capi.MACHINE_DEPLOYMENTS, test_id
        )
        assert scale["spec"].get("replicas", 0) == 0


async def test_karpenter_launches_the_instance_type_each_gpu_request_needs(
    api: client.ApiClient, devcluster: DevCluster, namespace: str, test_id: str, node_pool: str
) -> None:
    """Whole GPUs, gpushare memory and a MIG profile: Karpenter fits each pending pod to the one
    instance type that offers its resource (it packs extended resources per node; it knows
    nothing of gpushare's per-card limit)."""
    core = client.CoreV1Api(api)
    wanted = {
        "whole": ({nodes.GPU: "8"}, "gpu-8x-a100"),
        "share": ({nodes.SHARED_GPU_MEMORY: "12"}, "share-4x-t4"),
        "mig": ({"nvidia.com/mig-3g.40gb": "3"}, "mig-2x-a100"),
    }
    for name, (limits, _) in wanted.items():
        await core.create_namespaced_pod(namespace, gpu_pod(name, test_id, limits))

    custom = client.CustomObjectsApi(api)
    last: dict[str, object] = {}

    async def all_running() -> dict[str, str] | None:
        pods = (await core.list_namespaced_pod(namespace, label_selector="app=train")).items
        up = {p.metadata.name: p.spec.node_name for p in pods if p.status.phase == "Running"}
        if len(up) == len(wanted):
            return up
        last["pods"] = {p.metadata.name: (p.status.phase, p.spec.node_name) for p in pods}
        claims = await custom.list_cluster_custom_object(
            karpenter.GROUP,
            karpenter.VERSION,
            karpenter.NODE_CLAIMS,
            label_selector=f"{karpenter.NODEPOOL_LABEL}={node_pool}",
        )
        last["claims"] = {
            c["metadata"]["name"]: (
                c["metadata"].get("labels", {}).get("node.kubernetes.io/instance-type"),
                (c.get("status") or {}).get("nodeName"),
                [
                    f"{k['type']}={k['status']}:{k.get('reason', '')}"
                    for k in (c.get("status") or {}).get("conditions") or ()
                    if k.get("status") != "True"
                ],
            )
            for c in claims["items"]
        }
        return None

    def seen() -> dict[str, object]:
        # What Karpenter said of this test's pods and NodePool (CI once timed out here, 1 in 2,191).
        log = (devcluster.layout.logs / "karpenter.log").read_text(errors="replace").splitlines()
        said = [line[:300] for line in log if namespace in line or node_pool in line]
        return {**last, "karpenter": said[-12:]}

    placed = await eventually(
        all_running, what="each pod Running on a Karpenter node", timeout_seconds=120, seen=seen
    )
    for name, (_, instance_type) in wanted.items():
        node = await node_obj(core, placed[name])
        assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] == instance_type, name


async def deployment_on_a_karpenter_node(
    api: client.ApiClient, namespace: str, test_id: str
) -> tuple[client.V1Pod, NodeOwner]:
    """The one pod of the test's Deployment (a GPU) Running on a node Karpenter launched, and that
    node's NodeClaim."""
    core = client.CoreV1Api(api)
    await client.AppsV1Api(api).create_namespaced_deployment(namespace, gpu_deployment(test_id))

    async def one_running() -> client.V1Pod | None:
        pods = await running_pods(core, namespace, "train")
        return pods[0] if len(pods) == 1 else None

    pod = await eventually(one_running, what="the pod Running on a Karpenter node", timeout_seconds=90)
    owner = node_owner(await node_obj(core, pod.spec.node_name))
    assert owner is not None and (owner.machinery, owner.kind) == ("karpenter", "NodeClaim")
    return pod, owner


async def moved_off(core: client.CoreV1Api, namespace: str, node: str) -> client.V1Pod | None:
    """The Deployment's one pod, once it runs on another node than ``node``."""
    pods = await running_pods(core, namespace, "train")
    return pods[0] if len(pods) == 1 and pods[0].spec.node_name != node else None


@contextlib.asynccontextmanager
async def quarantined(
    api: client.ApiClient, pod: client.V1Pod, test_id: str, kubeconfig: Path
) -> AsyncIterator[tuple[Running, Exporter, dict[str, Any]]]:
    """The pod's node's exporter (the pod on its GPU 0) and gpumon's controller, once that GPU
    overheated and gpumon quarantined the node, ``karpenter.sh/do-not-disrupt`` in the same
    patch. Yields the running controller, the node's exporter and the quarantined node."""
    core, node = client.CoreV1Api(api), pod.spec.node_name
    rules = [{"name": "thermal-unhealthy", "for": 0, "recoverAfter": 2}]
    async with exporters([node]) as ex:
        ex[node].placement.pods[0] = (pod.metadata.namespace, pod.metadata.name)
        cfg = controller_config(
            kubeconfig=kubeconfig,
            namespace=pod.metadata.namespace,
            test_id=test_id,
            endpoints={node: ex[node].url},
            policy={"rules": rules},
        )
        async with running(cfg) as ctl:
            await eventually(lambda: fresh_signals(ctl, 1), what="fresh signals from the exporter")
            ex[node].fault(gpu=0, fault="overheat", celsius=98)
            held = await eventually(lambda: tainted(core, node), what="the Karpenter node quarantined")
            assert held["metadata"]["annotations"][c.KARPENTER_DO_NOT_DISRUPT_ANNOTATION] == "true"
            yield ctl, ex[node], held


# Measured on this control plane without the hold: Karpenter's consolidation began deleting the
# drained, empty quarantined node 20-22 s after the fault (NodePool defaults: consolidateAfter 0s).
CONSOLIDATION_SECONDS = 22.0


async def test_a_quarantined_karpenter_node_is_held_from_consolidation_until_recovery(
    api: client.ApiClient,
    namespace: str,
    test_id: str,
    node_pool: str,
    sa_kubeconfig_for: KubeconfigFactory,
) -> None:
    """A Deployment's pod on a Karpenter node whose GPU overheats: gpumon quarantines the node
    (with karpenter.sh/do-not-disrupt in the same patch) and evicts the pod; Karpenter launches a
    node for the replacement. For twice the time consolidation took without the hold, the
    quarantined node keeps existing with gpumon's record, its NodeClaim is not deleted, and the
    replacement stays where it is (nothing is consolidated back onto the quarantined node).
    Recovery takes the hold off."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    first, owner = await deployment_on_a_karpenter_node(api, namespace, test_id)
    bad = first.spec.node_name
    async with quarantined(api, first, test_id, await sa_kubeconfig_for()) as (_, exporter, _):
        replacement = await eventually(
            lambda: moved_off(core, namespace, bad),
            what="the evicted pod Running on a new Karpenter node",
            timeout_seconds=90,
        )
        assert (await node_obj(core, replacement.spec.node_name))["metadata"]["labels"][
            karpenter.NODEPOOL_LABEL
        ] == node_pool

        async def disrupted() -> str | None:
            """What Karpenter did against the quarantine, if anything."""
            try:
                held = await node_obj(core, bad)
                claim = await custom.get_cluster_custom_object(
                    karpenter.GROUP, karpenter.VERSION, karpenter.NODE_CLAIMS, owner.name
                )
            except ApiException as e:
                return f"the quarantined node or its NodeClaim is gone ({e.status})"
            if held["metadata"].get("deletionTimestamp") or claim["metadata"].get("deletionTimestamp"):
                return "the quarantined node is being deleted"
            if c.ANNOTATION_UNHEALTHY_GPUS not in held["metadata"].get("annotations", {}):
                return "gpumon's record is gone"
            now = await running_pods(core, namespace, "train")
            if [(p.metadata.uid, p.spec.node_name) for p in now] != [
                (replacement.metadata.uid, replacement.spec.node_name)
            ]:
                return f"the workload moved: {[(p.metadata.name, p.spec.node_name) for p in now]}"
            return None

        try:
            window = 2 * CONSOLIDATION_SECONDS
            broke = await eventually(disrupted, what="a disruption", timeout_seconds=window)
        except NotReached:
            broke = None
        assert broke is None, broke

        exporter.fault(gpu=0, fault="clear")
        await wait_for_event(core, "default", bad, "GpuRecovered")
        annotations = (await node_obj(core, bad))["metadata"].get("annotations", {})
        assert c.KARPENTER_DO_NOT_DISRUPT_ANNOTATION not in annotations
        assert c.ANNOTATION_DO_NOT_DISRUPT_PREEXISTING not in annotations
