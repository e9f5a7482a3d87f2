"""``gpumon status node NAME`` (pure): the node's GPUs and their latest signals, which rule fired
on what evidence and when, what the controller did and refused, and what would lift the
quarantine."""

from __future__ import annotations

from collections.abc import Sequence

from gpumon.controller.core import contract as c
from gpumon.controller.core.contract.node import is_quarantined
from gpumon.controller.core.objects import to_rfc3339
from gpumon.controller.core.policy import Policy
from gpumon.gpu.health import Signal, recommended_action
from gpumon.status.fleet import blockers, breakers, moved_from, node_status
from gpumon.status.metrics import controller_status
from gpumon.status.model import (
    Condition,
    ControllerStatus,
    Explanation,
    GpuProblem,
    GpuSignals,
    NodeStatus,
    TimelineEntry,
)
from gpumon.status.repair import repair_ladder
from gpumon.status.state import ClusterState, EventInfo
from gpumon.status.times import duration
from gpumon.wire.v1 import SnapshotDoc


def timeline(node: NodeStatus, events: Sequence[EventInfo]) -> tuple[TimelineEntry, ...]:
    """The controller's Events about the node, the pods it moved off it, and its pool's breaker."""

    on_node = [e for e in events if e.kind == "Node" and e.name == node.name]

    def concerns(e: EventInfo) -> bool:
        if e.kind == "Node":
            return e.name == node.name
        if e.kind == "Pod":
            # A pod's Event repeats the node's one about it, except for a deletion (pod only).
            said = any(n.reason == e.reason and f"{e.namespace}/{e.name}" in n.message for n in on_node)
            return moved_from(node.name, e) and not said
        return e.reason == "GpuBreakerOpen" and f"pool {node.pool!r}" in e.message

    return tuple(TimelineEntry(e.at, e.reason, e.message, e.warning, e.about) for e in events if concerns(e))


def signals(snapshot: SnapshotDoc | None) -> tuple[GpuSignals, ...]:
    """The GPUs of an exporter's /api/v1/snapshot (docs/exporter.md)."""
    return tuple(
        GpuSignals(
            index=g.identity.index,
            uuid=g.identity.uuid,
            model=g.identity.model,
            health=g.health.state.value,
            reasons=tuple(f"{r.code}: {r.detail}" if r.detail else r.code for r in g.health.reasons),
            temperature_celsius=None if g.fast is None else g.fast.temperature_gpu_celsius,
            ecc_uncorrected=None if g.slow is None else g.slow.ecc_uncorrected,
            xids={x.code: x.count for x in g.xids},
            lost=g.lost,
        )
        for g in (snapshot.gpus if snapshot is not None else ())
    )


def _gpu(p: GpuProblem) -> str:
    return "the node" if p.index is None else f"GPU {p.index} ({p.uuid})"


def refused_now(node: NodeStatus, state: ClusterState, controller: ControllerStatus) -> tuple[str, ...]:
    """What keeps the controller from acting on this node as things stand."""
    out = []
    if node.excluded:
        out.append(f"{c.LABEL_EXCLUDE}=true: the controller neither quarantines nor lifts anything here")
    breaker = breakers(state).get(node.pool)
    if breaker is not None:
        out.append(
            f"circuit breaker open for pool {node.pool!r} since {breaker.opened_at} ({breaker.reason}): "
            "new quarantines in this pool are refused; a person closes it by removing the annotation "
            f"{c.BREAKER_ANNOTATION_PREFIX}{node.pool} from the controller's ConfigMap"
        )
    paused = (state.state_annotations or {}).get(c.ANNOTATION_PAUSED) == "true" or controller.paused
    if paused:
        out.append(f"paused ({c.ANNOTATION_PAUSED}=true on the controller's ConfigMap, or config): no writes")
    if controller.dry_run:
        out.append(f"dry-run (from its {controller.dry_run_from}): decisions are only reported as Events")
    if node.cordoned_by_person:
        out.append(
            f"cordoned by a person before gpumon acted ({c.ANNOTATION_CORDON_PREEXISTING}=true): "
            "recovery leaves the cordon in place"
        )
    return tuple(out)


def lift(node: NodeStatus, policy: Policy) -> tuple[str, ...]:
    """What would lift the quarantine: each finding's rule clearing for its recoverAfter."""
    if node.quarantined_at is None:
        return ("not quarantined: nothing to lift",)
    out = []
    window = policy.health.xid_window_seconds
    for p in node.problems:
        rules = [r for r in (policy.rule(name) for name in p.rules) if r is not None]
        hold = max((r.recover_after_seconds for r in rules), default=policy.default_recover_after_seconds)
        line = (
            f"{_gpu(p)}: {p.reason} ({', '.join(p.rules)}) must clear, then stay clear for {duration(hold)}"
        )
        if any(r.signal is Signal.XID for r in rules):
            line += f"; an Xid counts for {duration(window)} after it was seen"
        out.append(line + f". Recommended: {recommended_action(p.reason)}")
    if node.excluded:
        out.append(
            f"gpumon will not lift it while {c.LABEL_EXCLUDE}=true: remove the taint yourself "
            f"(kubectl taint node {node.name} {c.TAINT_KEY}-)"
        )
        return tuple(out)
    then = f"then gpumon removes the taint {c.TAINT_KEY}, sets {c.CONDITION_TYPE}=False"
    if node.cordoned_by_person:
        then += f" and leaves the cordon a person set (kubectl uncordon {node.name} when done)"
    elif node.cordoned:
        then += " and uncordons the node (it cordoned it)"
    out.append(then)
    out.append(
        f"by hand: kubectl label node {node.name} {c.LABEL_EXCLUDE}=true (gpumon stops acting on it), "
        f"then kubectl taint node {node.name} {c.TAINT_KEY}-"
    )
    return tuple(out)


def build_explanation(state: ClusterState, *, pool_label: str, policy: Policy) -> Explanation:
    (info,) = state.nodes
    node = node_status(info, state.events, state.now, pool_label)
    controller = controller_status(state.metrics, state.metrics_source, state.metrics_error, state.events)
    cond = info.view.gpu_condition
    pods = [p for p in state.pods if p.view.node_name == node.name and not p.view.finished]
    return Explanation(
        taken_at=to_rfc3339(state.now),
        node=node,
        condition=None
        if cond is None
        else Condition(cond.status, cond.reason, cond.message, cond.last_transition_time),
        signals=signals(state.snapshot),
        signals_source=state.snapshot_source,
        signals_error=state.snapshot_error,
        timeline=timeline(node, state.events),
        refused=refused_now(node, state, controller),
        blockers=blockers(node.name, pods, state) if is_quarantined(info.view) else (),
        lift=lift(node, policy),
        controller=controller,
        problems=state.problems,
        repair=repair_ladder(info.view.annotations),
    )
