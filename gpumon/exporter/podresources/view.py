"""What the kubelet's pod-resources ``List`` says, as the exporter keeps it: a pure decoding of the
serialized ``ListPodResourcesResponse`` straight into :data:`PodResourcesView`.

Field numbers are those of ``api.proto`` beside this module (k8s.io/kubelet v0.36.3); only the
fields the view holds are read, the rest (cpu_ids, memory, topology, CDI devices, share_id, and
anything a later kubelet adds) skipped unparsed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from gpumon.exporter.podresources.protowire import length_delimited, text
from gpumon.k8s.dra import ClaimDevice, ClaimRef, DeviceRef


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
    for pod in _message(memoryview(response), (), (_POD_RESOURCES,))[1][_POD_RESOURCES]:
        names, fields = _message(pod, (_POD_NAME, _POD_NAMESPACE), (_CONTAINERS,))
        view[(names[_POD_NAMESPACE], names[_POD_NAME])] = dict(
            _container(c, watched, dra_drivers) for c in fields[_CONTAINERS]
        )
    return view


def _message(
    data: memoryview, strings: tuple[int, ...], repeated: tuple[int, ...] = ()
) -> tuple[dict[int, str], dict[int, list[memoryview]]]:
    """A message's string fields of the numbers ``strings`` (the last of each, "" when absent,
    as protobuf's parse gives them) and the values of its repeated fields ``repeated``, in wire
    order; every other field skipped."""
    found = dict.fromkeys(strings, "")
    lists: dict[int, list[memoryview]] = {number: [] for number in repeated}
    for number, value in length_delimited(data):
        if number in found:
            found[number] = text(value)
        elif number in lists:
            lists[number].append(value)
    return found, lists


def _container(
    data: memoryview, watched: Callable[[str], bool], drivers: frozenset[str]
) -> tuple[str, tuple[Assignment, ...]]:
    names, fields = _message(data, (_CONTAINER_NAME,), (_DEVICES, _DYNAMIC_RESOURCES))
    devices: list[DeviceAssignment] = []
    for entry in fields[_DEVICES]:
        resource, ids = _message(entry, (_RESOURCE_NAME,), (_DEVICE_IDS,))
        if watched(resource[_RESOURCE_NAME]):
            devices.append(DeviceAssignment(resource[_RESOURCE_NAME], tuple(map(text, ids[_DEVICE_IDS]))))
    # dict: each claim device once, however many shares of it (share_id) its claim holds.
    claimed = dict.fromkeys(
        device
        for claim in (fields[_DYNAMIC_RESOURCES] if drivers else ())
        for device in _claim_devices(claim, drivers)
    )
    return names[_CONTAINER_NAME], (*devices, *claimed)


def _claim_devices(data: memoryview, drivers: frozenset[str]) -> Iterator[ClaimDevice]:
    names, fields = _message(data, (_CLAIM_NAME, _CLAIM_NAMESPACE), (_CLAIM_RESOURCES,))
    claim = ClaimRef(names[_CLAIM_NAMESPACE], names[_CLAIM_NAME])
    for resource in fields[_CLAIM_RESOURCES]:
        device, _ = _message(resource, (_DRIVER_NAME, _POOL_NAME, _DEVICE_NAME))
        if device[_DRIVER_NAME] in drivers and device[_DEVICE_NAME]:
            yield ClaimDevice(
                claim, DeviceRef(device[_DRIVER_NAME], device[_POOL_NAME], device[_DEVICE_NAME])
            )
