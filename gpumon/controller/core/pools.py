"""GPU node pools: the frozen values the planner works with, the views of cluster objects it
reads. Pure: no I/O. Their declarations in config are gpumon.config.pools;
gpumon.controller.configure turns those into these values.

A pool is a ``/scale`` target (a Cluster API MachineDeployment, MachineSet or MachinePool, or
any object with a scale subresource), the label selector of its nodes, and the template of a
node it adds. What the autoscaler must remember between rounds (which pods a scale-up was
for, which quarantined nodes got a replacement, when it last scaled, a scale-down under way)
is kept on the target itself (:mod:`gpumon.controller.core.contract.autoscaler`), so a
restarted or new leader carries on where the last one stopped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpumon.controller.core import contract as c
from gpumon.controller.core.demand import Template
from gpumon.controller.core.objects import from_rfc3339
from gpumon.controller.core.repair_jobs import PoolRepair
from gpumon.k8s.resources import milli

_EMPTY: Mapping[str, str] = MappingProxyType({})

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
    karpenter_nodepool: str | None = None  # Karpenter launched it, for this NodePool


def pool_node_from_json(obj: Mapping[str, Any], template: Template) -> PoolNode:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    allocatable = (obj.get("status") or {}).get("allocatable") or {}
    removing = annotations.get(c.REMOVING_ANNOTATION)
    return PoolNode(
        name=str(meta.get("name", "")),
        created_at=from_rfc3339(str(meta.get("creationTimestamp", ""))) or 0.0,
        gpus_allocatable=all((milli(allocatable.get(r, 0)) or 0) > 0 for r in template.gpu_resources),
        quarantined=c.LABEL_STATE in labels,
        excluded=labels.get(c.LABEL_EXCLUDE) == "true",
        unschedulable=bool(spec.get("unschedulable", False)),
        deleting=meta.get("deletionTimestamp") is not None,
        marked=c.DELETE_MACHINE_ANNOTATION in annotations,
        removing_since=from_rfc3339(removing) if removing else None,
        machine=annotations.get(c.MACHINE_ANNOTATION),
        machine_namespace=annotations.get(c.MACHINE_NAMESPACE_ANNOTATION),
        karpenter_nodepool=labels.get(c.KARPENTER_NODEPOOL_LABEL),
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


def pool_of(labels: Mapping[str, str], pool_label: str) -> str:
    """The pool a node belongs to, by its pool label ("default" without one)."""
    return labels.get(pool_label) or "default"
