"""The doctor's check runner: deadlines that a hung check cannot stretch, failures reported as
checks, and the exit code of a run."""

from __future__ import annotations

import threading

import pytest

from gpumon.doctor.result import CheckResult, Status, counts, exit_code
from gpumon.doctor.runner import Probe, run


def ok(found: str) -> list[CheckResult]:
    return [CheckResult("fam", "check", Status.OK, found)]


@pytest.mark.timeout(30)
def test_a_hanging_check_ends_at_its_timeout_as_a_failure_and_the_others_still_report() -> None:
    never = threading.Event()
    try:
        outcomes = run(
            [
                Probe("stuck", "a call that never returns", never.wait, ok, "the fix for a hang"),
                Probe("quick", "a call that answers", lambda: "fine", ok, "unused"),
            ],
            timeout_seconds=0.3,
        )
    finally:
        never.set()  # let the abandoned thread end
    stuck, quick = outcomes
    assert stuck.timed_out and stuck.facts is None
    (r,) = stuck.results
    assert (r.family, r.status, r.fix) == ("stuck", Status.FAIL, "the fix for a hang")
    assert r.found == "a call that never returns: no answer within 0.3s"
    assert not quick.timed_out
    assert [(x.status, x.found) for x in quick.results] == [(Status.OK, "fine")]
    assert quick.results[0].seconds is not None


def test_a_check_that_raises_is_a_failure_naming_the_error() -> None:
    def broken() -> str:
        raise PermissionError("no access to /dev/nvidiactl")

    (outcome,) = run([Probe("devices", "device files", broken, ok, "the fix")], timeout_seconds=5)
    (r,) = outcome.results
    assert r.status is Status.FAIL and not outcome.timed_out
    assert r.found == "device files: PermissionError: no access to /dev/nvidiactl"
    assert r.fix == "the fix"


def test_a_judge_that_breaks_does_not_hide_the_family() -> None:
    def judge(facts: str) -> list[CheckResult]:
        raise KeyError(facts)

    (outcome,) = run([Probe("nvml", "NVML", lambda: "odd", judge, "fix")], timeout_seconds=5)
    (r,) = outcome.results
    assert r.status is Status.FAIL and "cannot judge" in r.found and outcome.facts == "odd"


def test_checks_run_side_by_side_so_one_deadline_covers_them_all() -> None:
    # Each waits for the other: run one after the other, both would time out.
    a, b = threading.Event(), threading.Event()

    def first() -> str:
        a.set()
        return "a" if b.wait(10) else "alone"

    def second() -> str:
        b.set()
        return "b" if a.wait(10) else "alone"

    outcomes = run([Probe("x", "x", first, ok, ""), Probe("y", "y", second, ok, "")], timeout_seconds=20)
    assert [o.results[0].found for o in outcomes] == ["a", "b"]


@pytest.mark.parametrize(
    ("statuses", "code"),
    [
        ((), 0),
        ((Status.OK, Status.OK), 0),
        ((Status.OK, Status.WARN), 1),
        ((Status.WARN, Status.FAIL, Status.OK), 2),
    ],
)
def test_exit_code_is_the_worst_status(statuses: tuple[Status, ...], code: int) -> None:
    results = [CheckResult("f", str(i), s, "") for i, s in enumerate(statuses)]
    assert exit_code(results) == code
    assert sum(counts(results).values()) == len(statuses)
