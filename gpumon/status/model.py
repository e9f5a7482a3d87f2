"""The views ``gpumon status`` shows: frozen values, no I/O. Times are RFC 3339 strings as the
cluster holds them, with ages in seconds beside them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

_EMPTY: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class GpuProblem:
    """One entry of ``gpumon.io/unhealthy-gpus``: which rule fired on which GPU, on what."""

    index: int | None  # None for a node-scoped finding
    uuid: str
    reason: str
    severity: str
    rules: tuple[str, ...]
    first_seen: str
    evidence: str


@dataclass(frozen=True, slots=True)
class Breaker:
    pool: str
    opened_at: str
    reason: str


@dataclass(frozen=True, slots=True)
class NodeStatus:
    name: str
    pool: str
    gpus: int
    ready: bool
    state: str  # gpumon.io/state: quarantined | draining | drained | recovering, or ""
    quarantined_at: str | None
    quarantined_for_seconds: float | None
    severity: str | None
    reason: str  # the GpuUnhealthy condition's reason
    problems: tuple[GpuProblem, ...]
    taint: str | None  # our taint's effect
    cordoned: bool
    cordoned_by_person: bool  # the cordon was there before gpumon acted
    excluded: bool  # gpumon.io/exclude=true
    machinery: str = "none"  # what owns the node: cluster-api | karpenter | none
    owner: str | None = None  # the object that does: "Machine ns/name", "NodeClaim name"
    evicted: tuple[str, ...] = ()  # namespace/name of pods the controller evicted (or deleted)


@dataclass(frozen=True, slots=True)
class Blocker:
    pod: str  # namespace/name
    pdbs: tuple[str, ...]  # namespace/name of the PDBs covering it now
    message: str  # the controller's last word on it (a GpuEvictionBlocked Event)


@dataclass(frozen=True, slots=True)
class Drain:
    node: str
    started_at: str | None
    running_for_seconds: float | None
    gpu_pods_left: int
    blockers: tuple[Blocker, ...]


@dataclass(frozen=True, slots=True)
class Refusal:
    about: str  # Node/name, ConfigMap/ns/name
    reason: str
    message: str
    at: str | None


@dataclass(frozen=True, slots=True)
class GpuCounts:
    healthy: int = 0
    degraded: int = 0
    unhealthy: int = 0
    lost: int = 0


@dataclass(frozen=True, slots=True)
class PoolStatus:
    name: str
    nodes: int
    gpus: GpuCounts
    quarantined: int
    breaker: Breaker | None
    # Its nodes by what owns them (cluster-api, karpenter, none).
    machinery: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class PendingPod:
    pod: str
    gpus: int
    pending_for_seconds: float | None


@dataclass(frozen=True, slots=True)
class ScaleTargetStatus:
    """A node pool's /scale target: what was asked, what is there, and the autoscaler's record."""

    pool: str  # the controller's pool name; "" for a target it is not configured to size
    target: str  # Kind namespace/name
    desired: int | None
    current: int | None
    min_replicas: int | None
    max_replicas: int | None
    scaled_up_at: str | None = None
    scaled_down_at: str | None = None
    pods_provided_for: int = 0  # pending pods a scale-up was made for
    replacing: tuple[str, ...] = ()  # quarantined nodes a replacement was asked for
    removing: tuple[str, ...] = ()  # nodes of a scale-down under way
    last_decision: str | None = None  # the latest Event on the target: "Reason: message"
    last_decision_at: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ControllerStatus:
    reachable: bool
    source: str  # where /metrics was read from
    error: str | None = None
    leader: bool | None = None  # of the replica that answered
    dry_run: bool | None = None
    dry_run_from: str = ""  # "metrics" | "events" | "" (unknown)
    paused: bool | None = None
    breakers_open: tuple[str, ...] = ()
    signals: Mapping[str, float] = field(default_factory=lambda: _EMPTY)  # fresh/stale/missing nodes
    evictions: Mapping[str, float] = field(default_factory=lambda: _EMPTY)  # by result


@dataclass(frozen=True, slots=True)
class FleetStatus:
    taken_at: str
    controller: ControllerStatus
    pools: tuple[PoolStatus, ...]
    quarantined: tuple[NodeStatus, ...]
    drains: tuple[Drain, ...]
    refusals: tuple[Refusal, ...]  # recent refusals about nodes that are not quarantined
    pending: tuple[PendingPod, ...]
    scaling: tuple[ScaleTargetStatus, ...]
    problems: tuple[str, ...]  # what could not be read


@dataclass(frozen=True, slots=True)
class GpuSignals:
    """A GPU as the node's exporter sees it now."""

    index: int
    uuid: str
    model: str
    health: str
    reasons: tuple[str, ...]
    temperature_celsius: float | None
    ecc_uncorrected: int | None
    xids: Mapping[int, int]  # Xid code -> times seen since the exporter started
    lost: bool


@dataclass(frozen=True, slots=True)
class Condition:
    status: str
    reason: str
    message: str
    since: str | None


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    at: str | None
    reason: str
    message: str
    warning: bool
    about: str  # Node/name, Pod/ns/name, ConfigMap/ns/name


@dataclass(frozen=True, slots=True)
class RepairStep:
    attempt: int
    step: str
    gpus: tuple[str, ...]  # UUIDs; empty for the whole node
    started: str
    outcome: str
    ended: str | None
    detail: str


@dataclass(frozen=True, slots=True)
class RepairLadder:
    """The node's repair ladder as its record (gpumon.io/repair) tells it."""

    steps: tuple[RepairStep, ...]
    gave_up_at: str | None
    validated_at: str | None
    next: str  # what comes next, in words


@dataclass(frozen=True, slots=True)
class Explanation:
    taken_at: str
    node: NodeStatus
    condition: Condition | None
    signals: tuple[GpuSignals, ...]
    signals_source: str
    signals_error: str | None
    timeline: tuple[TimelineEntry, ...]  # what the controller did and refused, oldest first
    refused: tuple[str, ...]  # why it does not (or did not) act, now
    blockers: tuple[Blocker, ...]
    lift: tuple[str, ...]  # what would lift the quarantine
    controller: ControllerStatus
    problems: tuple[str, ...]
    repair: RepairLadder | None = None  # None: no ladder recorded on the node
