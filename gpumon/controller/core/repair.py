"""The repair ladder: what a quarantined node needs next to come back to full capacity (pure).

:func:`plan_repair` reads the node's verdict, the driver's recovery action of each affected GPU
(or, where the driver does not report it, the resolution NVIDIA's Xid catalog documents:
:func:`gpumon.gpu.health.documented_resolution`), whether the pods have left, the state of the
current step's work, and the record of what was tried (:mod:`.contract.repair`, kept on the Node),
and returns one move: start a step, keep waiting on one, record how one ended, validate, give
up, or finish. Called again after each move, it walks the ladder one transition at a time, so
a new leader reading the same record takes the same next move and never starts a step twice.

The ladder, lightest first: drain (the quarantine's own), reset the GPU (when the action asks
for one and no pod holds it), reboot the node (when the action asks, or a reset failed or timed
out), replace the machine (a reboot failed, the same GPU faulted again within the flap window,
or the pool replaces straight away), give up. A step's Job finishing is never success by
itself: the exporter must then report the GPUs healthy with action NONE.

Every bound is here or in the existing gates: each step's deadline and attempts
(:class:`RepairPolicy`), at most ``max_concurrent`` nodes of a pool repairing at once,
``gpumon.io/exclude``, and ``refusal`` (the circuit breaker, the rate limit and the pause
switch, decided for the new steps of a round by :mod:`.repair_gate` with the quarantine's own
:func:`gpumon.controller.core.breaker.admit`). Dry-run is the shell's: it plans, records the
Events and writes nothing. A validation is never refused: it starts nothing disruptive.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from gpumon.controller.core.contract import NodePhase
from gpumon.controller.core.contract.node import GpuRecord
from gpumon.controller.core.contract.repair import (
    LADDER,
    Attempt,
    AttemptOutcome,
    LadderStep,
    RepairRecord,
)
from gpumon.controller.core.objects import PodView
from gpumon.controller.core.plans import Event, ObjectRef
from gpumon.controller.core.signals import GpuReading, NodeReading
from gpumon.controller.core.verdicts import Finding, GpuVerdict, NodeVerdict, SignalStatus
from gpumon.gpu.health import Severity, documented_resolution
from gpumon.gpu.model import HealthState, RecoveryAction


class Machinery(enum.StrEnum):
    """What can replace a pool's machine."""

    NONE = "none"  # nothing gpumon can drive: replacement is reported, never done
    CLUSTER_API = "cluster-api"  # delete the Machine (its MachineSet makes a new one)
    KARPENTER = "karpenter"  # delete the NodeClaim (Karpenter drains and launches another)


class Work(enum.StrEnum):
    """The current attempt's work as the cluster shows it (its Job; for a replacement, the
    deletion)."""

    ABSENT = "absent"  # not created yet (or already cleaned up)
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    # Ended at its own deadline, which is the attempt's: the attempt's deadline judges it, as a
    # Job still running. Whether the Job controller or the planner notices first is a race (the
    # Job's start time is kept to the whole second), which must not decide failed or timed out.
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class RepairPolicy:
    """A pool's ``repair:`` section as the planner uses it."""

    reset: bool = True
    reboot: bool = True
    replace: bool = True
    # Replace the machine at once instead of resetting or rebooting it.
    replace_immediately: bool = False
    # Run the validation Job before the quarantine lifts.
    validate: bool = False
    # Attempts of each step before the ladder moves on.
    max_attempts: int = 1
    # Nodes of the pool repairing (a ladder under way) at once.
    max_concurrent: int = 1
    # From a step's start to the GPUs reported healthy with action NONE.
    reset_deadline_seconds: float = 600.0
    reboot_deadline_seconds: float = 1800.0
    replace_deadline_seconds: float = 3600.0
    validate_deadline_seconds: float = 1800.0
    # How long a step waits for the pods to leave (from the quarantine) before escalating.
    free_deadline_seconds: float = 1800.0
    # The same GPU faulting again this soon after a repair: replace the machine.
    flap_window_seconds: float = 86400.0

    def deadline(self, step: LadderStep) -> float:
        return {
            LadderStep.RESET: self.reset_deadline_seconds,
            LadderStep.REBOOT: self.reboot_deadline_seconds,
            LadderStep.REPLACE: self.replace_deadline_seconds,
            LadderStep.VALIDATE: self.validate_deadline_seconds,
        }[step]

    def allows(self, step: LadderStep) -> bool:
        return {
            LadderStep.RESET: self.reset,
            LadderStep.REBOOT: self.reboot,
            LadderStep.REPLACE: self.replace,
        }[step]


