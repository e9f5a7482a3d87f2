"""Child processes that cannot outlive us: each in its own process group (a Ctrl-C in the
terminal reaches only the supervisor, which then stops them in order), each with its output
in a log file kept for failure reports, and each told by the kernel to die with its parent
(``PR_SET_PDEATHSIG``) so that a killed pytest or CLI leaves no orphans.

The death signal fires when the *thread* that forked the child exits, so start processes
from a thread that lives as long as the cluster (the main thread, in practice).

The signal is set by a tiny launcher that then execs the program, not by a ``preexec_fn``:
with a ``preexec_fn`` CPython forks instead of vforking and runs the at-fork handlers, and
gRPC's (a pod-resources server in the same process) abort the child now and then."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1
# argv: parent pid, program, its arguments. The parent may have died between the spawn and
# prctl; then nobody would signal us, so check.
_LAUNCHER = (
    "import ctypes, os, sys\n"
    f"ctypes.CDLL(None).prctl({_PR_SET_PDEATHSIG}, {int(signal.SIGKILL)})\n"
    "os.getppid() == int(sys.argv[1]) or os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def _die_with(parent_pid: int, argv: Sequence[str]) -> list[str]:
    return [sys.executable, "-S", "-c", _LAUNCHER, str(parent_pid), *argv]


@dataclass(frozen=True)
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def exited(self) -> int | None:
        return self.process.poll()


def spawn(
    name: str, argv: Sequence[str], log: Path, *, cwd: Path, env: Mapping[str, str] | None = None
) -> Child:
    """``env`` is added to this process's environment for the child."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(
            _die_with(os.getpid(), argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, **env} if env else None,
            process_group=0,
        )
    return Child(name, process, log)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop(children: Sequence[Child], grace_seconds: float = 5.0) -> None:
    """SIGTERM every child's process group at once, SIGKILL whatever is left after the grace."""
    alive = [c for c in children if c.exited() is None]
    for c in alive:
        _signal_group(c.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while alive and time.monotonic() < deadline:
        alive = [c for c in alive if c.exited() is None]
        if alive:
            time.sleep(0.05)
    for c in alive:
        _signal_group(c.pid, signal.SIGKILL)
    for c in children:
        # An unkillable child (D state) is left for the kernel to reap after we exit.
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.process.wait(timeout=grace_seconds)


def tail(log: Path, lines: int = 25) -> str:
    try:
        with log.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
