"""The fleet of the controller scale benchmark, as plain values (pure): node and pod names, the
objects to create, the controller's configuration.

Shared by the signal farm (which serves every node's exporter data and must name the pods on
each GPU as the cluster has them) and by the run that creates the objects.

Every node has 8 whole GPUs and 10 pods: one single-GPU pod per GPU and 2 CPU-only pods (which
the controller's pod cache leaves out, but whose watch events it still receives). The pods are
bare pods bound through ``spec.nodeName``: the scheduler is not needed to place 20,000 of them,
and nothing recreates an evicted one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpumon.devcluster import capi
from gpumon.devcluster.nodes import GPU, NodeTemplate, manifest

GPUS_PER_NODE = 8
CPU_PODS_PER_NODE = 2
NAMESPACE = "bench"  # the bound pods
PENDING_NAMESPACE = "bench-pending"  # the burst that needs new nodes
POOL_NAMESPACE = "capi"
POOL = "bench-pool"
POOL_NODE_SELECTOR = f"{capi.DEPLOYMENT_NAME_LABEL}={POOL}"
CONTROLLER_NAMESPACE = "gpumon-system"  # deploy/rbac/controller.yaml's
IMAGE = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"


def node_name(index: int) -> str:
    return f"gpu-node-{index:04d}"


def node_names(count: int) -> list[str]:
    return [node_name(i) for i in range(count)]


def gpu_pod_name(node: str, gpu: int) -> str:
    return f"{node}-gpu-{gpu}"


def node_manifest(name: str) -> dict[str, Any]:
    return manifest(name, NodeTemplate(gpus=GPUS_PER_NODE))


def _pod(name: str, namespace: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "bench"}},
        # No token volume or service variables: less for the API server to store and serve.
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            **spec,
        },
    }


def _container(gpus: int) -> dict[str, Any]:
    limits = {GPU: str(gpus)} if gpus else {"cpu": "1"}
    return {"name": "cuda", "image": IMAGE, "resources": {"limits": limits, "requests": limits}}


def bound_pods(node: str) -> list[dict[str, Any]]:
    """The node's pods, bound to it: ``gpu_pod_name(node, g)`` holds GPU ``g``."""
    gpu = [
        _pod(gpu_pod_name(node, g), NAMESPACE, {"nodeName": node, "containers": [_container(1)]})
        for g in range(GPUS_PER_NODE)
    ]
    cpu = [
        _pod(f"{node}-cpu-{c}", NAMESPACE, {"nodeName": node, "containers": [_container(0)]})
        for c in range(CPU_PODS_PER_NODE)
    ]
    return gpu + cpu


def pending_pod(index: int) -> dict[str, Any]:
    """A single-GPU pod only the pool's nodes (none yet) may take: the scheduler marks it
    Unschedulable."""
    spec = {"nodeSelector": {capi.DEPLOYMENT_NAME_LABEL: POOL}, "containers": [_container(1)]}
    return _pod(f"burst-{index:04d}", PENDING_NAMESPACE, spec)


def nodes_needed(pending: int) -> int:
    """New pool nodes the pending single-GPU pods need: no fewer, no more."""
    return -(-pending // GPUS_PER_NODE)


def pool_target() -> dict[str, Any]:
    return capi.machine_deployment(POOL, POOL_NAMESPACE, replicas=0)


def controller_config(
    *, kubeconfig: str, farm_url: str, nodes: Sequence[str], max_replicas: int
) -> dict[str, Any]:
    """``gpumon controller``'s configuration: acting, direct signals from the farm (one base URL
    per node, all on one port), one pool; every other knob at its default."""
    return {
        "dry_run": False,
        "kubeconfig": kubeconfig,
        "namespace": CONTROLLER_NAMESPACE,
        "identity": "bench-controller",
        "signals": {
            "source": "direct",
            "direct": {"endpoints": {n: f"{farm_url}/nodes/{n}" for n in nodes}},
        },
        "pools": [
            {
                "name": POOL,
                "target": {"namespace": POOL_NAMESPACE, "name": POOL},
                "node_selector": POOL_NODE_SELECTOR,
                "template": {"resources": {GPU: GPUS_PER_NODE}},
                "max_replicas": max_replicas,
                "max_step": max_replicas,
            }
        ],
    }