@dataclass(frozen=True, slots=True)
class RepairInput:
    """One node as the planner sees it."""

    node: str
    pool: str
    verdict: NodeVerdict
    reading: NodeReading | None
    record: RepairRecord
    quarantined_at: float | None  # None: not quarantined
    excluded: bool = False
    # No pod (but DaemonSet and mirror pods) left on the GPUs being repaired / on the node.
    gpus_free: bool = False
    node_free: bool = False
    work: Work = Work.ABSENT  # the running attempt's
    others_repairing: int = 0  # other nodes of the pool with a ladder under way
    machinery: Machinery = Machinery.NONE


class Move(enum.StrEnum):
    NONE = "none"  # nothing to do
    WAIT = "wait"  # the pods, a gate, the driver, the Job, or the exporter
    START = "start"  # a new attempt: record it, then create its work
    ENSURE = "ensure"  # the running attempt's work is not there: create it (same attempt)
    RECORD = "record"  # write the record (a step's outcome, the end of the ladder)


# gpumon.io/state while a step runs.
_STATES: Mapping[LadderStep, NodePhase] = MappingProxyType(
    {
        LadderStep.RESET: NodePhase.RESETTING,
        LadderStep.REBOOT: NodePhase.REBOOTING,
        LadderStep.REPLACE: NodePhase.REPLACING,
        LadderStep.VALIDATE: NodePhase.VALIDATING,
    }
)
_RESETS = frozenset({RecoveryAction.GPU_RESET, RecoveryAction.DRAIN_AND_RESET, RecoveryAction.BUS_RESET})
_REBOOTS = frozenset({RecoveryAction.NODE_REBOOT, RecoveryAction.SYSTEM_REBOOT})
# Actions whose step is the drain itself.
_WAITS = frozenset({RecoveryAction.NONE, RecoveryAction.DRAIN_P2P})


@dataclass(frozen=True, slots=True)
class RepairPlan:
    move: Move
    step: LadderStep | None = None
    attempt: int | None = None  # the attempt the work belongs to: names its Job
    gpus: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    record: RepairRecord | None = None  # to write; None: as it is
    events: tuple[Event, ...] = ()
    next_check_at: float | None = None
    # A new disruptive step: admitted (breaker, rate limit, pause) with the round's others.
    needs_admission: bool = False
    # The pods left on the node are to be evicted (PDBs hold) before its reboot: the
    # quarantine's drain takes only those of the bad GPUs.
    drain_node: bool = False

    @property
    def state(self) -> NodePhase | None:
        """The node's gpumon.io/state while this plan's step is under way."""
        if self.step is None or self.move is Move.NONE:
            return None
        return _STATES.get(self.step)


NOTHING = RepairPlan(Move.NONE)


def _event(node: str, reason: str, message: str, *, warning: bool = False, key: str = "") -> Event:
    return Event(ObjectRef("Node", node), reason, message, warning=warning, key=key or reason)


def quarantine_verdict(node: str, records: Sequence[GpuRecord], signals: SignalStatus) -> NodeVerdict:
    """The verdict the quarantine wrote on the node (``gpumon.io/unhealthy-gpus``), as the
    ladder reads it: the repair follows what the quarantine acted on, and its end (the record
    removed when the quarantine lifts), without judging the GPUs a second time."""
    gpus, node_findings = [], []
    for r in records:
        finding = Finding(
            r.rules[0] if r.rules else "", r.severity, r.reason, r.evidence, "", r.first_seen, r.first_seen
        )
        if r.uuid:
            gpus.append(GpuVerdict(r.uuid, -1 if r.index is None else r.index, (finding,)))
        else:
            node_findings.append(finding)
    return NodeVerdict(node, signals, None, tuple(gpus), tuple(node_findings))


# ---------------------------------------------------------------------------------------------
# What the GPUs need


def needed_action(
    g: GpuReading | None, reasons: Sequence[str], xid_window_seconds: float, now: float
) -> RecoveryAction:
    """The driver's recovery action; where it does not report one (or the GPU cannot be read),
    what the Xid catalog documents for the codes seen within the window, or else for the
    findings' ``reasons``."""
    if g is None:
        return RecoveryAction.NODE_REBOOT  # gone from the exporter's list: as if lost
    if g.recovery_action is not None:
        return g.recovery_action
    recent = [x.code for x in g.xids or () if now - x.at <= xid_window_seconds]
    return documented_resolution(recent, lost=bool(g.lost), reasons=reasons)


