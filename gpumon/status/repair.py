"""The repair ladder of ``gpumon status node NAME``: the steps tried, when, how each ended, and
what comes next, read off the node's record (``gpumon.io/repair``). Pure."""

from __future__ import annotations

from collections.abc import Mapping

from gpumon.controller.core import contract as c
from gpumon.controller.core.contract.repair import (
    LADDER,
    AttemptOutcome,
    LadderStep,
    RepairRecord,
    record_from_json,
)
from gpumon.controller.core.objects import to_rfc3339
from gpumon.status.model import RepairLadder, RepairStep


def _when(at: float | None) -> str | None:
    return None if at is None else to_rfc3339(at)


def repair_ladder(annotations: Mapping[str, str]) -> RepairLadder | None:
    text = annotations.get(c.ANNOTATION_REPAIR)
    if text is None:
        return None
    record = record_from_json(text)
    steps = tuple(
        RepairStep(
            attempt=a.number,
            step=a.step.value,
            gpus=tuple(g for g in a.gpus if g),
            started=to_rfc3339(a.started_at),
            outcome=a.outcome.value,
            ended=_when(a.ended_at),
            detail=a.detail,
        )
        for a in record.attempts
    )
    return RepairLadder(steps, _when(record.gave_up_at), _when(record.validated_at), next_move(record))


def next_move(record: RepairRecord) -> str:
    """What the ladder does next, as far as its record says (the pool's config and the signals
    decide the rest)."""
    if record.gave_up_at == 0.0 and not record.attempts:
        return (
            f"the record cannot be read: nothing is done on it (remove {c.ANNOTATION_REPAIR} to start again)"
        )
    if record.gave_up_at is not None:
        return f"nothing: the ladder gave up; a person's turn (remove {c.ANNOTATION_REPAIR} to start again)"
    running = record.running
    if running is not None:
        if running.step is LadderStep.REPLACE:
            return f"waiting for the replacement of attempt {running.number}"
        if running.work_done_at is None:
            return f"waiting for the {running.step.value} Job of attempt {running.number} to finish"
        return f"the {running.step.value} Job finished: waiting for the GPUs healthy with action NONE"
    last = record.attempts[-1] if record.attempts else None
    if last is None:
        return "no step taken yet"
    if last.outcome is AttemptOutcome.SUCCEEDED:
        if record.validate and record.validated_at is None and last.step in LADDER:
            return "the validation Job, then the quarantine lifts once the rules clear"
        return "waiting for the rules to clear; then the quarantine lifts and the ladder ends"
    return f"{last.step.value} {last.outcome.value}: the next step up the ladder, or giving up"
