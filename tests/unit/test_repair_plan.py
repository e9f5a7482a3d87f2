"""The repair ladder's planner (gpumon/controller/core/repair.py): every transition, the ladder
resumed from the record a new leader reads off the Node, and each limit blocking it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpumon.config import ConfigError
from gpumon.controller.configure import pool_from_config
from gpumon.controller.core.breaker import PoolView, SafetyPolicy
from gpumon.controller.core.contract import NodePhase
from gpumon.controller.core.contract.breakers import BreakerTrip
from gpumon.controller.core.contract.repair import (
    EMPTY_RECORD,
    Attempt,
    AttemptOutcome,
    LadderStep,
    RepairRecord,
    record_from_json,
    record_to_json,
)
from gpumon.controller.core.objects import PodView
from gpumon.controller.core.repair import (
    Machinery,
    Move,
    RepairInput,
    RepairPolicy,
    Work,
    holding_the_node,
    holds_quarantine,
    needs_the_nodes_pods,
    plan_repair,
    repair_phase,
)
from gpumon.controller.core.repair_gate import admit_repairs, continuing_refusal
from gpumon.controller.core.repair_jobs import job_manifest, job_name, job_work
from gpumon.controller.core.signals import GpuReading, NodeReading, XidSeen
from gpumon.controller.core.verdicts import Finding, GpuVerdict, NodeVerdict, SignalStatus
from gpumon.gpu.health import Severity
from gpumon.gpu.model import HealthReason, HealthState, HealthVerdict, RecoveryAction

T0 = 1_800_000_000.0  # whole seconds: the record keeps RFC 3339 seconds
GPU = "GPU-1"
POLICY = RepairPolicy()


def verdict(*uuids: str, signals: SignalStatus = SignalStatus.FRESH) -> NodeVerdict:
    finding = Finding("recovery-action", Severity.UNHEALTHY, "RecoveryGpuReset", "", "", T0, T0)
    gpus = tuple(GpuVerdict(u, i, (finding,)) for i, u in enumerate(uuids))
    return NodeVerdict("n1", signals, 1.0, gpus)


def gpu(action: RecoveryAction | None, *, healthy: bool = False, **kw: Any) -> GpuReading:
    state = HealthState.HEALTHY if healthy else HealthState.UNHEALTHY
    reasons = () if healthy else (HealthReason("X", "x", state),)
    return GpuReading(GPU, 1, T0, recovery_action=action, health=HealthVerdict(state, reasons), **kw)


def reading(g: GpuReading) -> NodeReading:
    return NodeReading("n1", g.observed_at, (g,))


def node(
    action: RecoveryAction | None = RecoveryAction.GPU_RESET,
    *,
    record: RepairRecord = EMPTY_RECORD,
    healthy: bool = False,
    **kw: Any,
) -> RepairInput:
    fields: dict[str, Any] = {
        "node": "n1",
        "pool": "h100",
        "verdict": verdict(GPU),
        "reading": reading(gpu(action, healthy=healthy)),
        "record": record,
        "quarantined_at": T0,
        "gpus_free": True,
        "node_free": True,
    }
    fields.update(kw)
    return RepairInput(**fields)


def step(inp: RepairInput, now: float, policy: RepairPolicy = POLICY, **kw: Any):
    return plan_repair(inp, now=now, policy=policy, **kw)


def reasons(plan) -> list[str]:
    return [e.reason for e in plan.events]


def running(step_: LadderStep, number: int = 1, at: float = T0, **kw: Any) -> RepairRecord:
    return RepairRecord((Attempt(step_, number, (GPU,), at, **kw),))


# --- the ladder, step by step ----------------------------------------------------------------


def test_a_reset_the_driver_asks_for_waits_for_the_pods_then_starts() -> None:
    waiting = step(node(gpus_free=False), T0 + 10)
    assert (waiting.move, waiting.step, waiting.record) == (Move.WAIT, LadderStep.DRAIN, None)
    assert waiting.next_check_at == T0 + POLICY.free_deadline_seconds
    started = step(node(), T0 + 20)
    assert (started.move, started.step, started.attempt, started.gpus) == (
        Move.START,
        LadderStep.RESET,
        1,
        (GPU,),
    )
    assert started.needs_admission and started.state is NodePhase.RESETTING
    assert started.record == running(LadderStep.RESET, at=T0 + 20)
    assert reasons(started) == ["GpuRepairStarted"]
    assert "recovery action GPU_RESET (GPU-1)" in started.events[0].message
    assert started.next_check_at == T0 + 20 + POLICY.reset_deadline_seconds


def test_success_is_the_exporters_word_not_the_jobs_exit_code() -> None:
    rec = running(LadderStep.RESET)
    # The Job finished: recorded, then the exporter must report the GPU healthy with NONE.
    done = step(node(record=rec, work=Work.SUCCEEDED), T0 + 60)
    assert done.move is Move.RECORD and done.record is not None
    assert (
        done.record.attempts[0].work_done_at == T0 + 60
        and done.record.attempts[0].outcome is AttemptOutcome.RUNNING
    )
    rec = done.record
    still = step(node(record=rec, work=Work.SUCCEEDED), T0 + 70)
    assert (still.move, still.record) == (Move.WAIT, None), "the driver still asks for a reset"
    ok = step(node(RecoveryAction.NONE, healthy=True, record=rec, work=Work.SUCCEEDED), T0 + 80)
    assert ok.move is Move.RECORD and reasons(ok) == ["GpuRepairSucceeded"]
    assert ok.record is not None and ok.record.attempts[0].outcome is AttemptOutcome.SUCCEEDED
    # Repaired: the verdict clears through the rules' hysteresis, nothing else is started.
    after = step(node(RecoveryAction.NONE, healthy=True, record=ok.record), T0 + 90)
    assert (after.move, after.record, after.events) == (Move.WAIT, None, ())
    cleared = step(
        node(RecoveryAction.NONE, healthy=True, record=ok.record, verdict=verdict(), quarantined_at=None),
        T0 + 990,
    )
    assert (
        cleared.move is Move.RECORD
        and cleared.step is LadderStep.DONE
        and reasons(cleared) == ["GpuRepairDone"]
    )
    assert cleared.record == RepairRecord(repaired={GPU: T0 + 990}), "remembered for the flap window"
    # An old repair of another GPU is forgotten once its window has passed.
    old = replace(ok.record, repaired={"GPU-0": T0 - POLICY.flap_window_seconds, "GPU-2": T0})
    back = node(RecoveryAction.NONE, healthy=True, record=old, verdict=verdict(), quarantined_at=None)
    kept = step(back, T0 + 990).record
    assert kept is not None and dict(kept.repaired) == {GPU: T0 + 990, "GPU-2": T0}


def test_an_unsupported_action_on_an_old_driver_is_where_the_catalog_stands_in() -> None:
    xid48 = gpu(None, xids=(XidSeen(48, T0),))
    assert step(node(reading=reading(xid48)), T0 + 5).step is LadderStep.RESET
    xid79 = gpu(None, xids=(XidSeen(48, T0), XidSeen(79, T0)))
    assert step(node(reading=reading(xid79)), T0 + 5).step is LadderStep.REBOOT, "the heavier of the two"
    lost = gpu(None, lost=True)
    assert step(node(reading=reading(lost)), T0 + 5).step is LadderStep.REBOOT
    old = gpu(None, xids=(XidSeen(48, T0 - 3600),))
    assert step(node(reading=reading(old)), T0 + 5).move is Move.WAIT, "outside the Xid window: nothing"
    # No Xid left in the window, but the finding says why: a volatile ECC count needs a reset.
    finding = Finding("ecc-uncorrectable", Severity.UNHEALTHY, "EccUncorrectable", "2", "", T0, T0)
    ecc = NodeVerdict("n1", SignalStatus.FRESH, 1.0, (GpuVerdict(GPU, 1, (finding,)),))
    assert step(node(reading=reading(old), verdict=ecc), T0 + 5).step is LadderStep.RESET


def test_the_driver_asking_for_a_reboot_skips_the_reset() -> None:
    plan = step(node(RecoveryAction.SYSTEM_REBOOT), T0 + 5)
    assert (plan.step, plan.gpus, plan.state) == (LadderStep.REBOOT, (GPU,), NodePhase.REBOOTING)
    waiting = step(node(RecoveryAction.NODE_REBOOT, node_free=False), T0 + 5)
    assert waiting.step is LadderStep.DRAIN and waiting.drain_node, "the pods left on the node are evicted"
    assert not step(node(gpus_free=False), T0 + 5).drain_node, "a reset waits for the quarantine's drain"


def test_only_a_reboot_in_waiting_has_the_nodes_pods_listed() -> None:
    def needs(inp: RepairInput, now: float = T0 + 5, policy: RepairPolicy = POLICY) -> bool:
        return needs_the_nodes_pods(inp, now=now, policy=policy)

    assert needs(node(RecoveryAction.NODE_REBOOT)), "the reboot's turn: every pod of the node counts"
    assert needs(node(RecoveryAction.NODE_REBOOT, node_free=False)), "however the caches see it"
    assert not needs(node(RecoveryAction.GPU_RESET)), "a reset waits for its GPUs' pods only"
    assert not needs(node(RecoveryAction.NODE_REBOOT, record=running(LadderStep.REBOOT))), "under way"
    assert not needs(node(RecoveryAction.NONE, healthy=True)), "nothing to repair"
    assert not needs(node(RecoveryAction.NODE_REBOOT), policy=replace(POLICY, reboot=False)), "no reboots"


def test_every_pod_but_daemonset_mirror_and_finished_ones_holds_the_node() -> None:
    pods = [
        PodView("ml", "train", "u1", "n1", "Running", uses_gpu=True),
        PodView("web", "cache", "u2", "n1", "Running"),  # no GPU: the reboot takes it down all the same
        PodView("web", "going", "u3", "n1", "Running", terminating=True),  # still there
        PodView("kube-system", "agent", "u4", "n1", "Running", owner_kind="DaemonSet"),
        PodView("kube-system", "static", "u5", "n1", "Running", mirror=True),
        PodView("ml", "done", "u6", "n1", "Succeeded"),
    ]
    assert [p.name for p in holding_the_node(pods)] == ["train", "cache", "going"]


def test_a_failed_reset_escalates_to_a_reboot_and_a_failed_reboot_to_replacement() -> None:
    failed = step(node(record=running(LadderStep.RESET), work=Work.FAILED), T0 + 30)
    assert failed.move is Move.RECORD and reasons(failed) == ["GpuRepairFailed"]
    assert failed.record is not None and failed.record.attempts[0].detail == "its Job failed"
    reboot = step(node(record=failed.record), T0 + 31)
    assert (reboot.move, reboot.step, reboot.attempt) == (Move.START, LadderStep.REBOOT, 2)
    assert (
        reasons(reboot) == ["GpuRepairEscalated"] and "reset failed: now reboot" in reboot.events[0].message
    )
    assert "reset tried 1 time(s)" in reboot.reasons
    assert reboot.record is not None
    # The reboot ran (its Job ended) but the driver still asks for a reset at the deadline.
    ran = step(node(record=reboot.record, work=Work.FAILED), T0 + 40)
    assert ran.record is not None
    deadline = T0 + 31 + POLICY.reboot_deadline_seconds
    broke = step(node(record=ran.record, work=Work.FAILED), deadline)
    assert broke.record is not None and broke.record.attempts[-1].outcome is AttemptOutcome.FAILED
    replace_ = step(node(record=broke.record, machinery=Machinery.CLUSTER_API), deadline + 1)
    assert (replace_.move, replace_.step, replace_.attempt) == (Move.START, LadderStep.REPLACE, 3)
    assert replace_.state is NodePhase.REPLACING and replace_.needs_admission


def test_a_reboot_is_judged_by_the_exporter_however_its_job_ends() -> None:
    # The reboot takes its own Job's pod down with the node: a failed Job is no verdict.
    rec = running(LadderStep.REBOOT)
    done = step(node(RecoveryAction.NODE_REBOOT, record=rec, work=Work.FAILED), T0 + 60)
    assert done.move is Move.RECORD and done.record is not None
    assert (
        done.record.attempts[0].work_done_at == T0 + 60
        and done.record.attempts[0].outcome is AttemptOutcome.RUNNING
    )
    back = node(RecoveryAction.NONE, healthy=True, record=done.record, work=Work.FAILED)
    assert step(back, T0 + 300).record.attempts[0].outcome is AttemptOutcome.SUCCEEDED  # type: ignore[union-attr]
    never = node(RecoveryAction.NODE_REBOOT, record=done.record, work=Work.FAILED)
    late = step(never, T0 + POLICY.reboot_deadline_seconds)
    assert late.record is not None and late.record.attempts[0].outcome is AttemptOutcome.FAILED
    # A reset's failed Job is a failed reset.
    assert (
        step(node(record=running(LadderStep.RESET), work=Work.FAILED), T0 + 60).events[0].reason
        == "GpuRepairFailed"
    )


def test_a_reset_that_times_out_escalates() -> None:
    rec = running(LadderStep.RESET)
    waiting = step(node(record=rec, work=Work.RUNNING), T0 + 100)
    assert (waiting.move, waiting.next_check_at) == (Move.WAIT, T0 + POLICY.reset_deadline_seconds)
    late = step(node(record=rec, work=Work.RUNNING), T0 + POLICY.reset_deadline_seconds)
    assert late.record is not None and late.record.attempts[0].outcome is AttemptOutcome.TIMED_OUT
    # The Job succeeded but the GPU never came back: failed at the deadline.
    done = replace(rec.attempts[0], work_done_at=T0 + 50)
    never = step(node(record=RepairRecord((done,))), T0 + POLICY.reset_deadline_seconds)
    assert never.record is not None and never.record.attempts[0].outcome is AttemptOutcome.FAILED
    assert step(node(record=never.record), T0 + 700).step is LadderStep.REBOOT


def test_replacement_without_machinery_is_reported_and_the_ladder_gives_up() -> None:
    rec = RepairRecord(
        (
            Attempt(
                LadderStep.RESET,
                1,
                (GPU,),
                T0,
                AttemptOutcome.FAILED,
                ended_at=T0 + 10,
                detail="its Job failed",
            ),
            Attempt(LadderStep.REBOOT, 2, ("",), T0 + 20, AttemptOutcome.TIMED_OUT, ended_at=T0 + 30),
        )
    )
    gave_up = step(node(record=rec), T0 + 40)
    assert (gave_up.move, gave_up.step) == (Move.RECORD, LadderStep.GIVE_UP)
    assert reasons(gave_up) == ["GpuRepairGaveUp"] and gave_up.events[0].warning
    message = gave_up.events[0].message
    assert "report only" in message and "reset failed (its Job failed); reboot timed_out" in message
    assert gave_up.record is not None and gave_up.record.gave_up_at == T0 + 40
    assert step(node(record=gave_up.record), T0 + 50).move is Move.NONE, "a person's turn"
    # Healthy again (a person acted): the record is cleared, nothing is remembered as repaired.
    back = step(node(healthy=True, record=gave_up.record, verdict=verdict()), T0 + 60)
    assert back.record == RepairRecord()


def test_a_gpu_faulting_again_within_the_flap_window_has_its_machine_replaced() -> None:
    rec = RepairRecord(repaired={GPU: T0 - 3600})
    assert step(node(record=rec, machinery=Machinery.KARPENTER), T0).step is LadderStep.REPLACE
    stale = RepairRecord(repaired={GPU: T0 - POLICY.flap_window_seconds - 1})
    assert step(node(record=stale, machinery=Machinery.KARPENTER), T0).step is LadderStep.RESET
    now = step(node(machinery=Machinery.KARPENTER), T0, replace(POLICY, replace_immediately=True))
    assert now.step is LadderStep.REPLACE and "the pool replaces straight away" in now.reasons
    # The second ladder's attempts are numbered from 1 again: its Events are not taken for
    # repeats of the first ladder's (an Event recorder sends one per key an hour).
    first = step(node(machinery=Machinery.KARPENTER), T0 - 3700)
    again = step(node(record=rec, machinery=Machinery.KARPENTER), T0)
    assert (first.attempt, again.attempt) == (1, 1) and first.events[0].key != again.events[0].key


def test_a_fault_again_before_a_round_saw_the_node_healthy_ends_the_ladder_and_flaps() -> None:
    # The quarantine lifted at T0 + 100 (validated at T0 + 80, the rules clear after that) and a
    # new fault brought it back at T0 + 101, before a repair round read the node healthy.
    validated = RepairRecord(
        (
            Attempt(LadderStep.RESET, 1, (GPU,), T0, AttemptOutcome.SUCCEEDED, T0 + 50, T0 + 60),
            Attempt(LadderStep.VALIDATE, 2, (GPU,), T0 + 70, AttemptOutcome.SUCCEEDED, None, T0 + 80.4),
        ),
        validate=True,
        validated_at=T0 + 80.4,
    )
    policy = replace(POLICY, validate=True)
    again = node(
        RecoveryAction.NONE, record=validated, quarantined_at=T0 + 101, machinery=Machinery.CLUSTER_API
    )
    ended = step(again, T0 + 102, policy)
    assert (ended.move, ended.step) == (Move.RECORD, LadderStep.DONE)
    assert ended.record == RepairRecord(repaired={GPU: T0 + 102})
    flap = step(replace(again, record=ended.record), T0 + 103, policy)
    assert flap.step is LadderStep.REPLACE and any("faulted again" in r for r in flap.reasons)
    # The first quarantine, still held for the rules to clear, is not a new one: the ladder waits.
    same = step(replace(again, quarantined_at=T0 - 5), T0 + 102, policy)
    assert same.move is Move.WAIT
    # In the second the validation ended in: a quarantine's time has whole seconds.
    assert step(replace(again, quarantined_at=T0 + 80), T0 + 102, policy).move is Move.RECORD


def test_the_driver_asking_for_nothing_gpumon_runs() -> None:
    assert step(node(RecoveryAction.DRAIN_P2P), T0).move is Move.WAIT
    assert step(node(RecoveryAction.NONE), T0).move is Move.WAIT
    imex = step(node(RecoveryAction.RECOVER_IMEX_DOMAIN), T0)
    assert imex.step is LadderStep.GIVE_UP and "RECOVER_IMEX_DOMAIN" in imex.events[0].message


def test_a_replacement_is_followed_to_its_deadline() -> None:
    rec = running(LadderStep.REPLACE)
    assert step(node(record=rec, work=Work.ABSENT), T0 + 1).move is Move.ENSURE
    assert step(node(record=rec, work=Work.RUNNING), T0 + 1).move is Move.WAIT
    late = step(node(record=rec, work=Work.RUNNING), T0 + POLICY.replace_deadline_seconds)
    assert late.record is not None and late.record.attempts[0].outcome is AttemptOutcome.TIMED_OUT
    assert (
        step(node(record=late.record, machinery=Machinery.CLUSTER_API), T0 + 3601).step is LadderStep.GIVE_UP
    )


# --- validation before return to service ------------------------------------------------------


def test_validation_runs_after_the_repair_and_holds_the_quarantine_until_it_passes() -> None:
    policy = replace(POLICY, validate=True)
    started = step(node(), T0, policy)
    assert started.record is not None and holds_quarantine(started.record), "from the first step on"
    assert step(node(), T0).record == replace(started.record, validate=False), "a pool without validation"
    assert not holds_quarantine(replace(started.record, validate=False))
    fixed = RepairRecord(
        (Attempt(LadderStep.RESET, 1, (GPU,), T0, AttemptOutcome.SUCCEEDED, T0 + 50, T0 + 60),), validate=True
    )
    # Validation starts nothing disruptive: never refused by the breaker.
    plan = step(
        node(RecoveryAction.NONE, healthy=True, record=fixed), T0 + 70, policy, refusal="breaker open"
    )
    assert (plan.move, plan.step, plan.attempt, plan.needs_admission) == (
        Move.START,
        LadderStep.VALIDATE,
        2,
        False,
    )
    assert plan.state is NodePhase.VALIDATING and plan.gpus == (GPU,)
    assert plan.record is not None
    ok = step(
        node(RecoveryAction.NONE, healthy=True, record=plan.record, work=Work.SUCCEEDED), T0 + 80, policy
    )
    assert ok.record is not None and ok.record.validated_at == T0 + 80 and not holds_quarantine(ok.record)
    # The rules cleared but the quarantine was held for the validation: now the ladder ends.
    healthy = dict(verdict=verdict(), healthy=True)
    assert step(node(RecoveryAction.NONE, record=plan.record, **healthy), T0 + 75, policy).move is Move.ENSURE
    assert (
        step(node(RecoveryAction.NONE, record=ok.record, **healthy), T0 + 90, policy).step is LadderStep.DONE
    )
    # A validation that fails sends the ladder on.
    bad = step(node(RecoveryAction.NONE, healthy=True, record=plan.record, work=Work.FAILED), T0 + 80, policy)
    assert step(node(record=bad.record), T0 + 81, policy).step is LadderStep.REBOOT


# --- the ladder resumed by a new leader ----------------------------------------------------------


def test_a_new_leader_continues_from_the_record_and_never_starts_a_step_again() -> None:
    started = step(node(), T0)
    assert started.record is not None
    # The leader dies after writing the record, before creating the Job.
    read_back = record_from_json(record_to_json(started.record))
    assert read_back == started.record
    resumed = step(node(record=read_back, work=Work.ABSENT), T0 + 30)
    assert (resumed.move, resumed.attempt, resumed.record) == (Move.ENSURE, 1, None), "its Job, not a new one"
    assert not resumed.needs_admission
    # The Job ran under the old leader; the new one sees it finished.
    finished = step(node(record=read_back, work=Work.SUCCEEDED), T0 + 40)
    assert finished.record is not None and finished.record.attempts[0].number == 1
    assert len(finished.record.attempts) == 1


def test_the_record_codec_round_trips_and_an_unreadable_record_stops_the_ladder() -> None:
    rec = RepairRecord(
        (
            Attempt(LadderStep.RESET, 1, (GPU,), T0, AttemptOutcome.FAILED, T0 + 5, T0 + 9, "its Job failed"),
            Attempt(LadderStep.REBOOT, 2, ("",), T0 + 10),
        ),
        validated_at=None,
        repaired={"GPU-0": T0 - 60},
    )
    assert record_from_json(record_to_json(rec)) == rec
    assert record_from_json(None) == EMPTY_RECORD
    for junk in ("{", '{"attempts":[{"step":"dance","n":1,"startedAt":"2027-01-15T08:00:00Z"}]}', "[]"):
        assert record_from_json(junk).gave_up_at == 0.0, junk
        assert step(node(record=record_from_json(junk)), T0).move is Move.NONE


# --- every limit blocking -------------------------------------------------------------------------


def test_an_excluded_node_and_unknown_signals_start_nothing() -> None:
    assert step(node(excluded=True), T0).move is Move.NONE
    stale = node(verdict=verdict(GPU, signals=SignalStatus.STALE))
    assert step(stale, T0).move is Move.NONE
    # A step under way is still followed to its deadline: a rebooting node goes dark.
    rec = running(LadderStep.REBOOT)
    dark = node(
        record=rec, verdict=verdict(GPU, signals=SignalStatus.MISSING), reading=None, work=Work.RUNNING
    )
    late = step(dark, T0 + POLICY.reboot_deadline_seconds)
    assert late.record is not None and late.record.attempts[0].outcome is AttemptOutcome.TIMED_OUT


def test_at_most_max_concurrent_nodes_of_a_pool_repair_at_once() -> None:
    busy = step(node(others_repairing=1), T0)
    assert (busy.move, busy.record) == (Move.WAIT, None)
    assert "1 node(s) of pool 'h100' repairing already" in busy.reasons
    assert step(node(others_repairing=1), T0, replace(POLICY, max_concurrent=2)).move is Move.START
    # A node whose ladder is under way goes on to its next step.
    failed = RepairRecord((Attempt(LadderStep.RESET, 1, (GPU,), T0, AttemptOutcome.FAILED, ended_at=T0 + 5),))
    assert step(node(record=failed, others_repairing=3), T0 + 6).move is Move.START


def test_a_refusal_from_the_breaker_or_rate_limit_holds_the_step_with_an_event() -> None:
    held = step(node(), T0, refusal="circuit breaker open for pool 'h100'")
    assert (held.move, held.step, held.record) == (Move.WAIT, LadderStep.RESET, None)
    assert reasons(held) == ["GpuRepairRefused"] and "circuit breaker open" in held.events[0].message


def test_attempts_and_steps_follow_the_pool_config() -> None:
    twice = replace(POLICY, max_attempts=2)
    one_failed = RepairRecord(
        (Attempt(LadderStep.RESET, 1, (GPU,), T0, AttemptOutcome.FAILED, ended_at=T0 + 5),)
    )
    assert step(node(record=one_failed), T0 + 6, twice).step is LadderStep.RESET
    assert step(node(record=one_failed), T0 + 6).step is LadderStep.REBOOT
    no_reset = replace(POLICY, reset=False)
    assert step(node(), T0, no_reset).step is LadderStep.REBOOT
    nothing = replace(POLICY, reset=False, reboot=False, replace=False)
    assert step(node(), T0, nothing).step is LadderStep.GIVE_UP


def test_pods_that_never_leave_escalate_to_the_machinery_or_give_up() -> None:
    late = T0 + POLICY.free_deadline_seconds
    stuck = step(node(gpus_free=False, machinery=Machinery.CLUSTER_API), late)
    assert stuck.step is LadderStep.REPLACE and "pods still on the node" in stuck.reasons[-1]
    assert step(node(gpus_free=False), late).step is LadderStep.GIVE_UP


def test_new_steps_are_admitted_through_the_quarantines_breaker_and_rate_limit() -> None:
    safety = SafetyPolicy(rate_limit_max=1)
    got = admit_repairs(
        [("a", "h100", T0), ("b", "h100", T0 + 1), ("c", "l4", T0 + 2)],
        {"h100": PoolView(10), "l4": PoolView(10)},
        {"l4": BreakerTrip("l4", T0 - 60, "too many")},
        now=T0 + 5,
        policy=safety,
    )
    assert got.admitted == {"a"}
    assert got.refused["b"].startswith("rate limit") and got.refused["c"].startswith("circuit breaker open")
    # A wave of repairs trips the breaker as a wave of quarantines does.
    wave = admit_repairs(
        [("d", "h100", T0)], {"h100": PoolView(10, (T0 - 10, T0 - 5))}, {}, now=T0, policy=SafetyPolicy()
    )
    assert wave.tripped and "circuit breaker tripped" in wave.refused["d"]


# --- config ----------------------------------------------------------------------------------------


JOB = {"template": {"spec": {"containers": [{"name": "reset", "image": "nvidia/cuda:12"}]}}}
JOBS = {"reset_job": JOB, "reboot_job": JOB}


def pool(**repair: Any) -> dict[str, Any]:
    return {
        "name": "h100",
        "target": {"namespace": "capi", "name": "gpu-h100"},
        "node_selector": "pool=h100",
        "template": {"resources": {"nvidia.com/gpu": 8}},
        "max_replicas": 4,
        "repair": {**JOBS, **repair},
    }


def test_repair_is_opt_in_per_pool_and_converted_once(tmp_path) -> None:
    from test_autoscale_config import load_pools

    plain = {**pool(), "name": "x", "repair": None, "target": {"namespace": "capi", "name": "x"}}
    on = pool(steps=["reboot", "replace"], max_concurrent=2, reset_job=None, validation_job=JOB)
    cfg = load_pools(tmp_path, on, plain)
    repaired, off = (pool_from_config(p) for p in cfg.pools)
    assert off.repair is None, "off unless the pool asks"
    assert repaired.repair is not None
    assert repaired.repair.policy == RepairPolicy(reset=False, max_concurrent=2, validate=True)
    assert set(repaired.repair.templates) == {LadderStep.REBOOT, LadderStep.VALIDATE}


@pytest.mark.parametrize(
    ("repair", "field"),
    [
        ({"steps": []}, "pools.0.repair.steps"),
        ({"steps": ["reset", "reset"]}, "pools.0.repair.steps"),
        ({"steps": ["pray"]}, "pools.0.repair.steps.0"),
        ({"max_attempts": 0}, "pools.0.repair.max_attempts"),
        ({"reset_deadline_seconds": 0}, "pools.0.repair.reset_deadline_seconds"),
        ({"surprise": True}, "pools.0.repair.surprise"),
        ({"reset_job": None}, "pools.0.repair: reset_job: required while steps has reset"),
        ({"reboot_job": {"template": {"spec": {}}}}, "pools.0.repair.reboot_job.template: spec.containers"),
        (
            {"validation_job": {"template": {"spec": {"containers": [{"name": "burn"}]}}}},
            "pools.0.repair.validation_job.template: spec.containers.0: needs a name and an image",
        ),
    ],
)
def test_an_invalid_repair_section_names_the_field(tmp_path, repair: dict[str, Any], field: str) -> None:
    from test_autoscale_config import load_pools

    with pytest.raises(ConfigError) as err:
        load_pools(tmp_path, pool(**repair))
    assert field in str(err.value)


# --- the node-local steps as Jobs -------------------------------------------------------------------


def test_a_steps_job_is_pinned_to_its_node_tolerates_the_quarantine_and_is_told_what_to_do() -> None:
    template = {
        "metadata": {"labels": {"app": "gpu-reset"}},
        "spec": {
            "containers": [
                {"name": "reset", "image": "nvidia/cuda:12", "securityContext": {"privileged": True}}
            ]
        },
    }
    job = job_manifest(
        node="gpu-node-7",
        step=LadderStep.RESET,
        attempt=2,
        gpus=("GPU-1", "GPU-3"),
        action="GPU_RESET",
        template=template,
        namespace="gpumon-system",
        deadline_seconds=600,
    )
    assert job["metadata"]["name"] == job_name("gpu-node-7", LadderStep.RESET, 2)
    assert (
        job["metadata"]["name"]
        != job_name("gpu-node-7", LadderStep.RESET, 3)
        != job_name("gpu-node-8", LadderStep.RESET, 2)
    )
    assert len(job_name("n" * 253, LadderStep.VALIDATE, 99)) <= 63
    spec = job["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (
        0,
        600,
        86400,
    )
    pod = spec["template"]
    assert pod["metadata"]["labels"]["app"] == "gpu-reset", "the template's own kept"
    assert pod["spec"]["restartPolicy"] == "Never"
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["gpu-node-7"]
    assert {"key": "gpumon.io/gpu-unhealthy", "operator": "Exists"} in pod["spec"]["tolerations"]
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"] == {"privileged": True}, "privilege is the template's alone"
    assert {e["name"]: e["value"] for e in container["env"]} == {
        "GPUMON_NODE": "gpu-node-7",
        "GPUMON_GPU_UUIDS": "GPU-1,GPU-3",
        "GPUMON_RECOVERY_ACTION": "GPU_RESET",
    }
    assert "env" not in template["spec"]["containers"][0], "the config's template is not changed"


def test_a_jobs_state_as_the_planner_reads_it() -> None:
    assert job_work(None) is Work.ABSENT
    assert job_work({"status": {}}) is Work.RUNNING
    assert job_work({"status": {"active": 1}}) is Work.RUNNING
    assert job_work({"status": {"succeeded": 1}}) is Work.SUCCEEDED
    failed = {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}
    assert job_work({"status": failed}) is Work.FAILED
    assert job_work({"status": {"failed": 1}}) is Work.FAILED
    for kind in ("FailureTarget", "Failed"):
        deadline = {"conditions": [{"type": kind, "status": "True", "reason": "DeadlineExceeded"}]}
        assert job_work({"status": {**deadline, "failed": 1}}) is Work.EXPIRED, kind
    stale = {"conditions": [{"type": "Failed", "status": "False", "reason": "DeadlineExceeded"}]}
    assert job_work({"status": stale}) is Work.RUNNING


def test_a_job_ended_at_its_deadline_is_a_step_timed_out_whoever_notices_first() -> None:
    # The Job's deadline is the attempt's, but its start time is kept to the whole second: the
    # Job controller may end it just before the attempt's own deadline, or just after.
    for step_ in (LadderStep.RESET, LadderStep.REBOOT):
        rec = running(step_)
        deadline = T0 + POLICY.deadline(step_)
        early = step(node(record=rec, work=Work.EXPIRED), deadline - 0.5)
        assert (early.move, early.next_check_at) == (Move.WAIT, deadline), step_
        for at in (deadline, deadline + 5):
            late = step(node(record=rec, work=Work.EXPIRED), at)
            assert late.record is not None, step_
            assert late.record.attempts[0].outcome is AttemptOutcome.TIMED_OUT, (step_, at)


def test_the_label_while_a_step_runs() -> None:
    assert repair_phase(running(LadderStep.REBOOT)) is NodePhase.REBOOTING
    assert repair_phase(running(LadderStep.VALIDATE)) is NodePhase.VALIDATING
    assert repair_phase(EMPTY_RECORD) is None
    failed = RepairRecord((Attempt(LadderStep.RESET, 1, (GPU,), T0, AttemptOutcome.FAILED, ended_at=T0 + 1),))
    assert repair_phase(failed) is None, "between steps: the drain's label"


def test_the_next_step_of_a_ladder_under_way_is_held_by_pause_and_an_open_breaker_only() -> None:
    trip = {"h100": BreakerTrip("h100", T0 - 60, "too many")}
    assert continuing_refusal("h100", {}, SafetyPolicy()) is None
    assert continuing_refusal("h100", trip, SafetyPolicy()).startswith("circuit breaker open for pool 'h100'")
    assert continuing_refusal("h100", trip, SafetyPolicy(breaker_enabled=False)) is None
    assert continuing_refusal("h100", {}, SafetyPolicy(paused=True)) == "paused"
