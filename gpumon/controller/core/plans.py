"""What the planners decide and the actuators carry out: frozen values, no I/O."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpumon.controller.core.contract import NodePhase
from gpumon.controller.core.objects import PdbView, PodView


@dataclass(frozen=True, slots=True)
class ObjectRef:
    kind: str  # Node, Pod
    name: str
    uid: str = ""
    namespace: str = ""  # "" for cluster-scoped objects
    api_version: str = "v1"


@dataclass(frozen=True, slots=True)
class Event:
    """A Kubernetes Event on ``about``; ``key`` groups repeats so a recorder can skip them."""

    about: ObjectRef
    reason: str
    message: str
    warning: bool = False
    key: str = ""


class PlanKind(enum.StrEnum):
    NONE = "none"
    QUARANTINE = "quarantine"
    UPDATE = "update"
    RECOVER = "recover"
    REFUSED = "refused"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class NodeWrite:
    """At most two writes: a JSON merge patch of metadata and spec, guarded by the node's
    resourceVersion (409 on a concurrent change), and a strategic merge patch of the status
    subresource that touches only the GpuUnhealthy condition (merged by its type)."""

    node: str
    merge_patch: Mapping[str, Any] | None = None
    status_patch: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class NodePlan:
    kind: PlanKind
    write: NodeWrite | None = None
    events: tuple[Event, ...] = ()


NO_PLAN = NodePlan(PlanKind.NONE)


@dataclass(frozen=True, slots=True)
class DrainTarget:
    pod: PodView
    why: str  # "uses GPU 3 (GPU-…)", "GPU pod on an unhealthy node", ...
    pdbs: tuple[PdbView, ...] = ()


@dataclass(frozen=True, slots=True)
class DrainPlan:
    phase: NodePhase  # DRAINING while pods remain, else DRAINED
    targets: tuple[DrainTarget, ...]
    partial: bool  # only the pods on the bad GPUs
    deadline_at: float
    overdue: bool  # the deadline passed with pods left: time to escalate
    skipped: tuple[tuple[PodView, str], ...] = ()  # DaemonSet and mirror pods, with why
