"""GPU node pools: the frozen values the planner works with, the views of cluster objects it
reads, and the codec of what it remembers on each target. Pure: no I/O. Their declarations in
config are gpumon.config.pools; gpumon.controller.configure turns those into these values.

A pool is a ``/scale`` target (a Cluster API MachineDeployment, MachineSet or MachinePool, or
any object with a scale subresource), the label selector of its nodes, and the template of a
node it adds. What the autoscaler must remember between rounds (which pods a scale-up was
for, which quarantined nodes got a replacement, when it last scaled, a scale-down under way)
is kept on the target itself, in the annotation :data:`RECORD_ANNOTATION`, so a restarted or
new leader carries on where the last one stopped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpumon.controller.core import contract as c
from gpumon.controller.core.demand import Template
from gpumon.controller.core.objects import from_rfc3339
from gpumon.controller.core.repair_jobs import PoolRepair
from gpumon.resources import milli

_EMPTY: Mapping[str, str] = MappingProxyType({})

DELETE_MACHINE_ANNOTATION = "cluster.x-k8s.io/delete-machine"
MACHINE_ANNOTATION = "cluster.x-k8s.io/machine"
MACHINE_NAMESPACE_ANNOTATION = "cluster.x-k8s.io/cluster-namespace"
# cluster-autoscaler's Cluster API provider reads these: their presence means it manages the pool.
CA_MIN_ANNOTATION = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
CA_MAX_ANNOTATION = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"

RECORD_ANNOTATION = "gpumon.io/autoscaler"
# On a Node being scaled down: when gpumon cordoned it to drain it.
REMOVING_ANNOTATION = "gpumon.io/scale-down-started-at"


# ---------------------------------------------------------------------------------------------
# Frozen values


@dataclass(frozen=True, slots=True)
class ScaleTarget:
    group: str
    version: str
    kind: str
    resource: str
    namespace: str
    name: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def path(self) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return f"{base}/namespaces/{self.namespace}/{self.resource}/{self.name}"

    @property
    def scale_path(self) -> str:
        return self.path + "/scale"

    @property
    def is_cluster_api(self) -> bool:
        return self.group == "cluster.x-k8s.io"

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    target: ScaleTarget
    node_selector: str
    template: Template
    min_replicas: int | None
    max_replicas: int | None
    max_step: int = 10
    scale_up_cooldown_seconds: float = 0.0
    scale_down_cooldown_seconds: float = 300.0
    scale_down_unneeded_seconds: float = 600.0
    scale_down_drain_timeout_seconds: float = 600.0
    arriving_timeout_seconds: float = 900.0
    headroom_nodes: int = 0
    replace_quarantined: bool = True
    allow_cluster_autoscaler: bool = False
    repair: PoolRepair | None = None  # None: no repair ladder for the pool's nodes


# ---------------------------------------------------------------------------------------------
# Views of the cluster


@dataclass(frozen=True, slots=True)
class PoolNode:
    """A registered node of a pool, as the planner needs it."""

    name: str
    created_at: float
    gpus_allocatable: bool  # every GPU resource of the template is allocatable (device plugin up)
    quarantined: bool = False  # gpumon.io/state set: gpumon took it out of service
    excluded: bool = False  # gpumon.io/exclude=true: never act on it
    unschedulable: bool = False
    deleting: bool = False
    marked: bool = False  # cluster.x-k8s.io/delete-machine: on its way out
    removing_since: float | None = None  # gpumon cordoned it to scale it down
    machine: str | None = None  # its Cluster API Machine (namespace, name), when known
    machine_namespace: str | None = None


def pool_node_from_json(obj: Mapping[str, Any], template: Template) -> PoolNode:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    allocatable = (obj.get("status") or {}).get("allocatable") or {}
    removing = annotations.get(REMOVING_ANNOTATION)
    return PoolNode(
        name=str(meta.get("name", "")),
        created_at=from_rfc3339(str(meta.get("creationTimestamp", ""))) or 0.0,
        gpus_allocatable=all((milli(allocatable.get(r, 0)) or 0) > 0 for r in template.gpu_resources),
        quarantined=c.LABEL_STATE in labels,
        excluded=labels.get(c.LABEL_EXCLUDE) == "true",
        unschedulable=bool(spec.get("unschedulable", False)),
        deleting=meta.get("deletionTimestamp") is not None,
        marked=DELETE_MACHINE_ANNOTATION in annotations,
        removing_since=from_rfc3339(removing) if removing else None,
        machine=annotations.get(MACHINE_ANNOTATION),
        machine_namespace=annotations.get(MACHINE_NAMESPACE_ANNOTATION),
    )


@dataclass(frozen=True, slots=True)
class ScaleState:
    """The target's ``/scale`` and the annotations of the target object."""

    spec_replicas: int
    status_replicas: int
    selector: str
    resource_version: str
    uid: str
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)


