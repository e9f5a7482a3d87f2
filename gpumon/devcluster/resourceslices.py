"""NVIDIA's DRA driver for GPUs, played for kwok nodes: the ResourceSlice its kubelet plugin
publishes for a node and the DeviceClasses its Helm chart installs, so that the real
kube-scheduler allocates claims for GPUs on nodes no kubelet runs.

What a real plugin reads from NVML, this one reads from the node's simulated boards
(:func:`simulated_backend`: the same GPU and MIG UUIDs a simulated exporter on that node
reports), and it writes them the way NVIDIA/k8s-dra-driver-gpu v25.12.0 does
(``cmd/gpu-kubelet-plugin``: ``deviceinfo.go``, ``partitions.go``, ``mig.go``;
``deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-{gpu,mig}.yaml``):

- one pool per node, named after the node, in one slice with ``nodeName`` set;
- a GPU not in MIG mode is a device ``gpu-<minor>``: attributes ``type: gpu``, ``uuid``,
  ``productName``, ``brand``, ``architecture``, ``cudaComputeCapability``, ``driverVersion``,
  ``cudaDriverVersion`` (versions), ``resource.kubernetes.io/pciBusID``; capacity ``memory``
  in bytes;
- a GPU in MIG mode publishes only its MIG devices (static MIG: the whole board is not
  allocatable), each ``gpu-<minor>-mig-<profile without dots>-<giProfileId>-<placementStart>``
  (``gpu-0-mig-3g40gb-9-4``; releases up to v25.8 named them
  ``gpu-<minor>-mig-<giProfileId>-<start>-<size>``): ``type: mig``, its own ``uuid``,
  ``parentUUID``, ``profile`` and the parent's product and version attributes; capacity
  ``multiprocessors``, ``copyEngines``, ``decoders``, ``encoders``, ``jpegEngines``,
  ``ofaEngines``, ``memory`` and ``memorySlice<i>`` for each memory slice it occupies.

The slice is owned by its Node (an ownerReference, as the kubelet's plugin helper writes it),
so the garbage collector deletes it with the node. Pure, but for :func:`publish`."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpumon.devcluster.nodes import GPU, NodeTemplate
from gpumon.devices.simulated import FaultScenario, ScenarioMig, SimulatedBackend
from gpumon.gpu.model import MigInstance
from gpumon.k8s import dra
from gpumon.kube.client import Conflict, KubeApi

MIG_DEVICE_CLASS = "mig.nvidia.com"
GPU_DEVICE_CLASS = "gpu.nvidia.com"  # the same name as the driver
PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
CDI_VENDOR_CLASS = "k8s.gpu.nvidia.com/claim"  # the plugin's transient per-claim CDI spec
MiB = 1 << 20
MEMORY_SLICES = 8  # of an A100 or H100 (seven compute slices)


def device_classes() -> tuple[dict[str, Any], ...]:
    """The DeviceClasses NVIDIA's chart installs (``resources.gpus.enabled``) for
    ``resource.k8s.io/v1``: ``gpu.nvidia.com`` also backs the ``nvidia.com/gpu`` extended
    resource (DRAExtendedResource, beta and on in 1.36)."""

    def device_class(name: str, kind: str, extra: Mapping[str, Any]) -> dict[str, Any]:
        driver = dra.NVIDIA_GPU_DRIVER
        expression = f"device.driver == '{driver}' && device.attributes['{driver}'].type == '{kind}'"
        return {
            "apiVersion": dra.API_VERSION,
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}], **extra},
        }

    return (
        device_class(GPU_DEVICE_CLASS, dra.GPU_TYPE, {"extendedResourceName": GPU}),
        device_class(MIG_DEVICE_CLASS, dra.MIG_TYPE, {}),
    )


@dataclass(frozen=True)
class _MigProfile:
    """A GPU instance profile as ``nvidia-smi mig -lgip`` / ``-lgipp`` list it."""

    profile_id: int
    placement_size: int  # memory slices
    placement_starts: tuple[int, ...]
    multiprocessors: int
    copy_engines: int
    decoders: int
    jpeg_engines: int
    ofa_engines: int


@dataclass(frozen=True)
class _Board:
    architecture: str
    compute_capability: str
    mig: Mapping[str, _MigProfile]


# NVIDIA's MIG user guide, "Supported MIG profiles" (A100 80GB and H100 80GB tables), with the
# placements NVML reports; memory per profile is the simulated board's (gpumon.devices.simulated).
_BOARDS: Mapping[str, _Board] = {
    "A100-SXM4-80GB": _Board(
        "Ampere",
        "8.0",
        {
            "1g.10gb": _MigProfile(19, 1, (0, 1, 2, 3, 4, 5, 6), 14, 1, 0, 0, 0),
            "2g.20gb": _MigProfile(14, 2, (0, 2, 4), 28, 2, 1, 0, 0),
            "3g.40gb": _MigProfile(9, 4, (0, 4), 42, 3, 2, 0, 0),
            "4g.40gb": _MigProfile(5, 4, (0,), 56, 4, 2, 0, 0),
            "7g.80gb": _MigProfile(0, 8, (0,), 98, 7, 5, 1, 1),
        },
    ),
    "H100-80GB-HBM3": _Board(
        "Hopper",
        "9.0",
        {
            "1g.10gb": _MigProfile(19, 1, (0, 1, 2, 3, 4, 5, 6), 16, 1, 1, 1, 0),
            "1g.20gb": _MigProfile(15, 2, (0, 2, 4, 6), 26, 1, 1, 1, 0),
            "2g.20gb": _MigProfile(14, 2, (0, 2, 4), 32, 2, 2, 2, 0),
            "3g.40gb": _MigProfile(9, 4, (0, 4), 60, 3, 3, 3, 0),
            "4g.40gb": _MigProfile(5, 4, (0,), 64, 4, 4, 4, 0),
            "7g.80gb": _MigProfile(0, 8, (0,), 132, 7, 7, 7, 1),
        },
    ),
    "L40S": _Board("Ada Lovelace", "8.9", {}),
    "T4": _Board("Turing", "7.5", {}),
}


def _model(template: NodeTemplate) -> str:
    """The simulated board behind a node label's product (``NVIDIA-A100-SXM4-80GB``)."""
    model = template.product.removeprefix("NVIDIA-")
    if model not in _BOARDS:
        raise ValueError(
            f"no DRA device description for product {template.product!r} (known: {', '.join(_BOARDS)})"
        )
    return model


