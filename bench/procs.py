"""Servers under test as subprocesses: start pinned to a CPU, wait until they answer, read their
CPU time and memory from /proc, stop them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from bench.httpclient import Client

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def core_busy_seconds(cpu: int) -> float:
    """Time CPU ``cpu`` spent on anything but idling and waiting for I/O (steal included: the
    hypervisor running someone else is time this core did not give us)."""
    for line in Path("/proc/stat").read_text().splitlines():
        name, *ticks = line.split()
        if name == f"cpu{cpu}":
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(t) for t in ticks[:8])
            return (user + nice + system + irq + softirq + steal) / _CLOCK_TICKS
    raise RuntimeError(f"no cpu{cpu} in /proc/stat")


def cpu_seconds(pid: int) -> float:
    """User + system time of a process, every thread included, dead ones too."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def memory(pid: int) -> tuple[int, int]:
    """Resident set size of a process now and at its peak, in bytes."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0]) * 1024
    return values["VmRSS"], values["VmHWM"]


def pinned(argv: Sequence[str], cpus: Sequence[int]) -> list[str]:
    return ["taskset", "-c", ",".join(map(str, cpus)), *argv] if cpus else list(argv)


class Server:
    """One server process; its output goes to ``log``. ``taskset`` execs the server, so the
    process id is the server's own."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        port: int,
        cpus: Sequence[int],
        log: Path,
        cwd: Path,
        noop_path: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.port = port
        self.log = log
        # A path the server answers without any work of its own: the floor under /metrics.
        self.noop_path = noop_path
        with log.open("wb") as out:
            self._proc = subprocess.Popen(
                pinned(argv, cpus),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                env=None if env is None else dict(env),
            )

    @property
    def pid(self) -> int:
        return self._proc.pid

    async def wait_ready(self, path: str, deadline_seconds: float = 60.0) -> None:
        """Poll ``path`` until it answers 200; the deadline is generous for a busy machine."""
        client = Client("127.0.0.1", self.port)
        until = time.monotonic() + deadline_seconds
        while time.monotonic() < until:
            if self._proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self._proc.returncode}:\n{self.tail()}")
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                if (await client.get(path)).status == 200:
                    client.close()
                    return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.name} did not answer {path} within {deadline_seconds:g} s:\n{self.tail()}")

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def memory(self) -> tuple[int, int]:
        return memory(self.pid)

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