def targets(inp: RepairInput, xid_window_seconds: float, now: float) -> dict[str, RecoveryAction]:
    """The unhealthy GPUs (UUID -> what each needs); a node-scoped finding is the node's ("")."""
    reading = inp.reading
    out = {
        g.uuid: needed_action(
            reading.gpu(g.uuid) if reading else None,
            [f.reason for f in g.findings],
            xid_window_seconds,
            now,
        )
        for g in inp.verdict.gpus
        if g.severity is Severity.UNHEALTHY
    }
    if any(f.severity is Severity.UNHEALTHY for f in inp.verdict.node_findings):
        out[""] = RecoveryAction.NODE_REBOOT
    return out


def _wanted(actions: Mapping[str, RecoveryAction]) -> LadderStep | None:
    if any(a in _REBOOTS for a in actions.values()):
        return LadderStep.REBOOT
    if any(a in _RESETS for a in actions.values()):
        return LadderStep.RESET
    return None


def _healthy_again(reading: NodeReading | None, gpus: Sequence[str]) -> bool:
    """The exporter reports each GPU healthy with action NONE (or no action where unsupported)."""
    if reading is None:
        return False
    for uuid in gpus:
        if not uuid:
            continue  # the node itself: its verdict clears through the controller's rules
        g = reading.gpu(uuid)
        if g is None or g.health is None or g.health.state is not HealthState.HEALTHY or g.lost:
            return False
        if g.recovery_action not in (None, RecoveryAction.NONE):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# The planner


def plan_repair(
    inp: RepairInput,
    *,
    now: float,
    policy: RepairPolicy,
    xid_window_seconds: float = 600.0,
    refusal: str | None = None,
) -> RepairPlan:
    """The next move of ``inp.node``'s ladder. ``refusal`` says why a new disruptive step may
    not start this round (breaker, rate limit, pause: :func:`admit_repairs`)."""
    rec = inp.record
    running = rec.running
    if running is not None:
        return _follow(inp, running, now, policy)
    healthy = inp.verdict.severity is None and inp.verdict.signals is SignalStatus.FRESH
    if (healthy and not holds_quarantine(rec)) or _quarantined_again(rec, inp.quarantined_at):
        return _finish_ladder(inp, now, policy)
    if rec.gave_up_at is not None or inp.quarantined_at is None:
        return NOTHING
    if inp.verdict.signals is not SignalStatus.FRESH:
        return NOTHING  # unknown never starts anything
    if inp.excluded:
        return NOTHING  # gpumon.io/exclude: the quarantine's own planner says so
    if policy.validate and _ready_to_validate(rec, inp.reading):
        gpus = _last_repair(rec).gpus  # type: ignore[union-attr]
        return _start(inp, LadderStep.VALIDATE, gpus, now, policy, ("the repaired GPUs are healthy",))
    wants = targets(inp, xid_window_seconds, now)
    if not wants:
        return NOTHING  # degraded only: not a repair's business
    step, why = _next_step(inp, wants, now, policy)
    if step is LadderStep.GIVE_UP:
        return _give_up(inp, now, why)
    if step is LadderStep.DONE:
        return RepairPlan(Move.WAIT, reasons=why)
    return _gated(inp, step, wants, now, policy, why, refusal)


def _quarantined_again(rec: RepairRecord, quarantined_at: float | None) -> bool:
    """The ladder's last step succeeded, the quarantine lifted, and a new fault quarantined the
    node again before a round saw it healthy (the demo's flap step faults 0.5 s after the lift;
    the repair loop's round is slower): that ladder ended, and its GPUs count as repaired for
    the flap window. A quarantine that lifted cannot have begun before the step that led to the
    lift ended; the quarantine's time has whole seconds, the attempt's more, hence the floor."""
    last = rec.attempts[-1] if rec.attempts else None
    return (
        quarantined_at is not None
        and last is not None
        and last.outcome is AttemptOutcome.SUCCEEDED
        and last.ended_at is not None
        and not holds_quarantine(rec)
        and quarantined_at >= int(last.ended_at)
    )


def holding_the_node(pods: Iterable[PodView]) -> list[PodView]:
    """The pods that must leave before a reboot: all but DaemonSet and mirror pods (the node
    brings those back with it) and pods that have finished."""
    return [p for p in pods if not p.finished and p.owner_kind != "DaemonSet" and not p.mirror]


