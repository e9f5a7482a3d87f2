"""Quarantine and recovery of a Node: the pure planner (:mod:`gpumon.controller.act.node_write`
applies its plans).

:func:`plan_node` compares what the node carries with what the verdict asks for and returns
the smallest writes that close the gap (none when they agree, so re-running it is harmless
across restarts and leader changes). It only ever touches gpumon's own keys, records a cordon
or a gpumon-keyed taint that was there before, and on recovery puts back exactly what it found.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpumon.controller.core import contract as c
from gpumon.controller.core.contract.node import (
    GpuRecord,
    do_not_disrupt_to_json,
    is_excluded,
    is_quarantined,
    karpenter_launched,
    node_records,
    preexisting_do_not_disrupt,
    preexisting_taints,
    preexisting_taints_to_json,
    records_to_json,
)
from gpumon.controller.core.objects import (
    NodeCondition,
    NodeView,
    Taint,
    from_rfc3339,
    to_rfc3339,
)
from gpumon.controller.core.plans import NO_PLAN, Event, NodePlan, NodeWrite, ObjectRef, PlanKind
from gpumon.controller.core.verdicts import NodeVerdict, SignalStatus, records_of
from gpumon.gpu.health import Severity

_OUR_ANNOTATIONS = (
    c.ANNOTATION_UNHEALTHY_GPUS,
    c.ANNOTATION_QUARANTINED_AT,
    c.ANNOTATION_CORDON_PREEXISTING,
    c.ANNOTATION_TAINT_PREEXISTING,
    c.ANNOTATION_DRAIN_STARTED_AT,
    c.ANNOTATION_DO_NOT_DISRUPT_PREEXISTING,
)
_MESSAGE_LIMIT = 1024


@dataclass(frozen=True, slots=True)
class QuarantinePolicy:
    # Also cordon (spec.unschedulable) unhealthy nodes; the taint alone keeps new pods away.
    cordon: bool = False


def node_ref(view: NodeView) -> ObjectRef:
    return ObjectRef("Node", view.name)


def signals_lost_event(view: NodeView, verdict: NodeVerdict) -> Event:
    """Told once when a node's signals stop being fresh: gpumon holds every action there."""
    if verdict.signals is SignalStatus.MISSING:
        why = "no exporter data"
    else:
        why = f"last data {verdict.age_seconds:.0f}s old"
    msg = f"GPU signals lost ({why}): gpumon takes no action on this node until they are back"
    return Event(node_ref(view), "GpuSignalsLost", msg, warning=True, key=f"dark:{verdict.signals}")


def drain_started_at(view: NodeView, now: float) -> float:
    """When the current drain began: kept while the node stays ``draining``, else now."""
    if view.labels.get(c.LABEL_STATE) == c.NodePhase.DRAINING:
        text = view.annotations.get(c.ANNOTATION_DRAIN_STARTED_AT)
        started = from_rfc3339(text) if text else None
        if started is not None:
            return started
    return now


def taint_effect(severity: Severity) -> str:
    return "NoSchedule" if severity is Severity.UNHEALTHY else "PreferNoSchedule"


def _describe(r: GpuRecord) -> str:
    what = "node" if not r.uuid else f"GPU {r.index} ({r.uuid})"
    return f"{what}: {r.reason}" + (f" ({r.evidence})" if r.evidence else "")


def condition_message(records: tuple[GpuRecord, ...], actions: tuple[str, ...]) -> str:
    text = "; ".join(_describe(r) for r in records)
    if actions:
        text += ". Recommended: " + "; ".join(dict.fromkeys(actions))
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 1] + "…"


# ---------------------------------------------------------------------------------------------
# Planning


@dataclass(frozen=True, slots=True)
class _Desired:
    taints: tuple[Taint, ...]
    unschedulable: bool
    label_state: str | None
    annotations: Mapping[str, str | None]
    condition: NodeCondition | None  # None: leave the condition alone


def _others(view: NodeView) -> tuple[Taint, ...]:
    return tuple(t for t in view.taints if t.key != c.TAINT_KEY)


def _ours(view: NodeView) -> tuple[Taint, ...]:
    return tuple(t for t in view.taints if t.key == c.TAINT_KEY)


def _with_ours(view: NodeView, taint: Taint) -> tuple[Taint, ...]:
    """The node's taints with ``taint`` as gpumon's only one, where gpumon's stood (else last):
    the others keep their order, so a write changes nothing but gpumon's own taint."""
    out: list[Taint] = []
    for t in view.taints:
        if t.key != c.TAINT_KEY:
            out.append(t)
        elif taint not in out:
            out.append(taint)
    return tuple(out) if taint in out else (*out, taint)


