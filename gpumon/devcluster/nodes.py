"""Node manifests for kwok-simulated GPU nodes, built from templates. Pure.

A node carries what the GPU Operator, NFD and a device plugin would put on a real one: the
``nvidia.com/gpu`` extended resource (or the shared-GPU resources of Alibaba's gpushare/cGPU
device plugins, the MIG profiles of NVIDIA's plugin in its mixed strategy, or on a Windows node
the ``windows.alibabacloud.com/directx`` of Alibaba's DirectX plugin), the ``nvidia.com/gpu.*``
and NFD PCI labels, and the kwok annotation that makes kwok act as its kubelet."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpumon.devcluster.components import KWOK_NODE_ANNOTATION, KWOK_NODE_ANNOTATION_VALUE
from gpumon.k8s.resources import DIRECTX_RESOURCE, NVIDIA_MIG_PREFIX

# On a pool's Nodes (through its machine template): the pool's name, what a gpumon pool's
# node_selector picks in the tests, the demo and the benchmarks.
POOL_LABEL = "devcluster.gpumon.io/pool"

GPU = "nvidia.com/gpu"
SHARED_GPU_MEMORY = "aliyun.com/gpu-mem"  # GiB, summed over the node's GPUs
SHARED_GPU_COUNT = "aliyun.com/gpu-count"
SHARED_GPU_CORE = "aliyun.com/gpu-core.percentage"  # 100 per GPU
MAX_GPUS = 8
KUBELET_VERSION = "v1.36.3"


@dataclass(frozen=True)
class SharedGpus:
    """GPUs split by memory and core share instead of handed out whole."""

    gpus: int
    memory_gib_per_gpu: int

    def __post_init__(self) -> None:
        if not 1 <= self.gpus <= MAX_GPUS:
            raise ValueError(f"shared gpus must be 1..{MAX_GPUS}, got {self.gpus}")
        if self.memory_gib_per_gpu < 1:
            raise ValueError(f"memory_gib_per_gpu must be >= 1, got {self.memory_gib_per_gpu}")


@dataclass(frozen=True)
class NodeTemplate:
    gpus: int = MAX_GPUS  # whole GPUs (nvidia.com/gpu); 0 with `shared`, or for a CPU-only node
    shared: SharedGpus | None = None
    product: str = "NVIDIA-A100-SXM4-80GB"
    # A Windows GPU node offers its GPUs through DirectX (one unit per GPU), not nvidia.com/gpu.
    os: Literal["linux", "windows"] = "linux"
    # MIG instances per GPU by profile ("1g.10gb": 7): every GPU is partitioned alike and offered
    # only as nvidia.com/mig-<profile>, as NVIDIA's device plugin does with MIG_STRATEGY=mixed.
    mig: Mapping[str, int] = field(default_factory=dict)
    # The GPUs (or, with `mig`, their MIG devices) are handed out by NVIDIA's DRA driver: the
    # node publishes them in a ResourceSlice (gpumon.devcluster.resourceslices) and offers no
    # nvidia.com/gpu or nvidia.com/mig-* resource, as a node without the device plugin does.
    dra: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)  # pool labels and the like
    taints: tuple[Mapping[str, str], ...] = ()
    cpu: str = "96"
    memory: str = "1Ti"
    pods: str = "110"

    def __post_init__(self) -> None:
        if not 0 <= self.gpus <= MAX_GPUS:
            raise ValueError(f"gpus must be 0..{MAX_GPUS}, got {self.gpus}")
        if self.gpus and self.shared:
            raise ValueError("a node template has whole GPUs or shared GPUs, not both")
        if self.mig and (not self.gpus or self.os == "windows"):
            raise ValueError("MIG instances need whole GPUs on a Linux node")
        if self.dra and (not self.gpus or self.os == "windows"):
            raise ValueError("DRA devices need whole GPUs on a Linux node")

    @property
    def gpu_count(self) -> int:
        return self.shared.gpus if self.shared else self.gpus


def gpu_resources(template: NodeTemplate) -> dict[str, str]:
    """The extended resources the node's device plugin advertises once it is up."""
    if template.shared:
        s = template.shared
        return {
            SHARED_GPU_MEMORY: str(s.gpus * s.memory_gib_per_gpu),
            SHARED_GPU_COUNT: str(s.gpus),
            SHARED_GPU_CORE: str(100 * s.gpus),
        }
    if not template.gpus or template.dra:
        return {}
    if template.os == "windows":
        return {DIRECTX_RESOURCE: str(template.gpus)}
    if template.mig:
        return {f"{NVIDIA_MIG_PREFIX}{p}": str(n * template.gpus) for p, n in template.mig.items()}
    return {GPU: str(template.gpus)}