def _mig_layout(template: NodeTemplate) -> tuple[str, ...]:
    """The MIG profiles of each GPU as the template counts them, the widest placements first
    (so a first fit finds a layout whenever one exists: 4g.40gb then 1g.10gb, not the reverse)."""
    board = _BOARDS[_model(template)]
    unknown = sorted(set(template.mig) - set(board.mig))
    if unknown:
        raise ValueError(
            f"{template.product} has no MIG profile {', '.join(unknown)} (known: {', '.join(board.mig)})"
        )
    ordered = sorted(template.mig.items(), key=lambda kv: -board.mig[kv[0]].placement_size)
    return tuple(p for p, n in ordered for _ in range(n))


def simulation_seed(node: str) -> int:
    """The seed of the node's simulated boards: distinct per node, so no two nodes share GPU
    UUIDs (a fault is judged per UUID)."""
    return zlib.crc32(node.encode())


def simulated_backend(node: str, template: NodeTemplate) -> SimulatedBackend:
    """The node's GPUs as a simulated exporter on it sees them (the same UUIDs, MIG devices
    and all): run an exporter with this backend to attribute the pods the scheduler placed."""
    profiles = _mig_layout(template)
    scenario = FaultScenario(
        mig=tuple(ScenarioMig(gpu=i, profiles=profiles) for i in range(template.gpus)) if profiles else ()
    )
    return SimulatedBackend(template.gpus, _model(template), seed=simulation_seed(node), scenario=scenario)


def _placements(board: _Board, instances: Sequence[MigInstance]) -> list[int]:
    """Each instance's placement start: the lowest free one its profile allows, in order."""
    used: set[int] = set()
    starts = []
    for m in instances:
        p = board.mig[m.profile]
        start = next((s for s in p.placement_starts if used.isdisjoint(range(s, s + p.placement_size))), None)
        if start is None:
            layout = ", ".join(i.profile for i in instances)
            raise ValueError(f"MIG profiles {layout} do not fit the {MEMORY_SLICES} memory slices of one GPU")
        used.update(range(start, start + p.placement_size))
        starts.append(start)
    return starts


def _string(value: str) -> dict[str, str]:
    return {"string": value}


def _version(value: str) -> dict[str, str]:
    """A version attribute as the driver writes it: semver, ``550.127.05`` -> ``550.127.5``."""
    parts = [str(int(x)) for x in value.split(".")]
    return {"version": ".".join([*parts, "0", "0"][:3])}


def _quantity(value: int) -> dict[str, str]:
    return {"value": str(value)}