def _stable_records(view: NodeView, wanted: tuple[GpuRecord, ...]) -> tuple[GpuRecord, ...]:
    """Keep what is written when only evidence drifted, so a warm GPU does not cause a write
    per evaluation."""
    current = node_records(view)
    if [r.identity for r in current] == [r.identity for r in wanted]:
        return current
    return wanted


def _with_transition(view: NodeView, status: str, reason: str, message: str, now: float) -> NodeCondition:
    old = view.gpu_condition
    since = old.last_transition_time if old is not None and old.status == status else None
    return NodeCondition(status, reason, message, since or to_rfc3339(now))


def _quarantine_desired(
    view: NodeView, verdict: NodeVerdict, now: float, phase: c.NodePhase, policy: QuarantinePolicy
) -> _Desired:
    severity = verdict.severity
    assert severity is not None
    records = _stable_records(view, records_of(verdict))
    first = not is_quarantined(view)
    ours = Taint(c.TAINT_KEY, taint_effect(severity), severity.value)
    current_ours = _ours(view)
    # Keep our taint object as written (its timeAdded) when it already says the right thing.
    taint = (
        current_ours[0] if current_ours[1:] == () and current_ours and _same(current_ours[0], ours) else ours
    )
    annotations: dict[str, str | None] = {
        c.ANNOTATION_UNHEALTHY_GPUS: records_to_json(records),
        c.ANNOTATION_QUARANTINED_AT: to_rfc3339(now)
        if first
        else view.annotations[c.ANNOTATION_QUARANTINED_AT],
        c.ANNOTATION_CORDON_PREEXISTING: (
            str(view.unschedulable).lower()
            if first
            else view.annotations.get(c.ANNOTATION_CORDON_PREEXISTING)
        ),
    }
    if first and current_ours:
        annotations[c.ANNOTATION_TAINT_PREEXISTING] = preexisting_taints_to_json(current_ours)
    if phase is c.NodePhase.DRAINING:
        annotations[c.ANNOTATION_DRAIN_STARTED_AT] = to_rfc3339(drain_started_at(view, now))
    else:
        annotations[c.ANNOTATION_DRAIN_STARTED_AT] = None
    annotations.update(_karpenter_held(view))
    label = c.NodePhase.RECOVERING if verdict.recovering and phase not in c.REPAIR_PHASES else phase
    cordon = view.unschedulable or (policy.cordon and severity is Severity.UNHEALTHY)
    actions = tuple(f.action for f in verdict.findings)
    condition = _with_transition(view, "True", records[0].reason, condition_message(records, actions), now)
    return _Desired(_with_ours(view, taint), cordon, label.value, annotations, condition)


def _karpenter_held(view: NodeView) -> dict[str, str | None]:
    """Karpenter's do-not-disrupt on a node it launched, so that its consolidation does not
    remove the quarantined node (empty once drained) and gpumon's record with it; what was there
    before is recorded once, for recovery to put back."""
    if not karpenter_launched(view) and c.ANNOTATION_DO_NOT_DISRUPT_PREEXISTING not in view.annotations:
        return {}
    before = view.annotations.get(c.ANNOTATION_DO_NOT_DISRUPT_PREEXISTING)
    if before is None:
        before = do_not_disrupt_to_json(view.annotations.get(c.KARPENTER_DO_NOT_DISRUPT_ANNOTATION))
    return {c.ANNOTATION_DO_NOT_DISRUPT_PREEXISTING: before, c.KARPENTER_DO_NOT_DISRUPT_ANNOTATION: "true"}


def _karpenter_released(view: NodeView) -> dict[str, str | None]:
    """Karpenter's do-not-disrupt as it was before gpumon set it (absent if it was)."""
    before = preexisting_do_not_disrupt(view)
    return {} if before is None else {c.KARPENTER_DO_NOT_DISRUPT_ANNOTATION: before.value}


def _same(a: Taint, b: Taint) -> bool:
    return (a.key, a.effect, a.value) == (b.key, b.effect, b.value)


def _recovery_desired(view: NodeView, now: float, policy: QuarantinePolicy) -> _Desired:
    we_cordoned = policy.cordon and view.annotations.get(c.ANNOTATION_CORDON_PREEXISTING) == "false"
    condition = None
    if view.gpu_condition is not None:
        condition = _with_transition(view, "False", c.RECOVERED_REASON, "all GPUs healthy", now)
    return _Desired(
        taints=(*_others(view), *preexisting_taints(view)),
        unschedulable=False if we_cordoned else view.unschedulable,
        label_state=None,
        annotations={**dict.fromkeys(_OUR_ANNOTATIONS), **_karpenter_released(view)},
        condition=condition,
    )