def labels(name: str, template: NodeTemplate) -> dict[str, str]:
    out = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": template.os,
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    if template.gpu_count:
        out |= {
            "nvidia.com/gpu.present": "true",
            "feature.node.kubernetes.io/pci-10de.present": "true",
            "nvidia.com/gpu.product": template.product,
            "nvidia.com/gpu.count": str(template.gpu_count),
        }
    return out | dict(template.labels)


def pool_template(template: NodeTemplate) -> dict[str, Any]:
    """A controller pool's ``template`` (``pools[].template`` in its config) for nodes made from
    ``template``: what each offers and the labels it carries, but its own name."""
    node = shape(template)
    return {"resources": node["resources"], "labels": node["labels"]}


def manifest(
    name: str,
    template: NodeTemplate,
    *,
    gpus_allocatable: bool = True,
    annotations: Mapping[str, str] | None = None,
    extra_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Node body to create. With ``gpus_allocatable=False`` the node joins without its GPU
    resources, as a real node does before its device plugin registers."""
    base = {"cpu": template.cpu, "memory": template.memory, "pods": template.pods}
    resources = base | (gpu_resources(template) if gpus_allocatable else {})
    node_labels = labels(name, template) | dict(extra_labels or {})
    return _node(name, node_labels, template.taints, resources, template.os, annotations)


def shape(template: NodeTemplate, extra_labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What every node made from ``template`` has, but its name, as plain data: what an
    infrastructure provider's machine template holds (gpumon.devcluster.capi_infra). A DRA
    template's GPUs are no resource: ``dra`` then says which devices its driver publishes
    (:func:`dra_template` reads it back)."""
    node_labels = labels("", template) | dict(extra_labels or {})
    del node_labels["kubernetes.io/hostname"]
    out: dict[str, Any] = {
        "labels": node_labels,
        "taints": [dict(t) for t in template.taints],
        "resources": {"cpu": template.cpu, "memory": template.memory, "pods": template.pods}
        | gpu_resources(template),
        "os": template.os,
    }
    if template.dra:
        out["dra"] = {"gpus": template.gpus, "product": template.product, "mig": dict(template.mig)}
    return out


def dra_template(node_shape: Mapping[str, Any]) -> NodeTemplate | None:
    """The template whose devices a :func:`shape`'s node publishes through DRA, or None."""
    described = node_shape.get("dra")
    if not described:
        return None
    return NodeTemplate(
        gpus=int(described["gpus"]),
        product=str(described["product"]),
        mig={str(k): int(v) for k, v in (described.get("mig") or {}).items()},
        dra=True,
    )


def device_resources(resources: Mapping[str, str]) -> dict[str, str]:
    """The extended resources among a node's (``vendor/name``): what a device plugin
    advertises once it registers, not what the kubelet reports from the start."""
    return {k: v for k, v in resources.items() if "/" in k}


def from_shape(
    name: str,
    node_shape: Mapping[str, Any],
    *,
    provider_id: str,
    extra_labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The Node body for one machine of a :func:`shape`, with its cloud provider ID."""
    body = _node(
        name,
        {**node_shape.get("labels", {}), **(extra_labels or {}), "kubernetes.io/hostname": name},
        tuple(node_shape.get("taints", ())),
        dict(node_shape.get("resources", {})),
        str(node_shape.get("os", "linux")),
        annotations,
    )
    body["spec"]["providerID"] = provider_id
    return body


def _node(
    name: str,
    node_labels: Mapping[str, str],
    taints: Sequence[Mapping[str, str]],
    resources: Mapping[str, str],
    os_name: str,
    annotations: Mapping[str, str] | None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": dict(node_labels),
            "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE, **(annotations or {})},
        },
        "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": os_name,
                "kubeletVersion": KUBELET_VERSION,
            },
        },
    }


def gpus_allocatable_patch(template: NodeTemplate) -> dict[str, Any]:
    """The status patch that makes a node's GPUs schedulable (its device plugin registered)."""
    resources = gpu_resources(template)
    return {"status": {"capacity": resources, "allocatable": resources}}


def has_gpus_allocatable(node_status_allocatable: Mapping[str, str] | None, template: NodeTemplate) -> bool:
    """For a device-plugin template; a DRA node's GPUs are up once its ResourceSlice is."""
    have = node_status_allocatable or {}
    return all(key in have for key in gpu_resources(template))
