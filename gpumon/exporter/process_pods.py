"""GPU process IDs -> containers, through ``<host proc>/<pid>/cgroup``, cached by pid and start time.

The per-tick side (:meth:`ProcessPods.lookup`) is a dict lookup that also notes the pid as
live. All reading of /proc happens in :meth:`ProcessPods.resolve`, which the attributor runs in
a worker thread on the slow cadence: one ``stat`` read per live GPU process (to notice a
recycled pid by its start time) and one ``cgroup`` read per new process. A process therefore
gets attributed from the first slow refresh after it appears (10 s by default), and a pid that
stops showing up on the GPUs leaves the cache at the next refresh, so churn does not grow it.

``lookup`` may run in another thread than ``resolve``: ``resolve`` swaps whole dicts and sets,
never mutating what ``lookup`` reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpumon.devices.backend import ErrorSink
from gpumon.exporter.cgroups import ContainerKey, Unmatched, parse_cgroup

SOURCE = "proc"


@dataclass(frozen=True, slots=True)
class _Entry:
    start_time: int
    found: ContainerKey | Unmatched


def start_time(stat: str) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (clock ticks since boot). The command name in field 2
    may hold spaces and parentheses, so fields are counted after its closing parenthesis."""
    _, sep, rest = stat.rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 20:
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


class ProcessPods:
    def __init__(self, host_proc: Path, errors: ErrorSink) -> None:
        # Plain strings, not Path: pathlib interns every path part, and pids churn.
        self._proc = os.fspath(host_proc)
        self._errors = errors
        self._entries: dict[int, _Entry] = {}
        self._seen: set[int] = set()

    def lookup(self, pid: int) -> ContainerKey | None:
        self._seen.add(pid)
        entry = self._entries.get(pid)
        return entry.found if entry is not None and isinstance(entry.found, ContainerKey) else None

    def resolve(self) -> None:
        """Blocking: read /proc for the pids seen since the last call; forget the others."""
        previous, self._seen = self._seen, set()
        # tuple() copies in one step under the GIL; a lookup racing the swap may still add to
        # the old set, which then only costs that pid one period.
        seen = tuple(previous)
        entries: dict[int, _Entry] = {}
        for pid in seen:
            entry = self._read(pid, self._entries.get(pid))
            if entry is not None:
                entries[pid] = entry
        self._entries = entries

    def _read(self, pid: int, cached: _Entry | None) -> _Entry | None:
        base = f"{self._proc}/{pid}"
        try:
            started = start_time(_read(f"{base}/stat"))
        except OSError:
            return None  # exited; NVML lists processes a moment after they are gone
        if started is None:
            self._errors(SOURCE, Unmatched.MALFORMED.value)
            return None
        if cached is not None and cached.start_time == started:
            return cached
        try:
            text = _read(f"{base}/cgroup")
        except OSError:
            return None
        found = parse_cgroup(text)
        if isinstance(found, Unmatched) and found.is_error:
            self._errors(SOURCE, found.value)
        return _Entry(started, found)

    def __len__(self) -> int:
        return len(self._entries)


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()
