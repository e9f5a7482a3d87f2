"""Runs check families side by side, each with a deadline that nothing can stretch.

A family's ``gather`` blocks (NVML, a unix socket, the API server, /proc), so it runs in a
daemon thread; the caller waits for it until the shared deadline and then moves on. A gather
that never returns stays blocked in its thread, which the interpreter abandons at exit (daemon
threads are never joined), and its family is reported as failed with the probe's fix. A gather
that raises is reported the same way, so one broken family never hides the others.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from gpumon.doctor.result import CheckResult, Status

F = TypeVar("F")


@dataclass(frozen=True, slots=True)
class Probe(Generic[F]):
    family: str
    name: str  # what is being asked, e.g. "NVML", "pod-resources socket"
    gather: Callable[[], F]  # blocking: reads the machine
    judge: Callable[[F], Sequence[CheckResult]]  # pure
    fix: str  # what to do when gathering never answers or breaks


@dataclass(frozen=True, slots=True)
class ProbeOutcome:
    family: str
    facts: Any  # None when the gather timed out or raised
    results: tuple[CheckResult, ...]
    seconds: float
    timed_out: bool = False  # its gather is still blocked in a daemon thread


class _Job:
    def __init__(self, gather: Callable[[], Any], clock: Callable[[], float]) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.finished_at: float | None = None
        self._gather = gather
        self._clock = clock

    def __call__(self) -> None:
        try:
            self.value = self._gather()
        except BaseException as e:  # reported as a failed check; the thread ends either way
            self.error = e
        finally:
            self.finished_at = self._clock()
            self.done.set()


def run(
    probes: Sequence[Probe[Any]],
    *,
    timeout_seconds: float,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[ProbeOutcome, ...]:
    """Gather every probe at once; judge each one that answered within ``timeout_seconds``."""
    started = clock()
    jobs = []
    for probe in probes:
        job = _Job(probe.gather, clock)
        threading.Thread(target=job, name=f"doctor {probe.family}", daemon=True).start()
        jobs.append(job)
    deadline = started + timeout_seconds
    outcomes = []
    for probe, job in zip(probes, jobs, strict=True):
        job.done.wait(max(0.0, deadline - clock()))
        outcomes.append(_outcome(probe, job, started, timeout_seconds))
    return tuple(outcomes)


def _outcome(probe: Probe[Any], job: _Job, started: float, timeout_seconds: float) -> ProbeOutcome:
    if not job.done.is_set():
        found = f"{probe.name}: no answer within {timeout_seconds:g}s"
        failed = _failed(probe, found, timeout_seconds)
        return ProbeOutcome(probe.family, None, (failed,), timeout_seconds, timed_out=True)
    seconds = (job.finished_at or started) - started
    if job.error is not None:
        found = f"{probe.name}: {type(job.error).__name__}: {job.error}"
        return ProbeOutcome(probe.family, None, (_failed(probe, found, seconds),), seconds)
    try:
        results = tuple(probe.judge(job.value))
    except Exception as e:  # a bug in a judge must not hide the other families
        found = f"{probe.name}: cannot judge what was found ({type(e).__name__}: {e})"
        results = (_failed(probe, found, seconds),)
    return ProbeOutcome(probe.family, job.value, tuple(replace(r, seconds=seconds) for r in results), seconds)


def _failed(probe: Probe[Any], found: str, seconds: float) -> CheckResult:
    return CheckResult(probe.family, probe.name, Status.FAIL, found, probe.fix, seconds=seconds)
