"""Which pods hold which GPUs through Dynamic Resource Allocation. Pure: no I/O.

A pod names its ResourceClaims (:func:`gpumon.k8s.dra.pod_claims`); the scheduler writes each
claim's allocation as (driver, pool, device) triples (:func:`gpumon.k8s.dra.claim_devices`); the
driver's ResourceSlices say which GPU each device is or is carved from
(:attr:`gpumon.k8s.dra.SliceDevice.card_uuid`). Put together, a pod *holds* a GPU when one of its
claims is allocated a device on it: a whole GPU, or a MIG device whose parent it is. Every pod
naming a claim holds its devices, so a claim shared by several pods takes all of them along.

The caches keep slim views of claims and slices (only allocations of GPU drivers, only the
device -> GPU mapping), built here from the API's JSON.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpumon.controller.core.objects import PodView
from gpumon.k8s.dra import ClaimRef, DeviceRef, claim_devices, newest_generation, slice_devices


@dataclass(frozen=True, slots=True)
class ClaimView:
    """A claim allocated (some) devices of a GPU driver: those devices, and the pods it is
    reserved for (names, in the claim's namespace)."""

    ref: ClaimRef
    devices: tuple[DeviceRef, ...]
    reserved_for: tuple[str, ...] = ()


def claim_from_json(obj: Mapping[str, Any], drivers: Collection[str]) -> ClaimView | None:
    """The slim view of a ResourceClaim, or None when it holds no device of ``drivers``
    (unallocated, or other kinds of devices): such claims are not worth a place in the cache."""
    devices = tuple(dict.fromkeys(d.ref for d in claim_devices(obj) if d.ref.driver in drivers))
    if not devices:
        return None
    meta = obj.get("metadata") or {}
    reserved = (obj.get("status") or {}).get("reservedFor") or ()
    return ClaimView(
        ref=ClaimRef(str(meta.get("namespace") or ""), str(meta.get("name") or "")),
        devices=devices,
        reserved_for=tuple(
            str(r["name"])
            for r in reserved
            if isinstance(r, Mapping) and r.get("resource") == "pods" and r.get("name")
        ),
    )


@dataclass(frozen=True, slots=True)
class PlacedDevice:
    """A device as its slice places it: the GPU it is (or is carved from), and its own uuid."""

    ref: DeviceRef
    card_uuid: str | None
    uuid: str | None


@dataclass(frozen=True, slots=True)
class SliceView:
    """The GPU devices of one ResourceSlice (never none: :func:`slice_from_json` keeps no empty
    view), with the node they are on ("" when the pool is not node-local) and the pool's
    generation (a newer generation replaces older slices)."""

    node: str
    generation: int
    devices: tuple[PlacedDevice, ...]

    # The slice's driver and pool, which every device's triple repeats.
    @property
    def driver(self) -> str:
        return self.devices[0].ref.driver

    @property
    def pool(self) -> str:
        return self.devices[0].ref.pool


def slice_from_json(obj: Mapping[str, Any], drivers: Collection[str]) -> SliceView | None:
    """The slim view of a ResourceSlice of one of ``drivers``, else None."""
    devices = tuple(
        PlacedDevice(d.ref, d.card_uuid, d.uuid) for d in slice_devices(obj) if d.ref.driver in drivers
    )
    if not devices:
        return None
    spec = obj.get("spec") or {}
    generation = (spec.get("pool") or {}).get("generation")
    return SliceView(
        node=str(spec.get("nodeName") or ""),
        generation=generation if isinstance(generation, int) else 0,
        devices=devices,
    )


def placed_devices(slices: Iterable[SliceView]) -> dict[DeviceRef, PlacedDevice]:
    """Every device of ``slices`` by its triple, from its pool's newest generation only (a
    driver republishing a pool leaves older slices behind for a while)."""
    return {d.ref: d for s in newest_generation(slices) for d in s.devices}


@dataclass(frozen=True, slots=True)
class DeviceHold:
    """A GPU device a pod holds through one of its claims; ``device`` is None when no slice
    describes it, so it is not known which GPU it is."""

    claim: ClaimRef
    ref: DeviceRef
    device: PlacedDevice | None

    @property
    def card_uuid(self) -> str | None:
        return self.device.card_uuid if self.device is not None else None

    def describe(self) -> str:
        uuid = self.device.uuid if self.device is not None else None
        own = f" ({uuid})" if uuid and uuid != self.card_uuid else ""
        return f"DRA device {self.ref.device}{own} of claim {self.claim.name}"


def pod_holds(
    claims: Iterable[ClaimRef],
    allocated: Mapping[str, ClaimView],
    devices: Mapping[DeviceRef, PlacedDevice],
) -> tuple[DeviceHold, ...]:
    """The GPU devices a pod holds through ``claims`` (its :func:`gpumon.k8s.dra.pod_claims`);
    ``allocated`` holds the claims' views by ``namespace/name`` (``str(ClaimRef)``), as the
    cache keys them. A claim missing there holds no GPU device (yet)."""
    out: list[DeviceHold] = []
    for ref in claims:
        claim = allocated.get(str(ref))
        if claim is not None:
            out.extend(DeviceHold(ref, d, devices.get(d)) for d in claim.devices)
    return tuple(out)


def holds_by_pod(
    pods: Iterable[PodView], allocated: Mapping[str, ClaimView], slices: Iterable[SliceView]
) -> dict[tuple[str, str], tuple[DeviceHold, ...]]:
    """What each of a node's ``pods`` holds, placed by the node's ``slices`` (a device of a
    pool that is not on the node stays unplaced). Pods holding no GPU device are left out."""
    devices = placed_devices(slices)
    out = {}
    for pod in pods:
        if pod.claims and (held := pod_holds(pod.claims, allocated, devices)):
            out[pod.key] = held
    return out
