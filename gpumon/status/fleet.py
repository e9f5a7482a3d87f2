"""The fleet view (pure): pools, GPUs by health, quarantined nodes, drains and their blockers,
decisions not carried out, pending GPU demand and the /scale targets."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import fields

from gpumon.controller.core import contract as c
from gpumon.controller.core.contract.breakers import breakers_from_annotations
from gpumon.controller.core.contract.node import is_excluded, is_quarantined, node_records
from gpumon.controller.core.objects import pdbs_covering, to_rfc3339
from gpumon.controller.core.pools import pool_of
from gpumon.gpu.health import Severity
from gpumon.status.metrics import controller_status
from gpumon.status.model import (
    Blocker,
    Breaker,
    Drain,
    FleetStatus,
    GpuCounts,
    GpuProblem,
    NodeStatus,
    PendingPod,
    PoolStatus,
    Refusal,
    ScaleTargetStatus,
)
from gpumon.status.state import ClusterState, EventInfo, NodeInfo, PodInfo, PoolTarget, is_gpu_node
from gpumon.status.times import age

# Events that say the controller did not act, and why.
REFUSAL_REASONS = frozenset(
    {
        "GpuQuarantineRefused",
        "GpuQuarantineSkipped",
        "GpuActionPaused",
        "GpuSignalsLost",
        "GpuEvictionBlocked",
        "GpuEvictionFailed",
        "GpuDrainDeadlineExceeded",
    }
)
EVICTION_REASONS = frozenset({"GpuPodEvicted", "GpuPodDeleted"})
_LOST_REASON = "GpuLost"


def problems_of(node: NodeInfo) -> tuple[GpuProblem, ...]:
    return tuple(
        GpuProblem(
            index=r.index,
            uuid=r.uuid,
            reason=r.reason,
            severity=r.severity.value,
            rules=r.rules,
            first_seen=to_rfc3339(r.first_seen),
            evidence=r.evidence,
        )
        for r in node_records(node.view)
    )


def _worst(problems: Iterable[GpuProblem]) -> str | None:
    found = [Severity(p.severity) for p in problems]
    return max(found, key=lambda s: s.rank).value if found else None


def moved_from(node: str, e: EventInfo) -> bool:
    """Whether a Pod's Event says it was moved off ``node`` ("evicted from node n1: ...",
    "deleted from node n1 after the drain deadline: ...")."""
    return e.kind == "Pod" and re.search(rf"\bfrom node {re.escape(node)}\b", e.message) is not None


def evicted_from(node: str, events: Sequence[EventInfo]) -> tuple[str, ...]:
    """Pods the controller evicted (or, escalating, deleted) from ``node``, from their Events."""
    out = []
    for e in events:
        if e.reason in EVICTION_REASONS and moved_from(node, e):
            out.append(f"{e.namespace}/{e.name}" + (" (dry-run)" if e.dry_run else ""))
    return tuple(dict.fromkeys(out))


def node_status(node: NodeInfo, events: Sequence[EventInfo], now: float, pool_label: str) -> NodeStatus:
    v = node.view
    problems = problems_of(node)
    taint = next((t.effect for t in v.taints if t.key == c.TAINT_KEY), None)
    at = v.annotations.get(c.ANNOTATION_QUARANTINED_AT)
    condition = v.gpu_condition
    machinery, owner = _owned_by(node)
    return NodeStatus(
        name=v.name,
        pool=pool_of(v.labels, pool_label),
        gpus=node.gpus,
        ready=node.ready,
        state=v.labels.get(c.LABEL_STATE, ""),
        quarantined_at=at,
        quarantined_for_seconds=age(at, now),
        severity=_worst(problems),
        reason=condition.reason if condition is not None and condition.status == "True" else "",
        problems=problems,
        taint=taint,
        cordoned=v.unschedulable,
        cordoned_by_person=v.annotations.get(c.ANNOTATION_CORDON_PREEXISTING) == "true",
        excluded=is_excluded(v),
        machinery=machinery,
        owner=owner,
        evicted=evicted_from(v.name, events),
    )


def _owned_by(node: NodeInfo) -> tuple[str, str | None]:
    """The machinery that owns the node and its object there (``Machine ns/name``)."""
    o = node.owner
    if o is None:
        return "none", None
    return o.machinery, f"{o.kind} {o.namespace}/{o.name}" if o.namespace else f"{o.kind} {o.name}"


def gpu_counts(node: NodeInfo, problems: Sequence[GpuProblem]) -> GpuCounts:
    def bucket(p: GpuProblem) -> str:
        return "lost" if p.reason == _LOST_REASON else p.severity

    counts = {"healthy": 0, "degraded": 0, "unhealthy": 0, "lost": 0}
    whole_node = [p for p in problems if not p.uuid]
    per_gpu = {p.uuid: p for p in problems if p.uuid}
    total = max(node.gpus, len(per_gpu))
    if whole_node:
        worst = max(whole_node, key=lambda p: Severity(p.severity).rank)
        counts[bucket(worst)] = total
    else:
        for p in per_gpu.values():
            counts[bucket(p)] += 1
        counts["healthy"] = total - len(per_gpu)
    return GpuCounts(**counts)


def blockers(node: str, pods: Sequence[PodInfo], state: ClusterState) -> tuple[Blocker, ...]:
    """GPU pods still on ``node`` whose eviction the controller reported refused, with the PDBs
    that cover them now."""
    refused = [
        e for e in state.events if e.kind == "Node" and e.name == node and e.reason == "GpuEvictionBlocked"
    ]
    out = []
    for pod in pods:
        key = f"{pod.view.namespace}/{pod.view.name}"
        said = [e.message for e in refused if f"{key} " in e.message]
        if said and not pod.view.terminating:
            pdbs = tuple(f"{p.namespace}/{p.name}" for p in pdbs_covering(pod.view, state.pdbs))
            out.append(Blocker(key, pdbs, said[-1]))
    return tuple(out)


def _on(node: str, pods: Sequence[PodInfo]) -> list[PodInfo]:
    return sorted(
        (p for p in pods if p.view.node_name == node and not p.view.finished), key=lambda p: p.view.key
    )


def drain(node: NodeInfo, state: ClusterState) -> Drain:
    v = node.view
    pods = _on(v.name, state.pods)
    started = v.annotations.get(c.ANNOTATION_DRAIN_STARTED_AT)
    movable = [p for p in pods if not p.view.mirror and p.view.owner_kind != "DaemonSet"]
    return Drain(v.name, started, age(started, state.now), len(movable), blockers(v.name, pods, state))


def breakers(state: ClusterState) -> dict[str, Breaker]:
    trips = breakers_from_annotations(state.state_annotations or {})
    return {pool: Breaker(pool, to_rfc3339(t.opened_at), t.reason) for pool, t in trips.items()}


def not_carried_out(events: Sequence[EventInfo], skip_nodes: set[str]) -> tuple[Refusal, ...]:
    """The latest refusal or dry-run decision per object and reason, except about ``skip_nodes``."""
    latest: dict[tuple[str, str], EventInfo] = {}
    for e in events:
        if e.kind == "Node" and e.name in skip_nodes:
            continue
        if e.reason in REFUSAL_REASONS or e.dry_run:
            latest[(e.about, e.reason)] = e
    return tuple(Refusal(about, reason, e.message, e.at) for (about, reason), e in sorted(latest.items()))


def pool_plan(t: PoolTarget, events: Sequence[EventInfo]) -> ScaleTargetStatus:
    said = [e for e in events if (e.kind, e.namespace, e.name) == (t.kind, t.namespace, t.name)]
    last = said[-1] if said else None
    record = t.record
    return ScaleTargetStatus(
        pool=t.pool,
        target=f"{t.kind} {t.namespace}/{t.name}",
        desired=t.desired,
        current=t.current,
        min_replicas=t.min_replicas,
        max_replicas=t.max_replicas,
        scaled_up_at=_stamp(record.scaled_up_at if record else None),
        scaled_down_at=_stamp(record.scaled_down_at if record else None),
        pods_provided_for=len(record.provided) if record else 0,
        replacing=tuple(sorted(record.replaced)) if record else (),
        removing=record.removal.nodes if record and record.removal else (),
        last_decision=f"{last.reason}: {last.message}" if last else None,
        last_decision_at=last.at if last else None,
        error=t.error,
    )


def _stamp(ts: float | None) -> str | None:
    return None if ts is None else to_rfc3339(ts)


def build_fleet(state: ClusterState, *, pool_label: str) -> FleetStatus:
    now = state.now
    gpu_nodes = [n for n in state.nodes if is_gpu_node(n)]
    statuses = {n.view.name: node_status(n, state.events, now, pool_label) for n in gpu_nodes}
    open_breakers = breakers(state)
    pools: dict[str, list[NodeInfo]] = {}
    for n in gpu_nodes:
        pools.setdefault(statuses[n.view.name].pool, []).append(n)
    pool_rows = []
    for name in sorted(pools.keys() | open_breakers.keys()):
        members = pools.get(name, [])
        counts = [gpu_counts(n, statuses[n.view.name].problems) for n in members]
        pool_rows.append(
            PoolStatus(
                name=name,
                nodes=len(members),
                gpus=GpuCounts(*(sum(getattr(x, f.name) for x in counts) for f in fields(GpuCounts))),
                quarantined=sum(1 for n in members if is_quarantined(n.view)),
                breaker=open_breakers.get(name),
                machinery=dict(sorted(Counter(statuses[n.view.name].machinery for n in members).items())),
            )
        )
    quarantined = [n for n in gpu_nodes if is_quarantined(n.view)]
    pending = sorted(
        (p for p in state.pods if p.view.phase == "Pending" and not p.view.node_name),
        key=lambda p: p.created_at or "",
    )
    return FleetStatus(
        taken_at=to_rfc3339(now),
        controller=controller_status(state.metrics, state.metrics_source, state.metrics_error, state.events),
        pools=tuple(pool_rows),
        quarantined=tuple(statuses[n.view.name] for n in quarantined),
        drains=tuple(
            drain(n, state) for n in quarantined if n.view.labels.get(c.LABEL_STATE) == c.NodePhase.DRAINING
        ),
        refusals=not_carried_out(state.events, {n.view.name for n in quarantined}),
        pending=tuple(
            PendingPod(f"{p.view.namespace}/{p.view.name}", p.gpus, age(p.created_at, now)) for p in pending
        ),
        scaling=tuple(
            pool_plan(t, state.events)
            for t in sorted(state.pools, key=lambda t: (not t.pool, t.pool, t.kind, t.namespace, t.name))
        ),
        problems=state.problems,
    )
