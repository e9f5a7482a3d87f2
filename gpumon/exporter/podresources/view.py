"""What the kubelet's pod-resources ``List`` says, as the exporter keeps it: a pure decoding of the
serialized ``ListPodResourcesResponse`` straight into :data:`PodResourcesView`.

Field numbers are those of ``api.proto`` beside this module (k8s.io/kubelet v0.36.3); only the
fields the view holds are read, the rest (cpu_ids, memory, topology, CDI devices, share_id, and
anything a later kubelet adds) skipped unparsed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from gpumon.dra import ClaimDevice, ClaimRef, DeviceRef
from gpumon.exporter.podresources.protowire import length_delimited, text


@dataclass(frozen=True, slots=True)
class DeviceAssignment:
    resource: str
    device_ids: tuple[str, ...]


PodKey = tuple[str, str]
"""(namespace, pod name): the API identifies pods by name only."""

Assignment = DeviceAssignment | ClaimDevice
"""What the kubelet gave a container: devices of a device plugin's resource, or one device of a
DRA ResourceClaim (``dynamic_resources``)."""

PodResourcesView = Mapping[PodKey, Mapping[str, tuple[Assignment, ...]]]
"""Every pod the kubelet runs, by (namespace, name); for each container its assignments of the
watched resources and DRA drivers (empty for containers that hold none)."""

# ListPodResourcesResponse
_POD_RESOURCES = 1
# PodResources
_POD_NAME, _POD_NAMESPACE, _CONTAINERS = 1, 2, 3
# ContainerResources
_CONTAINER_NAME, _DEVICES, _DYNAMIC_RESOURCES = 1, 2, 5
# ContainerDevices
_RESOURCE_NAME, _DEVICE_IDS = 1, 2
# DynamicResource
_CLAIM_NAME, _CLAIM_NAMESPACE, _CLAIM_RESOURCES = 2, 3, 4
# ClaimResource
_DRIVER_NAME, _POOL_NAME, _DEVICE_NAME = 2, 3, 4


def view_from_response(
    response: bytes,
    watched: Callable[[str], bool],
    dra_drivers: frozenset[str] = frozenset(),
) -> PodResourcesView:
    """The view of a serialized ``ListPodResourcesResponse``; :class:`protowire.DecodeError`
    if it is not one. A pod or container listed twice keeps its last entry, as a map of the
    parsed message would."""
    view: dict[PodKey, dict[str, tuple[Assignment, ...]]] = {}
    for number, pod in length_delimited(memoryview(response)):
        if number == _POD_RESOURCES:
            name = namespace = ""
            containers: dict[str, tuple[Assignment, ...]] = {}
            for field, value in length_delimited(pod):
                if field == _POD_NAME:
                    name = text(value)
                elif field == _POD_NAMESPACE:
                    namespace = text(value)
                elif field == _CONTAINERS:
                    cname, held = _container(value, watched, dra_drivers)
                    containers[cname] = held
            view[(namespace, name)] = containers
    return view


def _container(
    data: memoryview, watched: Callable[[str], bool], drivers: frozenset[str]
) -> tuple[str, tuple[Assignment, ...]]:
    name = ""
    devices: list[DeviceAssignment] = []
    # dict: each claim device once, however many shares of it (share_id) its claim holds.
    claimed: dict[ClaimDevice, None] = {}
    for field, value in length_delimited(data):
        if field == _CONTAINER_NAME:
            name = text(value)
        elif field == _DEVICES:
            resource, ids = "", []
            for f, v in length_delimited(value):
                if f == _RESOURCE_NAME:
                    resource = text(v)
                elif f == _DEVICE_IDS:
                    ids.append(text(v))
            if watched(resource):
                devices.append(DeviceAssignment(resource, tuple(ids)))
        elif field == _DYNAMIC_RESOURCES and drivers:
            claimed.update(dict.fromkeys(_claim_devices(value, drivers)))
    return name, (*devices, *claimed)


def _claim_devices(data: memoryview, drivers: frozenset[str]) -> Iterator[ClaimDevice]:
    claim_name = claim_namespace = ""
    devices: list[DeviceRef] = []
    for field, value in length_delimited(data):
        if field == _CLAIM_NAME:
            claim_name = text(value)
        elif field == _CLAIM_NAMESPACE:
            claim_namespace = text(value)
        elif field == _CLAIM_RESOURCES:
            strings = {_DRIVER_NAME: "", _POOL_NAME: "", _DEVICE_NAME: ""}
            for f, v in length_delimited(value):
                if f in strings:
                    strings[f] = text(v)
            if strings[_DRIVER_NAME] in drivers and strings[_DEVICE_NAME]:
                devices.append(DeviceRef(strings[_DRIVER_NAME], strings[_POOL_NAME], strings[_DEVICE_NAME]))
    # The claim's name may follow its resources on the wire: known only once it is all read.
    claim = ClaimRef(claim_namespace, claim_name)
    return (ClaimDevice(claim, device) for device in devices)
