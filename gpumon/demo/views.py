"""What the demo sees of the cluster at one moment, parsed from raw API objects and exporter
snapshots (already parsed with the wire schema) into frozen values. Pure: the expectations,
the live table and the log lines are all functions of a :class:`ClusterView`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from gpumon.controller.core.contract import (
    ANNOTATION_REPAIR_NODE,
    CONDITION_TYPE,
    LABEL_REPAIR_STEP,
    LABEL_STATE,
    TAINT_KEY,
)
from gpumon.controller.core.repair_jobs import job_work
from gpumon.devcluster import nodes
from gpumon.devcluster.nodes import POOL_LABEL
from gpumon.devcluster.workloads import APP_LABEL
from gpumon.k8s.resources import GPUSHARE_MEMORY_RESOURCE
from gpumon.k8s.sharing import GPUSHARE_INDEX
from gpumon.wire import v1 as wire


def _time(stamp: str | None) -> float:
    if not stamp:
        return 0.0
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    ready: bool
    unschedulable: bool
    taint: str | None  # effect of gpumon's taint, when present
    condition: bool  # GpuUnhealthy=True
    condition_reason: str
    state: str | None  # gpumon.io/state label
    pool: str | None
    os: str
    gpu_resources: Mapping[str, str]  # allocatable GPU resources (empty while the plugin starts)


@dataclass(frozen=True, slots=True)
class PodRow:
    namespace: str
    name: str
    app: str
    node: str | None
    phase: str
    deleting: bool
    created_at: float
    container: str = ""  # the first container: a device plugin's devices go to it here
    gpus: int = 0  # nvidia.com/gpu limits, summed over containers
    gpu_memory: int = 0  # aliyun.com/gpu-mem limits (GiB), summed
    gpushare_index: int | None = None  # the GPU a gpushare scheduler placed it on

    @property
    def running(self) -> bool:
        return self.phase == "Running" and not self.deleting

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def holds_node(self) -> bool:
        """Bound and not finished: the kubelet keeps its devices."""
        return self.node is not None and self.phase not in ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class PoolRow:
    name: str
    desired: int  # spec.replicas: what the controller asked for
    replicas: int  # status.replicas: booting + joined
    available: int  # joined with GPUs allocatable


@dataclass(frozen=True, slots=True)
class JobRow:
    """A repair step's Job, which the controller runs on a node (docs/controller.md, "Repair")."""

    name: str
    node: str  # the node it repairs
    step: str  # reset, reboot, validate
    state: str  # absent, running, succeeded, failed: as the repair ladder reads it
    created_at: float


@dataclass(frozen=True, slots=True)
class ActionEvent:
    at: float
    about: str  # kind/name
    reason: str
    message: str
    warning: bool


@dataclass(frozen=True, slots=True)
class GpuView:
    index: int
    uuid: str
    state: str  # the exporter's health verdict
    utilization: float | None
    pods: tuple[str, ...]  # namespace/pod, as the exporter attributes them


@dataclass(frozen=True, slots=True)
class ClusterView:
    at: float
    nodes: tuple[NodeRow, ...] = ()
    pods: tuple[PodRow, ...] = ()
    pool: PoolRow | None = None
    events: tuple[ActionEvent, ...] = ()  # the controller's, oldest first
    jobs: tuple[JobRow, ...] = ()  # the repair steps' Jobs, oldest first
    # node -> its GPUs as its exporter reports them; a node whose exporter did not answer is absent.
    gpus: Mapping[str, tuple[GpuView, ...]] = field(default_factory=lambda: MappingProxyType({}))

    def node(self, name: str) -> NodeRow | None:
        return next((n for n in self.nodes if n.name == name), None)

    def pods_of(self, app: str) -> tuple[PodRow, ...]:
        return tuple(p for p in self.pods if p.app == app)

    def jobs_of(self, node: str, step: str) -> tuple[JobRow, ...]:
        return tuple(j for j in self.jobs if j.node == node and j.step == step)

    def pool_nodes(self) -> tuple[NodeRow, ...]:
        return tuple(n for n in self.nodes if self.pool is not None and n.pool == self.pool.name)


def node_view(obj: Mapping[str, Any]) -> NodeRow:
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    labels = meta.get("labels") or {}
    conditions = {c["type"]: c for c in status.get("conditions") or ()}
    ours = conditions.get(CONDITION_TYPE) or {}
    taint = next((t for t in spec.get("taints") or () if t.get("key") == TAINT_KEY), None)
    gpu_keys = (nodes.GPU, nodes.SHARED_GPU_MEMORY, nodes.SHARED_GPU_COUNT)
    return NodeRow(
        name=meta["name"],
        ready=(conditions.get("Ready") or {}).get("status") == "True",
        unschedulable=bool(spec.get("unschedulable")),
        taint=taint.get("effect") if taint else None,
        condition=ours.get("status") == "True",
        condition_reason=str(ours.get("reason") or ""),
        state=labels.get(LABEL_STATE),
        pool=labels.get(POOL_LABEL),
        os=labels.get("kubernetes.io/os", "linux"),
        gpu_resources=MappingProxyType(
            {k: v for k, v in (status.get("allocatable") or {}).items() if k in gpu_keys}
        ),
    )


