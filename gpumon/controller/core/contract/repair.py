"""The repair ladder's record on the Node (``gpumon.io/repair``): what was tried, when, with what
outcome, so that a restarted or new leader continues the ladder and never starts a step again.
Pure: values and their one JSON codec, no I/O.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from gpumon.controller.core.contract import REPLACEMENT_ANNOTATION_PREFIX
from gpumon.controller.core.objects import from_rfc3339, to_rfc3339


class LadderStep(enum.StrEnum):
    """The rungs of the ladder, in the order they escalate, and what ends it."""

    DRAIN = "drain"  # the affected GPUs' pods leave (the quarantine's drain)
    RESET = "reset"  # a GPU reset, node-local (a Job)
    REBOOT = "reboot"  # a node reboot, node-local (a Job)
    REPLACE = "replace"  # the machine, through the pool's own machinery
    VALIDATE = "validate"  # a validation Job before the node returns to service
    GIVE_UP = "give_up"
    DONE = "done"


# The steps that repair, from the lightest: a failed one escalates to the next.
LADDER: tuple[LadderStep, ...] = (LadderStep.RESET, LadderStep.REBOOT, LadderStep.REPLACE)


class AttemptOutcome(enum.StrEnum):
    RUNNING = "running"
    # The step's work was done and the exporter then reported the GPUs healthy with action NONE
    # (a validation: its Job succeeded).
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the Job failed, or the GPUs were not healthy after it
    TIMED_OUT = "timed_out"


@dataclass(frozen=True, slots=True)
class Attempt:
    step: LadderStep
    number: int  # 1, 2, ... over the ladder: names the attempt's Job
    gpus: tuple[str, ...]  # UUIDs the step is for
    started_at: float
    outcome: AttemptOutcome = AttemptOutcome.RUNNING
    # When the work itself finished (the Job succeeded): from then on the exporter must report
    # the GPUs healthy with action NONE before the step counts as done.
    work_done_at: float | None = None
    ended_at: float | None = None
    detail: str = ""

    def finished(self, outcome: AttemptOutcome, now: float, detail: str) -> Attempt:
        return replace(self, outcome=outcome, ended_at=now, detail=detail)


_NO_TIMES: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class RepairRecord:
    attempts: tuple[Attempt, ...] = ()
    gave_up_at: float | None = None
    # The pool asks for a validation before the node returns to service (kept here so that
    # whoever lifts the quarantine can tell without the pool's config).
    validate: bool = False
    validated_at: float | None = None
    # When each GPU (UUID; "" for the node) last came back through the ladder: a fault again
    # within the pool's flap window goes straight to replacement.
    repaired: Mapping[str, float] = field(default_factory=lambda: _NO_TIMES)

    @property
    def running(self) -> Attempt | None:
        last = self.attempts[-1] if self.attempts else None
        return last if last is not None and last.outcome is AttemptOutcome.RUNNING else None

    @property
    def active(self) -> bool:
        """A ladder is under way: something was tried and it has not ended."""
        return bool(self.attempts) and self.gave_up_at is None

    def tried(self, step: LadderStep) -> int:
        return sum(1 for a in self.attempts if a.step is step and a.outcome is not AttemptOutcome.RUNNING)

    def with_attempt(self, attempt: Attempt) -> RepairRecord:
        """The record with ``attempt`` in place of the running one (or added after the last)."""
        kept = self.attempts[:-1] if self.running is not None else self.attempts
        return replace(self, attempts=(*kept, attempt))


EMPTY_RECORD = RepairRecord()


def _time(value: Any) -> float | None:
    return None if value is None else from_rfc3339(str(value))


def record_to_json(record: RepairRecord) -> str:
    def attempt(a: Attempt) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step": a.step.value,
            "n": a.number,
            "gpus": list(a.gpus),
            "startedAt": to_rfc3339(a.started_at),
            "outcome": a.outcome.value,
        }
        if a.work_done_at is not None:
            out["workDoneAt"] = to_rfc3339(a.work_done_at)
        if a.ended_at is not None:
            out["endedAt"] = to_rfc3339(a.ended_at)
        if a.detail:
            out["detail"] = a.detail
        return out

    doc: dict[str, Any] = {"attempts": [attempt(a) for a in record.attempts]}
    if record.gave_up_at is not None:
        doc["gaveUpAt"] = to_rfc3339(record.gave_up_at)
    if record.validate:
        doc["validate"] = True
    if record.validated_at is not None:
        doc["validatedAt"] = to_rfc3339(record.validated_at)
    if record.repaired:
        doc["repaired"] = {k: to_rfc3339(v) for k, v in sorted(record.repaired.items())}
    return json.dumps(doc, separators=(",", ":"))


def record_from_json(text: str | None) -> RepairRecord:
    """What gpumon wrote; an unreadable record (edited by hand, say) reads as one whose ladder
    ended: no step is taken on the strength of a record gpumon cannot read."""
    if not text:
        return EMPTY_RECORD
    try:
        doc = json.loads(text)
        attempts = []
        for a in doc.get("attempts") or ():
            started = _time(a["startedAt"])
            if started is None:
                raise ValueError("no start")
            attempts.append(
                Attempt(
                    step=LadderStep(a["step"]),
                    number=int(a["n"]),
                    gpus=tuple(str(g) for g in a.get("gpus") or ()),
                    started_at=started,
                    outcome=AttemptOutcome(a.get("outcome", AttemptOutcome.RUNNING)),
                    work_done_at=_time(a.get("workDoneAt")),
                    ended_at=_time(a.get("endedAt")),
                    detail=str(a.get("detail", "")),
                )
            )
        repaired = {str(k): t for k, v in (doc.get("repaired") or {}).items() if (t := _time(v)) is not None}
        return RepairRecord(
            attempts=tuple(attempts),
            gave_up_at=_time(doc.get("gaveUpAt")),
            validate=doc.get("validate") is True,
            validated_at=_time(doc.get("validatedAt")),
            repaired=MappingProxyType(repaired),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return RepairRecord(gave_up_at=0.0)


def node_key(node: str) -> str:
    """A digest of a node's name where the name itself may not fit (a label value, an
    annotation key: 63 characters)."""
    return hashlib.sha256(node.encode()).hexdigest()[:10]


@dataclass(frozen=True, slots=True)
class Replacement:
    """A replacement under way, on the controller's state ConfigMap: the Node it replaces goes
    away with it, and with the Node its ``gpumon.io/repair`` record. Written before the Machine
    or NodeClaim is deleted, so whoever leads next follows it to its end and never deletes a
    second time; removed when it ends."""

    node: str
    pool: str
    owner: str  # the API path of the Machine or NodeClaim deleted
    machinery: str  # "cluster-api", "karpenter"
    attempt: int  # the number of the ladder's attempt on the Node
    gpus: tuple[str, ...]
    started_at: float
    deadline_at: float
    # The pool's nodes when it began: the replacement is a node none of these.
    before: tuple[str, ...] = ()
    gave_up_at: float | None = None  # kept, counted as a ladder that gave up, until a person removes it

    @property
    def key(self) -> str:
        return f"{REPLACEMENT_ANNOTATION_PREFIX}{node_key(self.node)}"


def replacement_to_annotation(r: Replacement) -> tuple[str, str]:
    doc: dict[str, Any] = {
        "node": r.node,
        "pool": r.pool,
        "owner": r.owner,
        "machinery": r.machinery,
        "n": r.attempt,
        "gpus": list(r.gpus),
        "startedAt": to_rfc3339(r.started_at),
        "deadline": to_rfc3339(r.deadline_at),
        "before": list(r.before),
    }
    if r.gave_up_at is not None:
        doc["gaveUpAt"] = to_rfc3339(r.gave_up_at)
    return r.key, json.dumps(doc, separators=(",", ":"))


def replacements_from_annotations(annotations: Mapping[str, str]) -> list[Replacement]:
    """The replacements recorded on the ConfigMap; one gpumon cannot read (edited by hand) is
    left alone: nothing is done on its strength."""
    out = []
    for key, value in sorted(annotations.items()):
        if not key.startswith(REPLACEMENT_ANNOTATION_PREFIX):
            continue
        try:
            doc = json.loads(value)
            started, deadline = _time(doc["startedAt"]), _time(doc["deadline"])
            if started is None or deadline is None:
                raise ValueError("no times")
            r = Replacement(
                node=str(doc["node"]),
                pool=str(doc["pool"]),
                owner=str(doc["owner"]),
                machinery=str(doc["machinery"]),
                attempt=int(doc["n"]),
                gpus=tuple(str(g) for g in doc.get("gpus") or ()),
                started_at=started,
                deadline_at=deadline,
                before=tuple(str(n) for n in doc.get("before") or ()),
                gave_up_at=_time(doc.get("gaveUpAt")),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if r.key == key:
            out.append(r)
    return out
