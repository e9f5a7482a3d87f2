"""GPUs handed out through Dynamic Resource Allocation, read the way gpumon needs them. Pure: no I/O.

The API is ``resource.k8s.io/v1`` (GA in Kubernetes 1.34). A driver publishes its devices in
ResourceSlices; the scheduler allocates devices to a ResourceClaim and writes the result, one
(driver, pool, device) triple per device, in the claim's ``status.allocation``; the kubelet's
pod-resources API names the same triple for each container. What the triple *is* (which GPU,
which MIG instance) is only in the slice's attributes.

The attribute names are those of NVIDIA's DRA driver for GPUs (NVIDIA/k8s-dra-driver-gpu,
``cmd/gpu-kubelet-plugin/deviceinfo.go``, ``GetDevice``): driver ``gpu.nvidia.com``, one pool
per node named after the node; whole GPUs named ``gpu-<minor>`` with ``type: gpu``, ``uuid``,
``productName`` and capacity ``memory`` in bytes; MIG devices named
``gpu-<minor>-mig-<profile without dots>-<giProfileId>-<placementStart>`` (v25.12; v25.8 named
them ``...-mig-<giProfileId>-<placementStart>-<placementSize>``, so nothing here parses device names)
with ``type: mig``, their own
``uuid``, ``parentUUID`` (the GPU's) and ``profile`` (``3g.40gb``). A slice's attribute names
without a domain are in the driver's domain, so CEL reads
``device.attributes["gpu.nvidia.com"].productName``; this module keys every attribute and
capacity by that qualified name.

The exporter reads slices and pod-resources (which GPU a container's DRA device is), the
controller reads slices, claims and pods (which pods hold a bad GPU, what pending pods ask for),
the local control plane's test driver writes slices: all through this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from gpumon.k8s.resources import milli

API_GROUP = "resource.k8s.io"
API_VERSION = "resource.k8s.io/v1"
RESOURCE_SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
DEVICE_CLASSES_PATH = "/apis/resource.k8s.io/v1/deviceclasses"


def resource_claims_path(namespace: str | None = None) -> str:
    """The collection of ResourceClaims, in one namespace or (None) in all of them."""
    if namespace is None:
        return "/apis/resource.k8s.io/v1/resourceclaims"
    return f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"


NVIDIA_GPU_DRIVER = "gpu.nvidia.com"
TYPE_ATTRIBUTE = "type"
UUID_ATTRIBUTE = "uuid"
PARENT_UUID_ATTRIBUTE = "parentUUID"
PROFILE_ATTRIBUTE = "profile"
PRODUCT_NAME_ATTRIBUTE = "productName"
MEMORY_CAPACITY = "memory"
GPU_TYPE = "gpu"
MIG_TYPE = "mig"

AttributeValue = bool | int | str
"""One device attribute: the API's ``bool``, ``int``, ``string`` or ``version`` (kept as its
semantic-version text)."""

_ATTRIBUTE_KINDS = ("string", "int", "bool", "version")


def qualified(name: str, driver: str) -> str:
    """An attribute or capacity name with its domain: unqualified names are the driver's."""
    return name if "/" in name else f"{driver}/{name}"


@dataclass(frozen=True, slots=True, order=True)
class DeviceRef:
    """One device as allocations and the kubelet name it."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """A device as its driver published it."""

    ref: DeviceRef
    attributes: Mapping[str, AttributeValue]
    """By qualified name (``gpu.nvidia.com/uuid``)."""
    capacity: Mapping[str, int]
    """By qualified name, in the quantity's base unit (bytes for ``memory``), rounded up."""

    def attribute(self, name: str) -> AttributeValue | None:
        """An attribute by its name in the driver's domain, or a qualified one."""
        return self.attributes.get(qualified(name, self.ref.driver))

    def _text(self, name: str) -> str | None:
        value = self.attribute(name)
        return value if isinstance(value, str) and value else None

    @property
    def uuid(self) -> str | None:
        return self._text(UUID_ATTRIBUTE)

    @property
    def kind(self) -> str | None:
        """``gpu``, ``mig`` or another type NVIDIA's driver publishes (``vfio``), if any."""
        return self._text(TYPE_ATTRIBUTE)

    @property
    def parent_uuid(self) -> str | None:
        return self._text(PARENT_UUID_ATTRIBUTE)

    @property
    def profile(self) -> str | None:
        return self._text(PROFILE_ATTRIBUTE)

    @property
    def card_uuid(self) -> str | None:
        """The physical GPU this device is or is carved from: what a fault is judged on."""
        if self.kind == MIG_TYPE:
            return self.parent_uuid
        return self.uuid


def _attribute_value(raw: Any) -> AttributeValue | None:
    if not isinstance(raw, Mapping):
        return None
    for kind in _ATTRIBUTE_KINDS:
        value = raw.get(kind)
        if value is None:
            continue
        if kind == "bool":
            return value if isinstance(value, bool) else None
        if kind == "int":
            return value if isinstance(value, int) and not isinstance(value, bool) else None
        return value if isinstance(value, str) else None
    return None


