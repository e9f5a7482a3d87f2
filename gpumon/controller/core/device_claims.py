"""What pending pods ask for through Dynamic Resource Allocation, and whether a node template's
devices give it to them. Pure: no I/O.

A pod names ResourceClaims (:func:`gpumon.k8s.dra.pod_claims`); each claim asks for devices in
requests, each request for ``count`` devices of a DeviceClass (``allocationMode: ExactCount``)
or for all of them on the node (``All``), narrowed by CEL selectors in the class and in the
request. The scheduler allocates every claim of a pod from the devices of one node. The planner
does the same on the devices a pool's template declares (the ResourceSlice a new node will
publish), with the exact forms below, and nothing else:

- ``exactly`` requests, ``ExactCount`` (``count``, default 1) or ``All`` (at least one device);
- CEL selectors, in the DeviceClass and in the request, evaluated on the template's devices by a
  real CEL implementation (compiled outside the core, :mod:`gpumon.k8s.dra_cel`, and handed in as
  :class:`Selector` values). An error on any device (a missing attribute, an unknown function,
  a non-boolean result) makes the pod unevaluable, as it stops the scheduler's allocation;
- one device per allocation: template devices declare no consumable capacity. A whole GPU and
  the MIG devices carved from it (``parentUUID``) exclude each other, as the counters of
  NVIDIA's partitionable devices do; MIG devices of one GPU are taken as one static layout.

Unsupported forms are reported, never approximated: ``firstAvailable``, ``adminAccess``,
``constraints`` (matchAttribute), capacity requests, selectors that are not CEL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpumon.k8s.dra import SliceDevice

Compile = Callable[[str], Callable[[SliceDevice], bool]]
"""Expression -> predicate; both raise ValueError (an expression that does not compile, a device
it cannot be evaluated on)."""


@dataclass(frozen=True, slots=True)
class Selector:
    """A CEL device selector: its text (what makes two equal) and its compiled predicate, which
    raises ValueError where the expression has no boolean value."""

    expression: str
    matches: Callable[[SliceDevice], bool] = field(compare=False, hash=False, repr=False)


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    name: str
    device_class: str
    selectors: tuple[Selector, ...] = ()  # the request's own
    count: int = 1
    all: bool = False  # allocationMode All: every matching device of the node, at least one
    class_selectors: tuple[Selector, ...] = ()  # the DeviceClass's, filled in at resolution


@dataclass(frozen=True, slots=True)
class ClaimRequests:
    """What a ResourceClaim asks for, as the autoscaler reads it (the devices allocated to one
    are core.claims.ClaimView, what remediation reads)."""

    key: str  # namespace/name
    requests: tuple[DeviceRequest, ...] = ()
    allocated: bool = False  # its devices are on a node already: new nodes cannot help
    unsupported: str | None = None  # a form the planner does not evaluate
    unevaluable: str | None = None  # a selector that does not compile


@dataclass(frozen=True, slots=True)
class DeviceClassView:
    name: str
    selectors: tuple[Selector, ...] = ()
    unsupported: str | None = None
    unevaluable: str | None = None


def _selectors(
    raw: Any, compile_: Compile, where: str
) -> tuple[tuple[Selector, ...], str | None, str | None]:
    """(selectors, unsupported, unevaluable) of a ``selectors`` list."""
    out: list[Selector] = []
    for s in raw or ():
        expression = ((s or {}).get("cel") or {}).get("expression") if isinstance(s, Mapping) else None
        if not isinstance(expression, str):
            return (), f"{where}: a selector that is not CEL", None
        try:
            out.append(Selector(expression, compile_(expression)))
        except ValueError as e:
            return (), None, f"{where}: {e}"
    return tuple(out), None, None


def claim_requests(obj: Mapping[str, Any], compile_: Compile) -> ClaimRequests:
    meta = obj.get("metadata") or {}
    key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    status = obj.get("status") or {}
    devices = (obj.get("spec") or {}).get("devices") or {}
    allocated = bool(status.get("allocation"))
    if devices.get("constraints"):
        return ClaimRequests(
            key, allocated=allocated, unsupported=f"claim {key}: constraints (matchAttribute)"
        )
    requests: list[DeviceRequest] = []
    for r in devices.get("requests") or ():
        name = str(r.get("name", ""))
        where = f"claim {key}, request {name}"
        if r.get("firstAvailable"):
            return ClaimRequests(key, allocated=allocated, unsupported=f"{where}: firstAvailable")
        exactly = r.get("exactly")
        if not isinstance(exactly, Mapping):
            return ClaimRequests(key, allocated=allocated, unsupported=f"{where}: no exactly")
        if exactly.get("adminAccess"):
            return ClaimRequests(key, allocated=allocated, unsupported=f"{where}: adminAccess")
        if exactly.get("capacity"):
            return ClaimRequests(key, allocated=allocated, unsupported=f"{where}: capacity requests")
        mode = exactly.get("allocationMode") or "ExactCount"
        if mode not in ("ExactCount", "All"):
            return ClaimRequests(key, allocated=allocated, unsupported=f"{where}: allocationMode {mode}")
        selectors, unsupported, unevaluable = _selectors(exactly.get("selectors"), compile_, where)
        if unsupported or unevaluable:
            return ClaimRequests(key, allocated=allocated, unsupported=unsupported, unevaluable=unevaluable)
        count = exactly.get("count", 1) if mode == "ExactCount" else 0
        if not isinstance(count, int) or isinstance(count, bool) or (mode == "ExactCount" and count < 1):
            return ClaimRequests(key, allocated=allocated, unsupported=f"{where}: count {count!r}")
        requests.append(
            DeviceRequest(name, str(exactly.get("deviceClassName", "")), selectors, count, mode == "All")
        )
    return ClaimRequests(key, tuple(requests), allocated)


def device_class_view(obj: Mapping[str, Any], compile_: Compile) -> DeviceClassView:
    name = str((obj.get("metadata") or {}).get("name", ""))
    selectors, unsupported, unevaluable = _selectors(
        (obj.get("spec") or {}).get("selectors"), compile_, f"DeviceClass {name}"
    )
    return DeviceClassView(name, selectors, unsupported, unevaluable)


@dataclass(frozen=True, slots=True)
class ClaimDemand:
    """A claim of a pending pod, its requests resolved against their DeviceClasses."""

    key: str
    requests: tuple[DeviceRequest, ...]


def resolve(
    claims: Sequence[ClaimRequests], classes: Mapping[str, DeviceClassView]
) -> tuple[ClaimDemand, ...] | tuple[str, str]:
    """A pod's claims with their classes' selectors, or (refusal kind, why) when the planner
    cannot evaluate them."""
    out: list[ClaimDemand] = []
    for claim in claims:
        if claim.unsupported:
            return ("dra_unsupported", claim.unsupported)
        if claim.unevaluable:
            return ("dra_unevaluable", claim.unevaluable)
        requests = []
        for r in claim.requests:
            dc = classes.get(r.device_class)
            if dc is None:
                return (
                    "dra_unevaluable",
                    f"claim {claim.key}: DeviceClass {r.device_class!r} does not exist",
                )
            if dc.unsupported:
                return ("dra_unsupported", dc.unsupported)
            if dc.unevaluable:
                return ("dra_unevaluable", dc.unevaluable)
            requests.append(DeviceRequest(r.name, r.device_class, r.selectors, r.count, r.all, dc.selectors))
        out.append(ClaimDemand(claim.key, tuple(requests)))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# A template's devices


class TemplateDevices:
    """The devices one new node of a pool publishes, with which of them each request can take.
    Matching results are kept (a pool's template never changes, and a selector's result on a
    device is a function of the two), so the pods of one workload evaluate CEL once per pool."""

    __slots__ = ("_cache", "conflicts", "devices")

    _CACHE_LIMIT = 4096

    def __init__(self, devices: Sequence[SliceDevice]) -> None:
        self.devices = tuple(devices)
        by_uuid = {d.uuid: i for i, d in enumerate(self.devices) if d.uuid}
        conflicts: list[set[int]] = [set() for _ in self.devices]
        for i, d in enumerate(self.devices):
            parent = by_uuid.get(d.parent_uuid) if d.parent_uuid else None
            if parent is not None and parent != i:
                conflicts[i].add(parent)
                conflicts[parent].add(i)
        self.conflicts = tuple(frozenset(c) for c in conflicts)
        # By the selectors alone: what a request matches does not depend on how many it wants.
        self._cache: dict[tuple[tuple[Selector, ...], tuple[Selector, ...]], tuple[int, ...] | str] = {}

    def candidates(self, request: DeviceRequest) -> tuple[int, ...] | str:
        """Indices of the devices ``request`` matches, or why it cannot be evaluated on them.
        The class's selectors come first and a false one ends a device's check, as in the
        scheduler's allocator."""
        key = (request.class_selectors, request.selectors)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        result: tuple[int, ...] | str
        try:
            result = tuple(
                i
                for i, d in enumerate(self.devices)
                if all(s.matches(d) for s in (*request.class_selectors, *request.selectors))
            )
        except ValueError as e:
            result = str(e)
        if len(self._cache) >= self._CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = result
        return result

    def unevaluable(self, claims: Sequence[ClaimDemand]) -> str | None:
        for claim in claims:
            for r in claim.requests:
                found = self.candidates(r)
                if isinstance(found, str):
                    return f"claim {claim.key}, request {r.name}: {found}"
        return None

    def allocate(self, claims: Sequence[ClaimDemand], free: Sequence[bool]) -> list[bool] | None:
        """The node's free devices after giving every request of ``claims`` its devices among the
        ``free`` ones (taken in template order, first fit, a device's conflicts taken with it),
        or None when they do not all fit."""
        avail = list(free)
        for claim in claims:
            for r in claim.requests:
                found = self.candidates(r)
                if isinstance(found, str):
                    return None
                if r.all:
                    chosen = list(found)
                    if not chosen or not all(avail[i] for i in chosen):
                        return None
                else:
                    chosen = [i for i in found if avail[i]][: r.count]
                    if len(chosen) < r.count:
                        return None
                for i in chosen:
                    avail[i] = False
                    for j in self.conflicts[i]:
                        avail[j] = False
        return avail

    def wanted(self, claims: Sequence[ClaimDemand]) -> int:
        """How many devices ``claims`` take on an empty node (for biggest-first ordering)."""
        total = 0
        for claim in claims:
            for r in claim.requests:
                found = self.candidates(r)
                total += 0 if isinstance(found, str) else (len(found) if r.all else r.count)
        return total
