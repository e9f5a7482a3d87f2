"""What status reads from the cluster, as slim frozen views built from raw JSON (pure).

Nodes, pods and PDBs reuse the controller's own projections (:mod:`gpumon.controller.core.objects`),
so status sees a node exactly as the controller does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpumon.controller.core.contract import DRY_RUN_PREFIX, TAINT_KEY
from gpumon.controller.core.contract.autoscaler import Record, record_of
from gpumon.controller.core.node_owner import NodeOwner, node_owner
from gpumon.controller.core.objects import (
    GpuResources,
    NodeView,
    PdbView,
    PodView,
    node_from_json,
    pod_from_json,
)
from gpumon.controller.core.pools import Pool, ScaleState
from gpumon.k8s.resources import GPU_COUNT_RESOURCES
from gpumon.wire.v1 import SnapshotDoc


@dataclass(frozen=True, slots=True)
class NodeInfo:
    view: NodeView
    gpus: int  # whole GPUs in the node's capacity
    ready: bool
    owner: NodeOwner | None = None  # its Cluster API Machine or Karpenter NodeClaim


@dataclass(frozen=True, slots=True)
class PodInfo:
    view: PodView
    gpus: int  # whole GPUs requested (limits, else requests), init containers included
    created_at: str | None = None


@dataclass(frozen=True, slots=True)
class EventInfo:
    """One Event the controller recorded."""

    kind: str  # of the object it is about: Node, Pod, ConfigMap
    namespace: str
    name: str
    reason: str
    message: str
    warning: bool
    at: str | None  # RFC 3339, last seen
    # Orders Events within one second (their timestamps' resolution): the resourceVersion, which
    # is the store's revision and grows with every write. 0 when not a number.
    sequence: int = 0

    @property
    def about(self) -> str:
        """``Node/n1``, ``Pod/ns/name``, ``ConfigMap/ns/name``."""
        return "/".join(x for x in (self.kind, self.namespace, self.name) if x)

    @property
    def dry_run(self) -> bool:
        return self.message.startswith(DRY_RUN_PREFIX)


@dataclass(frozen=True, slots=True)
class PoolTarget:
    """A node pool's ``/scale`` target: one of the controller's configured pools (``pool`` set),
    or a Cluster API object found in the cluster."""

    kind: str
    namespace: str
    name: str
    pool: str = ""  # the controller's pool name; "" when not configured as one
    desired: int | None = None  # spec.replicas: what was asked for
    current: int | None = None  # status.replicas
    min_replicas: int | None = None
    max_replicas: int | None = None
    record: Record | None = None  # what the autoscaler remembers, from the target's annotation
    error: str | None = None  # why it could not be read


@dataclass(frozen=True, slots=True)
class ClusterState:
    """Everything one status round read. ``problems`` names what could not be read; the views
    built from a partial state say so rather than fail."""

    now: float
    nodes: tuple[NodeInfo, ...] = ()
    pods: tuple[PodInfo, ...] = ()  # GPU pods: on quarantined nodes, and pending ones
    pdbs: tuple[PdbView, ...] = ()
    events: tuple[EventInfo, ...] = ()  # oldest first
    # The controller's state ConfigMap's annotations (open breakers, pause); None if unread.
    state_annotations: Mapping[str, str] | None = None
    pools: tuple[PoolTarget, ...] = ()
    metrics: str | None = None  # the controller's /metrics text, when it answered
    metrics_source: str = ""
    metrics_error: str | None = None
    snapshot: SnapshotDoc | None = None  # an exporter's /api/v1/snapshot (explain only)
    snapshot_source: str = ""
    snapshot_error: str | None = None
    problems: tuple[str, ...] = field(default=())


def _int(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def node_info(obj: Mapping[str, Any], resources: GpuResources) -> NodeInfo:
    status = obj.get("status") or {}
    capacity = status.get("capacity") or {}
    # Only counts of GPUs: a gpushare node's 32 GiB of aliyun.com/gpu-mem are no 32 GPUs.
    gpus = sum(_int(v) for k, v in capacity.items() if k in resources.names and k in GPU_COUNT_RESOURCES)
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
    )
    return NodeInfo(node_from_json(obj), gpus, ready, node_owner(obj))


def is_gpu_node(node: NodeInfo) -> bool:
    """A node with GPUs, or one gpumon has written on (its GPUs may have vanished)."""
    v = node.view
    return node.gpus > 0 or bool(v.annotations) or any(t.key == TAINT_KEY for t in v.taints)


def requested_gpus(obj: Mapping[str, Any], resources: GpuResources) -> int:
    """Whole GPUs a pod asks for, as the scheduler counts them: the larger of its containers'
    sum and its largest init container."""
    spec = obj.get("spec") or {}

    def count(c: Mapping[str, Any]) -> int:
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        return sum(
            _int(limits.get(r, requests.get(r)))
            for r in resources.names & GPU_COUNT_RESOURCES
            if r in limits or r in requests
        )

    main = sum(count(c) for c in spec.get("containers") or ())
    init = max((count(c) for c in spec.get("initContainers") or ()), default=0)
    return max(main, init)


def pod_info(obj: Mapping[str, Any], resources: GpuResources) -> PodInfo:
    created = (obj.get("metadata") or {}).get("creationTimestamp")
    return PodInfo(pod_from_json(obj, resources), requested_gpus(obj, resources), created)


def event_info(obj: Mapping[str, Any]) -> EventInfo:
    involved = obj.get("involvedObject") or {}
    meta = obj.get("metadata") or {}
    at = obj.get("lastTimestamp") or obj.get("eventTime") or obj.get("firstTimestamp")
    return EventInfo(
        kind=str(involved.get("kind", "")),
        namespace=str(involved.get("namespace") or ""),
        name=str(involved.get("name", "")),
        reason=str(obj.get("reason", "")),
        message=str(obj.get("message", "")),
        warning=obj.get("type") == "Warning",
        at=str(at or meta.get("creationTimestamp") or "") or None,
        sequence=_int(meta.get("resourceVersion")),
    )


def discovered_target(obj: Mapping[str, Any]) -> PoolTarget:
    """A Cluster API object the controller is not configured to size."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    replicas = status.get("replicas")
    return PoolTarget(
        kind=str(obj.get("kind", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        desired=None if spec.get("replicas") is None else _int(spec.get("replicas")),
        current=None if replicas is None else _int(replicas),
    )


def pool_target(pool: Pool, scale: ScaleState | None, error: str | None = None) -> PoolTarget:
    t = pool.target
    return PoolTarget(
        kind=t.kind,
        namespace=t.namespace,
        name=t.name,
        pool=pool.name,
        desired=None if scale is None else scale.spec_replicas,
        current=None if scale is None else scale.status_replicas,
        min_replicas=pool.min_replicas,
        max_replicas=pool.max_replicas,
        record=None if scale is None else record_of(scale.annotations),
        error=error,
    )