def scale_state(target_obj: Mapping[str, Any], scale: Mapping[str, Any]) -> ScaleState:
    meta = target_obj.get("metadata") or {}
    status = scale.get("status") or {}
    return ScaleState(
        # A Scale omits spec.replicas when it is 0 (omitempty).
        spec_replicas=int((scale.get("spec") or {}).get("replicas") or 0),
        status_replicas=int(status.get("replicas") or 0),
        selector=str(status.get("selector") or ""),
        resource_version=str((scale.get("metadata") or {}).get("resourceVersion", "")),
        uid=str(meta.get("uid", "")),
        annotations=MappingProxyType({str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}),
    )


# ---------------------------------------------------------------------------------------------
# What the autoscaler remembers, on the target


@dataclass(frozen=True, slots=True)
class Removal:
    """A scale-down under way: ``nodes`` are marked for deletion; replicas go ``from_replicas``
    -> ``to_replicas``. Written before the /scale patch, so a restart between the two can tell
    whether the patch happened (replicas still ``from_replicas``) and finish it."""

    nodes: tuple[str, ...]
    from_replicas: int
    to_replicas: int
    at: float


@dataclass(frozen=True, slots=True)
class Record:
    provided: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))  # pod uid -> when
    replaced: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))  # node -> when
    scaled_up_at: float | None = None
    scaled_down_at: float | None = None
    removal: Removal | None = None


EMPTY_RECORD = Record()


def _times(raw: object) -> Mapping[str, float]:
    if not isinstance(raw, dict):
        return MappingProxyType({})
    return MappingProxyType(
        {str(k): float(v) for k, v in raw.items() if isinstance(v, int | float) and math.isfinite(v)}
    )


def _time(raw: object) -> float | None:
    return float(raw) if isinstance(raw, int | float) and math.isfinite(raw) else None


def record_from_annotation(text: str | None) -> Record:
    """Tolerant: a record someone mangled reads as empty (worst case: one duplicate decision)."""
    try:
        doc = json.loads(text or "{}")
    except ValueError:
        return EMPTY_RECORD
    if not isinstance(doc, dict):
        return EMPTY_RECORD
    removal = None
    r = doc.get("removal")
    if isinstance(r, dict):
        try:
            removal = Removal(tuple(str(n) for n in r["nodes"]), int(r["from"]), int(r["to"]), float(r["at"]))
        except (KeyError, TypeError, ValueError):
            removal = None
    return Record(
        provided=_times(doc.get("provided")),
        replaced=_times(doc.get("replaced")),
        scaled_up_at=_time(doc.get("scaledUpAt")),
        scaled_down_at=_time(doc.get("scaledDownAt")),
        removal=removal,
    )


def record_to_annotation(record: Record) -> str:
    doc: dict[str, Any] = {
        "provided": {k: round(v, 3) for k, v in sorted(record.provided.items())},
        "replaced": {k: round(v, 3) for k, v in sorted(record.replaced.items())},
    }
    if record.scaled_up_at is not None:
        doc["scaledUpAt"] = round(record.scaled_up_at, 3)
    if record.scaled_down_at is not None:
        doc["scaledDownAt"] = round(record.scaled_down_at, 3)
    if record.removal is not None:
        rm = record.removal
        doc["removal"] = {
            "nodes": list(rm.nodes),
            "from": rm.from_replicas,
            "to": rm.to_replicas,
            "at": rm.at,
        }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def pool_of(labels: Mapping[str, str], pool_label: str) -> str:
    """The pool a node belongs to, by its pool label ("default" without one)."""
    return labels.get(pool_label) or "default"