def needs_the_nodes_pods(
    inp: RepairInput, *, now: float, policy: RepairPolicy, xid_window_seconds: float = 600.0
) -> bool:
    """Whether the next move hinges on every pod of the node, not only the GPU pods the caches
    hold: no step runs, and were the node free its next step would be a reboot. Only then does
    the shell list the node's pods (and evict them); every other round reads the caches alone."""
    if inp.record.running is not None:
        return False
    free = replace(inp, node_free=True)
    return plan_repair(free, now=now, policy=policy, xid_window_seconds=xid_window_seconds).step is (
        LadderStep.REBOOT
    )


def holds_quarantine(rec: RepairRecord) -> bool:
    """The quarantine stays until the validation Job succeeded, where the pool asks for one and
    a ladder ran (docs/controller.md, "Repair"): healthy signals alone do not lift it. Read off
    the record alone, so the quarantine's planner needs no pool config."""
    return rec.validate and rec.active and rec.validated_at is None


def repair_phase(rec: RepairRecord) -> NodePhase | None:
    """The node's gpumon.io/state while a step of its ladder runs (resetting, rebooting,
    replacing, validating): the quarantine's planner writes it in place of the drain's."""
    running = rec.running
    return None if running is None else _STATES.get(running.step)


def _last_repair(rec: RepairRecord) -> Attempt | None:
    return next((a for a in reversed(rec.attempts) if a.step in LADDER), None)


def _ready_to_validate(rec: RepairRecord, reading: NodeReading | None) -> bool:
    """The last step succeeded, the GPUs read healthy, and it has not been validated since."""
    last = rec.attempts[-1] if rec.attempts else None
    return (
        last is not None
        and last.step in LADDER
        and last.outcome is AttemptOutcome.SUCCEEDED
        and rec.validated_at is None
        and _healthy_again(reading, last.gpus)
    )


def _next_step(
    inp: RepairInput, targets: Mapping[str, RecoveryAction], now: float, policy: RepairPolicy
) -> tuple[LadderStep, tuple[str, ...]]:
    rec = inp.record
    last, repaired = (rec.attempts[-1] if rec.attempts else None), _last_repair(rec)
    succeeded = last is not None and last.outcome is AttemptOutcome.SUCCEEDED
    if succeeded and repaired is not None and _healthy_again(inp.reading, repaired.gpus):
        # Repaired (and validated, where asked): the rules clear through their hysteresis.
        return LadderStep.DONE, (f"{repaired.step.value} succeeded: waiting for the verdict to clear",)
    flapping = sorted(
        uuid
        for uuid in targets
        if (at := rec.repaired.get(uuid)) is not None and now - at <= policy.flap_window_seconds
    )
    wanted = _wanted(targets)
    why: list[str] = []
    if flapping:
        floor = LadderStep.REPLACE
        why.append(f"faulted again within {policy.flap_window_seconds:g}s of a repair: {', '.join(flapping)}")
    elif policy.replace_immediately:
        floor = LadderStep.REPLACE
        why.append("the pool replaces straight away")
    elif wanted is None:
        actions = ", ".join(sorted({a.name for a in targets.values()}))
        if set(targets.values()) <= _WAITS:
            # The driver asks for nothing gpumon runs: the drain was the step; the driver's
            # verdict or the rules clear by themselves.
            return LadderStep.DONE, (f"recovery action {actions}: nothing to run, waiting",)
        return LadderStep.GIVE_UP, (f"no step gpumon can take for recovery action {actions}",)
    else:
        floor = wanted
        why.append(
            "recovery action " + ", ".join(f"{a.name} ({u or 'node'})" for u, a in sorted(targets.items()))
        )
    # Never down the ladder: a step that failed is not followed by a lighter one.
    heaviest = max((LADDER.index(a.step) for a in rec.attempts if a.step in LADDER), default=0)
    for step in LADDER[max(LADDER.index(floor), heaviest) :]:
        if not policy.allows(step):
            continue
        tried = rec.tried(step)
        if tried >= policy.max_attempts:
            why.append(f"{step.value} tried {tried} time(s)")
            continue
        if step is LadderStep.REPLACE and inp.machinery is Machinery.NONE:
            return LadderStep.GIVE_UP, (
                *why,
                "the machine needs replacing and the pool has no machinery gpumon can drive (report only)",
            )
        return step, tuple(why)
    return LadderStep.GIVE_UP, (*why, "every step of the ladder was tried")