def _write(view: NodeView, want: _Desired) -> NodeWrite | None:
    meta: dict[str, Any] = {}
    if view.labels.get(c.LABEL_STATE) != want.label_state:
        meta["labels"] = {c.LABEL_STATE: want.label_state}
    changed = {k: v for k, v in want.annotations.items() if view.annotations.get(k) != v}
    if changed:
        meta["annotations"] = changed
    spec: dict[str, Any] = {}
    # As a set: the node lifecycle controller appends its taints (not-ready, unreachable) after
    # ours and removes them again; their place in the list is no reason to write.
    if Counter(view.taints) != Counter(want.taints):
        spec["taints"] = [t.to_json() for t in want.taints]
    if view.unschedulable != want.unschedulable:
        spec["unschedulable"] = want.unschedulable
    merge: dict[str, Any] | None = None
    if meta or spec:
        merge = {"metadata": {**meta, "resourceVersion": view.resource_version}}
        if spec:
            merge["spec"] = spec
    status: dict[str, Any] | None = None
    cond, old = want.condition, view.gpu_condition
    if cond is not None and (
        old is None or (old.status, old.reason, old.message) != (cond.status, cond.reason, cond.message)
    ):
        status = {
            "status": {
                "conditions": [
                    {
                        "type": c.CONDITION_TYPE,
                        "status": cond.status,
                        "reason": cond.reason,
                        "message": cond.message,
                        "lastTransitionTime": cond.last_transition_time,
                        "lastHeartbeatTime": cond.last_transition_time,
                    }
                ]
            }
        }
    if merge is None and status is None:
        return None
    return NodeWrite(view.name, merge, status)


def _summary(verdict: NodeVerdict) -> str:
    return "; ".join(_describe(r) for r in records_of(verdict))


def plan_node(
    view: NodeView,
    verdict: NodeVerdict,
    *,
    now: float,
    phase: c.NodePhase = c.NodePhase.QUARANTINED,
    refusal: str | None = None,
    policy: QuarantinePolicy = QuarantinePolicy(),
) -> NodePlan:
    """The writes and Events that bring ``view`` in line with ``verdict``.

    ``phase`` is the drain's progress (its label value while quarantined); ``refusal`` says why
    a *new* quarantine may not happen now (breaker open, rate limit, paused)."""
    ref = node_ref(view)
    severity = verdict.severity
    quarantined = is_quarantined(view)
    if is_excluded(view):
        if severity is None or quarantined:
            return NO_PLAN
        return NodePlan(
            PlanKind.SKIPPED,
            events=(
                Event(
                    ref,
                    "GpuQuarantineSkipped",
                    f"node opted out ({c.LABEL_EXCLUDE}=true): {_summary(verdict)}",
                    warning=True,
                    key="excluded",
                ),
            ),
        )
    # Unknown signals hold everything as it is: no new quarantine, no recovery.
    if verdict.signals is not SignalStatus.FRESH:
        return NO_PLAN
    if severity is None:
        if not quarantined:
            return NO_PLAN
        write = _write(view, _recovery_desired(view, now, policy))
        gpus = "; ".join(_describe(r) for r in node_records(view))
        event = Event(
            ref,
            "GpuRecovered",
            f"signals good through the hysteresis; lifted quarantine ({gpus})",
            key="recovered",
        )
        return NodePlan(PlanKind.RECOVER, write, (event,))
    if not quarantined and refusal is not None:
        return NodePlan(
            PlanKind.REFUSED,
            events=(
                Event(
                    ref, "GpuQuarantineRefused", f"{refusal}: {_summary(verdict)}", warning=True, key=refusal
                ),
            ),
        )
    want = _quarantine_desired(view, verdict, now, phase, policy)
    write = _write(view, want)
    effect = taint_effect(severity)
    if not quarantined:
        msg = f"tainted {c.TAINT_KEY}={severity.value}:{effect}: {_summary(verdict)}"
        return NodePlan(
            PlanKind.QUARANTINE, write, (Event(ref, "GpuQuarantined", msg, warning=True, key="quarantined"),)
        )
    if write is None:
        return NO_PLAN
    events: tuple[Event, ...] = ()
    if _ours(view) != tuple(t for t in want.taints if t.key == c.TAINT_KEY):
        msg = f"quarantine now {c.TAINT_KEY}={severity.value}:{effect}: {_summary(verdict)}"
        events = (Event(ref, "GpuQuarantineUpdated", msg, warning=True, key=f"updated:{severity}"),)
    return NodePlan(PlanKind.UPDATE, write, events)
