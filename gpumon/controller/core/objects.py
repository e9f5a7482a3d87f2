"""Slim, frozen views of the API objects the controller reads, built from raw JSON.

The caches keep only these (never full objects): a Node keeps its labels, gpumon's own
annotations, taints, cordon and the ``GpuUnhealthy`` condition; a Pod keeps what drain and
PDB matching need. Pure functions, no I/O.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpumon.controller.core.contract import (
    BREAKER_ANNOTATION_PREFIX,
    CONDITION_TYPE,
    KARPENTER_DO_NOT_DISRUPT_ANNOTATION,
    KEY_PREFIX,
    MIRROR_POD_ANNOTATION,
)
from gpumon.k8s.dra import NVIDIA_GPU_DRIVER, ClaimRef, pod_claims
from gpumon.k8s.resources import GPU_RESOURCE_NAMES, GPU_RESOURCE_PREFIXES
from gpumon.k8s.selectors import LabelSelector
from gpumon.k8s.sharing import CardRef, pod_cards

_EMPTY: Mapping[str, str] = MappingProxyType({})
_KEPT_ANNOTATION_PREFIXES = (KEY_PREFIX, BREAKER_ANNOTATION_PREFIX)


def to_rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def from_rfc3339(text: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return None


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    effect: str
    value: str | None = None
    time_added: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "effect": self.effect}
        if self.value is not None:
            out["value"] = self.value
        if self.time_added is not None:
            out["timeAdded"] = self.time_added
        return out

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> Taint:
        return Taint(
            key=str(obj.get("key", "")),
            effect=str(obj.get("effect", "")),
            value=obj.get("value"),
            time_added=obj.get("timeAdded"),
        )


@dataclass(frozen=True, slots=True)
class NodeCondition:
    status: str
    reason: str
    message: str
    last_transition_time: str | None = None


@dataclass(frozen=True, slots=True)
class NodeView:
    # No uid: Events name a Node by its name, as the kubelet does (act/events.py), and nothing
    # else reads one; it was 93 bytes of every node in the cache.
    name: str
    resource_version: str
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    # gpumon's annotations, and Karpenter's do-not-disrupt (the quarantine sets it).
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    gpu_condition: NodeCondition | None = None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def node_from_json(obj: Mapping[str, Any]) -> NodeView:
    meta = _meta(obj)
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    annotations = meta.get("annotations") or {}
    condition = None
    for c in status.get("conditions") or ():
        if c.get("type") == CONDITION_TYPE:
            condition = NodeCondition(
                status=str(c.get("status", "")),
                reason=str(c.get("reason", "")),
                message=str(c.get("message", "")),
                last_transition_time=c.get("lastTransitionTime"),
            )
    return NodeView(
        name=str(meta.get("name", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        labels=MappingProxyType(dict(meta.get("labels") or {})),
        annotations=MappingProxyType(
            {
                k: v
                for k, v in annotations.items()
                if k.startswith(_KEPT_ANNOTATION_PREFIXES) or k == KARPENTER_DO_NOT_DISRUPT_ANNOTATION
            }
        ),
        taints=tuple(Taint.from_json(t) for t in spec.get("taints") or ()),
        unschedulable=bool(spec.get("unschedulable", False)),
        gpu_condition=condition,
    )


@dataclass(frozen=True, slots=True)
class GpuResources:
    """Which extended resources make a pod a GPU pod: by default every one gpumon knows; and
    which DRA drivers' devices are GPUs (a pod holding one through a claim is a GPU pod too)."""

    names: frozenset[str] = frozenset(GPU_RESOURCE_NAMES)
    prefixes: tuple[str, ...] = GPU_RESOURCE_PREFIXES
    drivers: frozenset[str] = frozenset({NVIDIA_GPU_DRIVER})

    def matches(self, resource: str) -> bool:
        return resource in self.names or resource.startswith(self.prefixes)


@dataclass(frozen=True, slots=True)
class PodView:
    namespace: str
    name: str
    uid: str
    node_name: str
    phase: str = "Pending"
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    owner_kind: str | None = None  # the controlling owner's kind
    mirror: bool = False
    terminating: bool = False
    uses_gpu: bool = False
    # The cards its sharing annotations (gpushare, cGPU, HAMi) place it on; () for other pods.
    cards: tuple[CardRef, ...] = ()
    # The ResourceClaims it uses (DRA): what they were allocated is in the claims' cache.
    claims: tuple[ClaimRef, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def _requests_gpu(spec: Mapping[str, Any], resources: GpuResources) -> bool:
    for group in ("containers", "initContainers"):
        for c in spec.get(group) or ():
            res = c.get("resources") or {}
            for kind in ("limits", "requests"):
                if any(resources.matches(r) for r in res.get(kind) or {}):
                    return True
    return False


def pod_from_json(obj: Mapping[str, Any], resources: GpuResources) -> PodView:
    meta = _meta(obj)
    spec = obj.get("spec") or {}
    owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
    return PodView(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        node_name=str(spec.get("nodeName") or ""),
        phase=str((obj.get("status") or {}).get("phase", "Pending")),
        labels=MappingProxyType(dict(meta.get("labels") or {})),
        owner_kind=owner.get("kind") if owner else None,
        mirror=MIRROR_POD_ANNOTATION in (meta.get("annotations") or {}),
        terminating=meta.get("deletionTimestamp") is not None,
        uses_gpu=_requests_gpu(spec, resources),
        cards=pod_cards(obj),
        claims=pod_claims(obj),
    )


@dataclass(frozen=True, slots=True)
class PdbView:
    namespace: str
    name: str
    selector: LabelSelector
    disruptions_allowed: int

    def covers(self, pod: PodView) -> bool:
        return pod.namespace == self.namespace and self.selector.matches(pod.labels)


def pdb_from_json(obj: Mapping[str, Any]) -> PdbView:
    meta = _meta(obj)
    return PdbView(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        selector=LabelSelector.from_json((obj.get("spec") or {}).get("selector")),
        # Null as well as absent before the disruption controller has counted (fuzz tier).
        disruptions_allowed=int((obj.get("status") or {}).get("disruptionsAllowed") or 0),
    )


def pdbs_covering(pod: PodView, pdbs: Sequence[PdbView]) -> tuple[PdbView, ...]:
    return tuple(p for p in pdbs if p.covers(pod))
