"""This node's ResourceSlices: which GPU or MIG device each DRA device (driver, pool, device) is.

One list+watch (:mod:`node_watch`) with ``fieldSelector=spec.nodeName=<node>`` (a selectable
field of resource.k8s.io/v1 ResourceSlices, indexed by the API server), keeping the devices of
the GPU drivers only (:func:`gpumon.k8s.dra.slice_devices`). Failures are counted as ``dra``; an API
server that does not serve resource.k8s.io/v1 answers 404 (``dra/not_found``).

:func:`device_index` is pure: the devices by :class:`~gpumon.k8s.dra.DeviceRef`, from the newest
generation of each pool only. A driver that republishes a pool raises its generation and
replaces its slices one by one, so for a moment both generations are listed; the older one
describes devices that may be gone (the scheduler reads pools the same way).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpumon.devices.backend import ErrorSink
from gpumon.exporter.node_watch import node_view
from gpumon.k8s.dra import RESOURCE_SLICES_PATH, DeviceRef, SliceDevice, newest_generation, slice_devices

SOURCE = "dra"


@dataclass(frozen=True, slots=True)
class PoolSlice:
    """What one ResourceSlice says: a part of one (driver, pool) at one generation."""

    driver: str
    pool: str
    generation: int
    devices: tuple[SliceDevice, ...]


def project_slice(obj: Mapping[str, Any], drivers: frozenset[str]) -> PoolSlice | None:
    """The slice's devices if a GPU driver published it, else None. Raises KeyError/TypeError on
    a slice without a driver, pool or generation (the informer counts it malformed)."""
    spec = obj["spec"]
    driver = spec["driver"]
    if driver not in drivers:
        return None
    pool = spec["pool"]
    generation = pool["generation"]
    if not isinstance(generation, int) or not isinstance(pool["name"], str):
        raise TypeError("pool name or generation")
    return PoolSlice(driver, pool["name"], generation, slice_devices(obj))


def device_index(slices: Iterable[PoolSlice]) -> dict[DeviceRef, SliceDevice]:
    """Every device of the newest generation of its pool, by reference."""
    return {d.ref: d for s in newest_generation(slices) for d in s.devices}


class ResourceSliceWatch:
    """This node's slices of the GPU drivers, by UID (:attr:`view`); :attr:`index` their devices."""

    def __init__(self, node: str, drivers: frozenset[str], errors: ErrorSink, **options: Any) -> None:
        self.view = node_view(
            RESOURCE_SLICES_PATH,
            node,
            lambda obj: project_slice(obj, drivers),
            errors,
            source=SOURCE,
            name="ResourceSlice watch",
            **options,
        )
        self._index: tuple[int, dict[DeviceRef, SliceDevice]] = (0, {})

    @property
    def index(self) -> Mapping[DeviceRef, SliceDevice]:
        """The devices of the current view, rebuilt only when the view changed."""
        if self._index[0] != self.view.generation:
            self._index = (self.view.generation, device_index(self.view.items().values()))
        return self._index[1]