def devices(node: str, template: NodeTemplate) -> list[dict[str, Any]]:
    """The devices of the node's slice, as the API's JSON."""
    board = _BOARDS[_model(template)]
    backend = simulated_backend(node, template)
    driver = backend.open()
    try:
        out: list[dict[str, Any]] = []
        for gpu in backend.devices():
            common = {
                dra.PRODUCT_NAME_ATTRIBUTE: _string(gpu.model),
                "brand": _string("Nvidia"),
                "architecture": _string(board.architecture),
                "cudaComputeCapability": _version(board.compute_capability),
                "driverVersion": _version(driver.driver_version),
                "cudaDriverVersion": _version(driver.cuda_version),
                PCI_BUS_ID_ATTRIBUTE: _string(gpu.pci_bus_id.lower().removeprefix("0000")),
            }
            if not gpu.mig_mode:
                out.append(
                    {
                        "name": f"gpu-{gpu.index}",
                        "attributes": {
                            dra.TYPE_ATTRIBUTE: _string(dra.GPU_TYPE),
                            dra.UUID_ATTRIBUTE: _string(gpu.uuid),
                            **common,
                        },
                        "capacity": {dra.MEMORY_CAPACITY: _quantity(backend.spec.memory_mib * MiB)},
                    }
                )
                continue
            instances = backend.read_slow(gpu.index).mig_instances
            for m, start in zip(instances, _placements(board, instances), strict=True):
                p = board.mig[m.profile]
                capacity = {
                    "multiprocessors": _quantity(p.multiprocessors),
                    "copyEngines": _quantity(p.copy_engines),
                    "decoders": _quantity(p.decoders),
                    "encoders": _quantity(0),
                    "jpegEngines": _quantity(p.jpeg_engines),
                    "ofaEngines": _quantity(p.ofa_engines),
                    dra.MEMORY_CAPACITY: _quantity(backend.spec.mig_profiles[m.profile][1] * MiB),
                }
                capacity |= {f"memorySlice{i}": _quantity(1) for i in range(start, start + p.placement_size)}
                out.append(
                    {
                        "name": f"gpu-{gpu.index}-mig-{m.profile.replace('.', '')}-{p.profile_id}-{start}",
                        "attributes": {
                            dra.TYPE_ATTRIBUTE: _string(dra.MIG_TYPE),
                            dra.UUID_ATTRIBUTE: _string(m.uuid),
                            dra.PARENT_UUID_ATTRIBUTE: _string(gpu.uuid),
                            dra.PROFILE_ATTRIBUTE: _string(m.profile),
                            **common,
                        },
                        "capacity": capacity,
                    }
                )
        return out
    finally:
        backend.close()


# What a pool's template cannot know of a node it has not made: its GPUs' own identities.
_NODE_SPECIFIC = frozenset({dra.UUID_ATTRIBUTE, dra.PARENT_UUID_ATTRIBUTE})


def pool_dra(template: NodeTemplate) -> dict[str, Any]:
    """A controller pool's ``template.dra`` (docs/autoscaling.md) for nodes made from
    ``template``: the devices this driver publishes for such a node, with their string,
    integer and boolean attributes in the driver's domain and their capacities; not their UUIDs
    (node-specific), other domains' attributes, nor versions (a template declares no semver)."""
    out = []
    for d in devices("template", template):
        attributes = {
            name: value[kind]
            for name, value in (d.get("attributes") or {}).items()
            for kind in ("string", "int", "bool")
            if kind in value and "/" not in name and name not in _NODE_SPECIFIC
        }
        capacity = {name: value["value"] for name, value in (d.get("capacity") or {}).items()}
        out.append({"name": d["name"], "attributes": attributes, "capacity": capacity})
    return {"driver": dra.NVIDIA_GPU_DRIVER, "devices": out}


def slice_name(node: str) -> str:
    return f"{node}-{dra.NVIDIA_GPU_DRIVER}"


def slice_manifest(
    node: str, node_uid: str, template: NodeTemplate, *, labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The node's one ResourceSlice: its pool (named after the node) whole in one slice."""
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(node),
            "labels": dict(labels or {}),
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
            ],
        },
        "spec": {
            "driver": dra.NVIDIA_GPU_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices(node, template),
        },
    }


def cdi_device(claim_uid: str, device: str) -> str:
    """The CDI device the plugin names for one allocated device of a claim (``GetClaimDeviceName``):
    ``k8s.gpu.nvidia.com/claim=<claim uid>-<device>``."""
    return f"{CDI_VENDOR_CLASS}={claim_uid}-{device}"


async def publish(
    api: KubeApi, node: str, template: NodeTemplate, *, labels: Mapping[str, str] | None = None
) -> None:
    """Publish the node's slice, as its plugin does once it registered; a slice already there
    is left as it is."""
    uid = (await api.get(f"/api/v1/nodes/{node}"))["metadata"]["uid"]
    with contextlib.suppress(Conflict):
        await api.post(dra.RESOURCE_SLICES_PATH, slice_manifest(node, uid, template, labels=labels))