def _limit(containers: Sequence[Mapping[str, Any]], resource: str) -> int:
    total = 0
    for c in containers:
        value = ((c.get("resources") or {}).get("limits") or {}).get(resource)
        total += int(value) if value is not None and str(value).isdigit() else 0
    return total


def pod_view(obj: Mapping[str, Any]) -> PodRow:
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    containers = spec.get("containers") or ()
    index = (meta.get("annotations") or {}).get(GPUSHARE_INDEX)
    return PodRow(
        namespace=meta["namespace"],
        name=meta["name"],
        app=(meta.get("labels") or {}).get(APP_LABEL, ""),
        node=spec.get("nodeName"),
        phase=status.get("phase", "Pending"),
        deleting=meta.get("deletionTimestamp") is not None,
        created_at=_time(meta.get("creationTimestamp")),
        container=str(containers[0].get("name", "")) if containers else "",
        gpus=_limit(containers, nodes.GPU),
        gpu_memory=_limit(containers, GPUSHARE_MEMORY_RESOURCE),
        gpushare_index=int(index) if index is not None and index.isdigit() else None,
    )


def pool_view(md: Mapping[str, Any]) -> PoolRow:
    spec, status = md.get("spec") or {}, md.get("status") or {}
    return PoolRow(
        name=md["metadata"]["name"],
        desired=int(spec.get("replicas", 0)),
        replicas=int(status.get("replicas", 0)),
        available=int(status.get("availableReplicas", 0)),
    )


def job_view(obj: Mapping[str, Any]) -> JobRow:
    meta = obj["metadata"]
    return JobRow(
        name=meta["name"],
        node=str((meta.get("annotations") or {}).get(ANNOTATION_REPAIR_NODE, "")),
        step=str((meta.get("labels") or {}).get(LABEL_REPAIR_STEP, "")),
        state=job_work(obj).value,
        created_at=_time(meta.get("creationTimestamp")),
    )


def event_view(obj: Mapping[str, Any]) -> ActionEvent:
    involved = obj.get("involvedObject") or {}
    stamp = obj.get("lastTimestamp") or obj.get("eventTime") or obj["metadata"].get("creationTimestamp")
    return ActionEvent(
        at=_time(stamp),
        about=f"{involved.get('kind', '')}/{involved.get('name', '')}",
        reason=str(obj.get("reason", "")),
        message=str(obj.get("message", "")),
        warning=obj.get("type") == "Warning",
    )


def gpu_views(snapshot: wire.SnapshotDoc) -> tuple[GpuView, ...]:
    pods: dict[int, list[str]] = {}
    for p in snapshot.pods:
        name = f"{p.ref.namespace}/{p.ref.pod}"
        held = pods.setdefault(p.gpu_index, [])
        if name not in held:  # one entry per container
            held.append(name)
    return tuple(
        sorted(
            (
                GpuView(
                    index=g.identity.index,
                    uuid=g.identity.uuid,
                    state=g.health.state.value,
                    utilization=None if g.fast is None else g.fast.utilization_ratio,
                    pods=tuple(pods.get(g.identity.index, ())),
                )
                for g in snapshot.gpus
            ),
            key=lambda g: g.index,
        )
    )


def cluster_view(
    at: float,
    *,
    node_objs: Sequence[Mapping[str, Any]],
    pod_objs: Sequence[Mapping[str, Any]],
    pool_obj: Mapping[str, Any] | None,
    event_objs: Sequence[Mapping[str, Any]],
    snapshots: Mapping[str, wire.SnapshotDoc],
    job_objs: Sequence[Mapping[str, Any]] = (),
) -> ClusterView:
    return ClusterView(
        at=at,
        nodes=tuple(sorted((node_view(n) for n in node_objs), key=lambda n: n.name)),
        pods=tuple(sorted((pod_view(p) for p in pod_objs), key=lambda p: (p.app, p.name))),
        pool=pool_view(pool_obj) if pool_obj is not None else None,
        events=tuple(sorted((event_view(e) for e in event_objs), key=lambda e: e.at)),
        jobs=tuple(sorted((job_view(j) for j in job_objs), key=lambda j: (j.created_at, j.name))),
        gpus=MappingProxyType({node: gpu_views(s) for node, s in snapshots.items()}),
    )