def _capacity_value(raw: Any) -> int | None:
    if not isinstance(raw, Mapping):
        return None
    thousandths = milli(raw.get("value"))
    return None if thousandths is None else -(-thousandths // 1000)


def _field(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _list(obj: Mapping[str, Any], key: str) -> list[Any]:
    value = obj.get(key)
    return value if isinstance(value, list) else []


def _named(entries: Any) -> Iterable[tuple[str, Any]]:
    return ((str(k), v) for k, v in entries.items()) if isinstance(entries, Mapping) else ()


def slice_devices(resource_slice: Mapping[str, Any]) -> tuple[SliceDevice, ...]:
    """The devices of one ResourceSlice (the API's JSON), skipping malformed entries: a slice is
    written by a driver gpumon does not control, so one bad device must not hide the others."""
    spec = _field(resource_slice, "spec")
    driver, pool = spec.get("driver"), _field(spec, "pool").get("name")
    if not isinstance(driver, str) or not isinstance(pool, str):
        return ()
    out: list[SliceDevice] = []
    for device in _list(spec, "devices"):
        if not isinstance(device, Mapping) or not isinstance(device.get("name"), str):
            continue
        attributes = {
            qualified(name, driver): value
            for name, raw in _named(device.get("attributes"))
            if (value := _attribute_value(raw)) is not None
        }
        capacity = {
            qualified(name, driver): value
            for name, raw in _named(device.get("capacity"))
            if (value := _capacity_value(raw)) is not None
        }
        out.append(SliceDevice(DeviceRef(driver, pool, device["name"]), attributes, capacity))
    return tuple(out)


class PoolPart(Protocol):
    """What a view of one ResourceSlice must say for :func:`newest_generation`."""

    @property
    def driver(self) -> str: ...
    @property
    def pool(self) -> str: ...
    @property
    def generation(self) -> int: ...


P = TypeVar("P", bound=PoolPart)


def newest_generation(slices: Iterable[P]) -> list[P]:
    """The slices of each (driver, pool) at its newest generation. A driver republishing a pool
    bumps ``spec.pool.generation`` and replaces its slices one by one, so for a while old and new
    ones coexist: the API's ResourcePool says consumers use only the highest generation."""
    slices = list(slices)
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.generation), s.generation)
    return [s for s in slices if s.generation == newest[(s.driver, s.pool)]]


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One device of a claim's allocation."""

    ref: DeviceRef
    request: str
    """The claim's request it satisfies (``gpu``, or ``gpu/subrequest`` for firstAvailable)."""
    share_id: str | None = None
    """Set when the device allows several allocations at once (consumable capacity): each
    allocation of the same device gets its own id."""


def claim_devices(claim: Mapping[str, Any]) -> tuple[AllocatedDevice, ...]:
    """The devices allocated to a ResourceClaim (the API's JSON); empty while unallocated."""
    devices = _field(_field(_field(claim, "status"), "allocation"), "devices")
    out: list[AllocatedDevice] = []
    for r in _list(devices, "results"):
        if not isinstance(r, Mapping):
            continue
        driver, pool, device = r.get("driver"), r.get("pool"), r.get("device")
        if not (isinstance(driver, str) and isinstance(pool, str) and isinstance(device, str)):
            continue
        share = r.get("shareID")
        out.append(
            AllocatedDevice(
                DeviceRef(driver, pool, device),
                str(r.get("request") or ""),
                share if isinstance(share, str) and share else None,
            )
        )
    return tuple(out)


@dataclass(frozen=True, slots=True, order=True)
class ClaimRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True, order=True)
class ClaimDevice:
    """One device of one claim, as a container holds it: the kubelet's pod-resources
    ``DynamicResource`` names the claim, each of its ``ClaimResource`` entries a device. Several
    allocations of one shared device (``share_id``) are the same ClaimDevice."""

    claim: ClaimRef
    device: DeviceRef


def pod_claims(pod: Mapping[str, Any]) -> tuple[ClaimRef, ...]:
    """The ResourceClaims a pod (the API's JSON) uses, in the order of ``spec.resourceClaims``.

    A pod entry names its claim directly (``resourceClaimName``) or through a template, whose
    claim the resourceclaim controller creates and records in ``status.resourceClaimStatuses``
    (absent until it does, and for an entry that needs no claim). Last, the claim the scheduler
    made for the pod's extended resources where a DeviceClass backs them (DRAExtendedResource,
    beta and on in 1.36: a pod asking ``nvidia.com/gpu`` on a node whose GPUs only the DRA
    driver publishes), recorded in ``status.extendedResourceClaimStatus``."""
    claims = tuple(pod_claims_by_entry(pod).values())
    extended = _field(_field(pod, "status"), "extendedResourceClaimStatus").get("resourceClaimName")
    if isinstance(extended, str) and extended:
        return (*claims, ClaimRef(str(_field(pod, "metadata").get("namespace") or ""), extended))
    return claims


def pod_claims_by_entry(pod: Mapping[str, Any]) -> dict[str, ClaimRef]:
    """The same claims keyed by the pod's own name for each (``spec.resourceClaims[].name``),
    which is what a container's ``resources.claims[].name`` refers to."""
    namespace = str(_field(pod, "metadata").get("namespace") or "")
    generated = {
        s.get("name"): s.get("resourceClaimName")
        for s in _list(_field(pod, "status"), "resourceClaimStatuses")
        if isinstance(s, Mapping)
    }
    out: dict[str, ClaimRef] = {}
    for entry in _list(_field(pod, "spec"), "resourceClaims"):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        name = entry.get("resourceClaimName") or generated.get(entry.get("name"))
        if isinstance(name, str) and name:
            out[entry["name"]] = ClaimRef(namespace, name)
    return out
