"""What a quarantined Node carries, written by the quarantine planner and read back by a new
leader and by ``gpumon status``: the ``gpumon.io/unhealthy-gpus`` records, when the quarantine
began, and a gpumon-keyed taint a person had placed before. Pure: no I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpumon.controller.core import contract as c
from gpumon.controller.core.objects import NodeView, Taint, from_rfc3339, to_rfc3339
from gpumon.gpu.health import Severity


def is_quarantined(view: NodeView) -> bool:
    return c.ANNOTATION_QUARANTINED_AT in view.annotations


def is_excluded(view: NodeView) -> bool:
    return view.labels.get(c.LABEL_EXCLUDE) == "true"


def quarantined_at(view: NodeView) -> float | None:
    text = view.annotations.get(c.ANNOTATION_QUARANTINED_AT)
    return from_rfc3339(text) if text else None


# ---------------------------------------------------------------------------------------------
# gpumon.io/unhealthy-gpus


@dataclass(frozen=True, slots=True)
class GpuRecord:
    """One entry of the ``gpumon.io/unhealthy-gpus`` annotation: what gpumon acted on, kept on
    the Node so that a restarted or new leader rebuilds its state from the cluster."""

    uuid: str  # "" for node-scoped findings
    index: int | None
    reason: str
    severity: Severity
    rules: tuple[str, ...]
    first_seen: float
    evidence: str

    @property
    def identity(self) -> tuple[str, str, Severity, tuple[str, ...]]:
        """What matters for a rewrite; evidence (a temperature, say) may drift without one."""
        return (self.uuid, self.reason, self.severity, self.rules)


def records_to_json(records: tuple[GpuRecord, ...]) -> str:
    return json.dumps(
        [
            {
                "uuid": r.uuid,
                "index": r.index,
                "reason": r.reason,
                "severity": r.severity.value,
                "rules": list(r.rules),
                "firstSeen": to_rfc3339(r.first_seen),
                "evidence": r.evidence,
            }
            for r in records
        ],
        separators=(",", ":"),
    )


def records_from_json(text: str | None) -> tuple[GpuRecord, ...]:
    """Entries gpumon wrote; anything unreadable (edited by hand, say) is skipped."""
    if not text:
        return ()
    try:
        raw = json.loads(text)
    except ValueError:
        return ()
    out = []
    for e in raw if isinstance(raw, list) else ():
        try:
            first_seen = from_rfc3339(str(e["firstSeen"]))
            if first_seen is None:
                continue
            out.append(
                GpuRecord(
                    uuid=str(e["uuid"]),
                    index=None if e.get("index") is None else int(e["index"]),
                    reason=str(e["reason"]),
                    severity=Severity(e["severity"]),
                    rules=tuple(str(r) for r in e.get("rules") or ()),
                    first_seen=first_seen,
                    evidence=str(e.get("evidence", "")),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(out)


def node_records(view: NodeView) -> tuple[GpuRecord, ...]:
    return records_from_json(view.annotations.get(c.ANNOTATION_UNHEALTHY_GPUS))


# ---------------------------------------------------------------------------------------------
# gpumon.io/taint-preexisting


def preexisting_taints_to_json(taints: tuple[Taint, ...]) -> str:
    return json.dumps([t.to_json() for t in taints])


def preexisting_taints(view: NodeView) -> tuple[Taint, ...]:
    """The gpumon-keyed taints that were there before gpumon acted, to put back on recovery."""
    text = view.annotations.get(c.ANNOTATION_TAINT_PREEXISTING)
    try:
        raw = json.loads(text) if text else []
        return tuple(Taint.from_json(t) for t in raw)
    except (ValueError, TypeError, AttributeError):
        return ()


# ---------------------------------------------------------------------------------------------
# gpumon.io/do-not-disrupt-preexisting


def karpenter_launched(view: NodeView) -> bool:
    """Karpenter launched the node (its NodePool label): its consolidation may remove it."""
    return c.KARPENTER_NODEPOOL_LABEL in view.labels


def do_not_disrupt_to_json(value: str | None) -> str:
    return json.dumps(value)


@dataclass(frozen=True, slots=True)
class Preexisting:
    value: str | None  # None: the annotation was not there


def preexisting_do_not_disrupt(view: NodeView) -> Preexisting | None:
    """What Karpenter's do-not-disrupt annotation said before gpumon set it, or None when gpumon
    recorded nothing readable (it did not set it, or the record was edited): then recovery leaves
    the annotation as it is."""
    text = view.annotations.get(c.ANNOTATION_DO_NOT_DISRUPT_PREEXISTING)
    try:
        raw = json.loads(text) if text else False
    except ValueError:
        return None
    return Preexisting(raw) if raw is None or isinstance(raw, str) else None
