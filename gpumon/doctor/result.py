"""What one check concluded, and the exit code of a whole run (pure)."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


class Status(enum.StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"

    @property
    def exit_code(self) -> int:
        return {Status.OK: 0, Status.WARN: 1, Status.FAIL: 2}[self]


@dataclass(frozen=True, slots=True)
class CheckResult:
    family: str  # devices, nvml, pod-resources, proc, kube-api, exporter
    name: str
    status: Status
    found: str
    fix: str = ""  # one line; empty when there is nothing to do
    details: tuple[str, ...] = ()  # one line per item (a GPU, a device file, a cgroup line)
    seconds: float | None = None  # how long gathering the facts took (set by the runner)


def exit_code(results: Iterable[CheckResult]) -> int:
    """0 when every check is ok, 1 when any warns, 2 when any fails."""
    return max((r.status.exit_code for r in results), default=0)


def counts(results: Iterable[CheckResult]) -> dict[str, int]:
    out = dict.fromkeys(Status, 0)
    for r in results:
        out[r.status] += 1
    return {s.value: n for s, n in out.items()}