def _gated(
    inp: RepairInput,
    step: LadderStep,
    targets: Mapping[str, RecoveryAction],
    now: float,
    policy: RepairPolicy,
    why: tuple[str, ...],
    refusal: str | None,
) -> RepairPlan:
    # Every step names the GPUs it is for ("" for a node-scoped finding): a reboot's or a
    # replacement's success is judged on them too.
    gpus = tuple(targets)
    free = inp.gpus_free if step is LadderStep.RESET else inp.node_free if step is LadderStep.REBOOT else True
    if not free:
        waited_since = inp.quarantined_at or now
        if now - waited_since < policy.free_deadline_seconds:
            what = "the GPUs" if step is LadderStep.RESET else "the node"
            return RepairPlan(
                Move.WAIT,
                LadderStep.DRAIN,
                gpus=gpus,
                reasons=(*why, f"waiting for the pods to leave {what} before the {step.value}"),
                next_check_at=waited_since + policy.free_deadline_seconds,
                drain_node=step is LadderStep.REBOOT,
            )
        # Pods that never leave: the machine's own machinery drains it with its own flow.
        why = (*why, f"pods still on the node after {policy.free_deadline_seconds:g}s: no {step.value}")
        can_replace = policy.replace and inp.machinery is not Machinery.NONE
        if (
            step is LadderStep.REPLACE
            or not can_replace
            or inp.record.tried(LadderStep.REPLACE) >= policy.max_attempts
        ):
            return _give_up(inp, now, why)
        step = LadderStep.REPLACE
    if not inp.record.active and inp.others_repairing >= policy.max_concurrent:
        return RepairPlan(
            Move.WAIT,
            step,
            gpus=gpus,
            reasons=(*why, f"{inp.others_repairing} node(s) of pool {inp.pool!r} repairing already"),
        )
    if refusal is not None:
        return RepairPlan(
            Move.WAIT,
            step,
            gpus=gpus,
            reasons=(*why, refusal),
            events=(
                _event(inp.node, "GpuRepairRefused", f"{step.value} not started: {refusal}", warning=True),
            ),
        )
    plan = _start(inp, step, gpus, now, policy, why)
    return replace(plan, needs_admission=True)


def _start(
    inp: RepairInput,
    step: LadderStep,
    gpus: tuple[str, ...],
    now: float,
    policy: RepairPolicy,
    why: tuple[str, ...],
) -> RepairPlan:
    rec = inp.record
    number = max((a.number for a in rec.attempts), default=0) + 1
    attempt = Attempt(step, number, gpus, now)
    rec = replace(rec, validate=rec.validate or policy.validate)
    escalated = next((a for a in reversed(rec.attempts) if a.outcome is not AttemptOutcome.SUCCEEDED), None)
    what = ", ".join(g for g in gpus if g) or "the node"
    if escalated is not None and step is not LadderStep.VALIDATE:
        reason, text = (
            "GpuRepairEscalated",
            f"{escalated.step.value} {escalated.outcome.value}: now {step.value}",
        )
    else:
        reason, text = "GpuRepairStarted", f"{step.value} started"
    message = f"{text} for {what} (attempt {number}): {'; '.join(why)}"
    return RepairPlan(
        Move.START,
        step,
        attempt=number,
        gpus=gpus,
        reasons=why,
        record=rec.with_attempt(attempt),
        events=(_event(inp.node, reason, message, key=f"{reason}:{number}:{now:.0f}"),),
        next_check_at=now + policy.deadline(step),
    )


