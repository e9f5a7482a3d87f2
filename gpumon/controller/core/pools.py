"""GPU node pools: their declarations in config (pydantic, at the edge), the frozen values the
planner works with, and the views of cluster objects it reads. Pure: no I/O.

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
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpumon.configtypes import Float, Int, NoBool
from gpumon.controller.core import contract as c
from gpumon.controller.core.demand import SharedCards, Template, milli
from gpumon.controller.core.objects import LabelSelector, Requirement, Taint, from_rfc3339
from gpumon.exporter.sharing import CGPU_CORE_RESOURCE, GPUSHARE_MEMORY_RESOURCE

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
GPUSHARE_COUNT_RESOURCE = "aliyun.com/gpu-count"

_KNOWN_PLURALS = {
    "MachineDeployment": "machinedeployments",
    "MachineSet": "machinesets",
    "MachinePool": "machinepools",
}


# ---------------------------------------------------------------------------------------------
# Config (the edge): ControllerConfig.pools


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TargetConfig(_Model):
    group: str = "cluster.x-k8s.io"
    version: str = Field("v1beta2", min_length=1)
    kind: str = Field("MachineDeployment", min_length=1)
    # The plural resource name in the URL; derived from kind when left out.
    resource: str | None = None
    namespace: str = Field(..., min_length=1)
    name: str = Field(..., min_length=1)


class TaintConfig(_Model):
    key: str = Field(..., min_length=1)
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class SharedGpusConfig(_Model):
    """gpushare/cGPU: the node's GPUs are split by memory (``aliyun.com/gpu-mem`` units per
    card, GiB by default) and core percentage (100 per card)."""

    cards: Int = Field(..., ge=1, le=64)
    memory_per_card: Int = Field(..., ge=1)


class TemplateConfig(_Model):
    # Allocatable resources of one node, as quantities: {"nvidia.com/gpu": 8, "cpu": "96", ...}.
    resources: dict[str, Annotated[str | int, NoBool]] = Field(default_factory=dict)
    shared_gpus: SharedGpusConfig | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[TaintConfig] = Field(default_factory=list)

    @field_validator("resources")
    @classmethod
    def _quantities(cls, v: dict[str, str | int]) -> dict[str, str | int]:
        bad = [k for k, q in v.items() if milli(q) is None or (milli(q) or 0) < 0]
        if bad:
            raise ValueError("not a quantity: " + ", ".join(f"{k}={v[k]!r}" for k in sorted(bad)))
        return v

    @model_validator(mode="after")
    def _has_gpus(self) -> TemplateConfig:
        if not Template(resources=_resources(self)).gpu_resources:
            raise ValueError("a GPU pool's template needs a GPU resource (resources or shared_gpus)")
        return self


class PoolConfig(_Model):
    name: str = Field(..., min_length=1, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    target: TargetConfig
    # Label selector of the pool's nodes, e.g. "cluster.x-k8s.io/deployment-name=gpu-a".
    node_selector: str = Field(..., min_length=1)
    template: TemplateConfig
    # None: taken from cluster-autoscaler's annotations when allow_cluster_autoscaler is set.
    min_replicas: Int | None = Field(None, ge=0)
    max_replicas: Int | None = Field(None, ge=0)
    max_step: Int = Field(10, ge=1)
    scale_up_cooldown_seconds: Float = Field(0.0, ge=0)
    scale_down_cooldown_seconds: Float = Field(300.0, ge=0)
    scale_down_unneeded_seconds: Float = Field(600.0, ge=0)
    scale_down_drain_timeout_seconds: Float = Field(600.0, gt=0)
    arriving_timeout_seconds: Float = Field(900.0, gt=0)
    headroom_nodes: Int = Field(0, ge=0)
    replace_quarantined: bool = True
    allow_cluster_autoscaler: bool = False

    @field_validator("node_selector")
    @classmethod
    def _selector(cls, v: str) -> str:
        parse_selector(v)
        return v

    @model_validator(mode="after")
    def _bounds(self) -> PoolConfig:
        if self.max_replicas is None and not self.allow_cluster_autoscaler:
            raise ValueError(
                "max_replicas is required (or allow_cluster_autoscaler to read it from the target)"
            )
        if (
            self.min_replicas is not None
            and self.max_replicas is not None
            and self.min_replicas > self.max_replicas
        ):
            raise ValueError("min_replicas must be <= max_replicas")
        return self


def unique_pool_names(pools: list[PoolConfig]) -> list[PoolConfig]:
    """For ControllerConfig: pool names and targets are unique (one writer per target)."""
    names = [p.name for p in pools]
    targets = [(p.target.group, p.target.kind, p.target.namespace, p.target.name) for p in pools]
    if len(set(names)) != len(names):
        raise ValueError("pool names must be unique")
    if len(set(targets)) != len(targets):
        raise ValueError("two pools name the same target")
    return pools


_SET_TERM = re.compile(r"^([^\s!=(),]+)\s+(in|notin)\s+\(([^()]*)\)$")
_KEY = re.compile(r"^[^\s!=(),]+$")
_EQUALITY_TERM = re.compile(r"^([^\s!=(),]+)\s*(==|!=|=)\s*([^\s!=(),]*)$")


def parse_selector(text: str) -> LabelSelector:
    """A label selector string (``a=b,c!=d,e in (f,g),f notin (h),!i,j``) as a
    :class:`LabelSelector`; raises ValueError naming the bad term."""
    labels: dict[str, str] = {}
    expressions: list[Requirement] = []
    for raw in re.split(r",(?![^(]*\))", text):
        term = raw.strip()
        if m := _SET_TERM.match(term):
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            expressions.append(Requirement(m.group(1), "In" if m.group(2) == "in" else "NotIn", values))
            continue
        m = _EQUALITY_TERM.match(term)
        if m and m.group(2) == "!=":
            expressions.append(Requirement(m.group(1), "NotIn", frozenset({m.group(3)})))
        elif m:
            labels[m.group(1)] = m.group(3)
        elif term.startswith("!") and _KEY.match(term[1:].strip()):
            expressions.append(Requirement(term[1:].strip(), "DoesNotExist"))
        elif _KEY.match(term):
            expressions.append(Requirement(term, "Exists"))
        else:
            raise ValueError(f"bad selector term {term!r}")
    return LabelSelector(MappingProxyType(labels), tuple(expressions))


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


def _resources(t: TemplateConfig) -> dict[str, int]:
    out = {name: milli(q) or 0 for name, q in t.resources.items()}
    if t.shared_gpus is not None:
        s = t.shared_gpus
        out.setdefault(GPUSHARE_MEMORY_RESOURCE, s.cards * s.memory_per_card * 1000)
        out.setdefault(GPUSHARE_COUNT_RESOURCE, s.cards * 1000)
        out.setdefault(CGPU_CORE_RESOURCE, s.cards * 100 * 1000)
    return out


def pool_from_config(p: PoolConfig) -> Pool:
    t = p.target
    selector = parse_selector(p.node_selector)
    tc = p.template
    # A pool's nodes carry its selector's labels, so a pod selecting them can land on a new one.
    labels = {**selector.match_labels, **tc.labels}
    return Pool(
        name=p.name,
        target=ScaleTarget(
            t.group,
            t.version,
            t.kind,
            t.resource or _KNOWN_PLURALS.get(t.kind, t.kind.lower() + "s"),
            t.namespace,
            t.name,
        ),
        node_selector=p.node_selector,
        template=Template(
            resources=MappingProxyType(_resources(tc)),
            labels=MappingProxyType(labels),
            taints=tuple(Taint(x.key, x.effect, x.value) for x in tc.taints),
            shared=SharedCards(tc.shared_gpus.cards, tc.shared_gpus.memory_per_card * 1000)
            if tc.shared_gpus
            else None,
        ),
        min_replicas=p.min_replicas,
        max_replicas=p.max_replicas,
        max_step=p.max_step,
        scale_up_cooldown_seconds=p.scale_up_cooldown_seconds,
        scale_down_cooldown_seconds=p.scale_down_cooldown_seconds,
        scale_down_unneeded_seconds=p.scale_down_unneeded_seconds,
        scale_down_drain_timeout_seconds=p.scale_down_drain_timeout_seconds,
        arriving_timeout_seconds=p.arriving_timeout_seconds,
        headroom_nodes=p.headroom_nodes,
        replace_quarantined=p.replace_quarantined,
        allow_cluster_autoscaler=p.allow_cluster_autoscaler,
    )


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