def _follow(inp: RepairInput, a: Attempt, now: float, policy: RepairPolicy) -> RepairPlan:
    """The running attempt: keep its work in place, notice how it ended, or time it out."""
    deadline = a.started_at + policy.deadline(a.step)
    # A reboot takes its own Job down with the node: however the Job ends, the exporter judges.
    ended = inp.work is Work.SUCCEEDED or (a.step is LadderStep.REBOOT and inp.work is Work.FAILED)
    if inp.work is Work.FAILED and not ended:
        return _ended(inp, a, AttemptOutcome.FAILED, now, f"its {_work_name(a.step)} failed")
    if a.work_done_at is None:
        if ended and a.step is not LadderStep.REPLACE:
            if a.step is LadderStep.VALIDATE:
                return _validated(inp, a, now)
            done = replace(a, work_done_at=now)
            return RepairPlan(
                Move.RECORD,
                a.step,
                attempt=a.number,
                gpus=a.gpus,
                reasons=(
                    f"the Job ended ({inp.work.value}): waiting for the exporter to report the GPUs healthy",
                ),
                record=inp.record.with_attempt(done),
                next_check_at=deadline,
            )
        if now >= deadline:
            return _ended(
                inp, a, AttemptOutcome.TIMED_OUT, now, f"not finished within {policy.deadline(a.step):g}s"
            )
        move = Move.ENSURE if inp.work is Work.ABSENT else Move.WAIT
        return RepairPlan(move, a.step, attempt=a.number, gpus=a.gpus, next_check_at=deadline)
    # The work is done: success is the exporter's word, never the Job's exit code.
    if inp.verdict.signals is SignalStatus.FRESH and _healthy_again(inp.reading, a.gpus):
        return _ended(
            inp, a, AttemptOutcome.SUCCEEDED, now, "the exporter reports the GPUs healthy with action NONE"
        )
    if now >= deadline:
        return _ended(
            inp, a, AttemptOutcome.FAILED, now, "the GPUs were not healthy with action NONE after it"
        )
    return RepairPlan(Move.WAIT, a.step, attempt=a.number, gpus=a.gpus, next_check_at=deadline)


def _work_name(step: LadderStep) -> str:
    return "machine deletion" if step is LadderStep.REPLACE else "Job"


def _ended(inp: RepairInput, a: Attempt, outcome: AttemptOutcome, now: float, detail: str) -> RepairPlan:
    ok = outcome is AttemptOutcome.SUCCEEDED
    reason = "GpuRepairSucceeded" if ok else "GpuRepairFailed"
    what = ", ".join(g for g in a.gpus if g) or "the node"
    message = f"{a.step.value} of {what} (attempt {a.number}) {outcome.value}: {detail}"
    return RepairPlan(
        Move.RECORD,
        a.step,
        attempt=a.number,
        gpus=a.gpus,
        reasons=(detail,),
        record=inp.record.with_attempt(a.finished(outcome, now, detail)),
        events=(
            _event(inp.node, reason, message, warning=not ok, key=f"{reason}:{a.number}:{a.started_at:.0f}"),
        ),
        next_check_at=now,
    )


def _validated(inp: RepairInput, a: Attempt, now: float) -> RepairPlan:
    plan = _ended(inp, a, AttemptOutcome.SUCCEEDED, now, "the validation Job succeeded")
    assert plan.record is not None
    return replace(plan, record=replace(plan.record, validated_at=now))


def _give_up(inp: RepairInput, now: float, why: tuple[str, ...]) -> RepairPlan:
    tried = "; ".join(
        f"{a.step.value} {a.outcome.value}" + (f" ({a.detail})" if a.detail else "")
        for a in inp.record.attempts
    )
    message = f"repair gave up: {'; '.join(why)}. Tried: {tried or 'nothing'}. The quarantine stays"
    return RepairPlan(
        Move.RECORD,
        LadderStep.GIVE_UP,
        reasons=why,
        record=replace(inp.record, gave_up_at=now),
        events=(
            _event(inp.node, "GpuRepairGaveUp", message, warning=True, key=f"GpuRepairGaveUp:{now:.0f}"),
        ),
    )


def _finish_ladder(inp: RepairInput, now: float, policy: RepairPolicy) -> RepairPlan:
    """The node is healthy through the hysteresis: the ladder (if any) is over. Repairs older
    than the flap window are forgotten: they can send nothing to replacement any more."""
    rec = inp.record
    if not rec.attempts and rec.gave_up_at is None:
        return NOTHING
    window = policy.flap_window_seconds
    repaired = {u: at for u, at in rec.repaired.items() if now - at <= window}
    if rec.gave_up_at is None:
        for a in rec.attempts:
            for uuid in a.gpus:
                repaired[uuid] = now
    steps = ", ".join(f"{a.step.value} {a.outcome.value}" for a in rec.attempts) or "nothing"
    return RepairPlan(
        Move.RECORD,
        LadderStep.DONE,
        reasons=(f"healthy again after: {steps}",),
        record=RepairRecord(repaired=MappingProxyType(repaired)),
        events=(
            _event(
                inp.node,
                "GpuRepairDone",
                f"node back in service after: {steps}",
                key=f"GpuRepairDone:{now:.0f}",
            ),
        ),
    )
