"""Load on a server: an open-loop scraper (asyncio, :mod:`bench.httpclient`) and closed-loop
``wrk`` runs. Everything goes to 127.0.0.1, bounded in time."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.httpclient import PROMETHEUS_HEADERS, Client
from bench.stats import Latency, summarize

WRK_SCRIPT = Path(__file__).with_name("wrk_report.lua")
_WRK_MARK = "GPUMON_BENCH "
_REQUEST_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class OpenLoop:
    seconds: tuple[float, ...]  # latency of every successful request
    errors: int
    # How late the client sent, at worst: above a millisecond or two the schedule was not kept.
    max_send_lag: float

    @property
    def latency(self) -> Latency:
        return summarize(self.seconds)


def pooled(runs: Sequence[OpenLoop]) -> OpenLoop:
    """Several open-loop runs as one: their latencies are samples of the same distribution."""
    return OpenLoop(
        tuple(s for r in runs for s in r.seconds),
        sum(r.errors for r in runs),
        max(r.max_send_lag for r in runs),
    )


async def open_loop(host: str, port: int, path: str, *, rate: float, seconds: float) -> OpenLoop:
    """Send GETs at a fixed ``rate`` whatever the answers take (an open loop, like Prometheus
    scraping on its interval). Each latency counts from the send, not the schedule: the
    client's own timer lag is the client's, and is reported apart."""
    client = Client(host, port)
    latencies: list[float] = []
    errors = 0
    lag = 0.0

    async def one() -> None:
        nonlocal errors
        try:
            r = await asyncio.wait_for(client.get(path), _REQUEST_TIMEOUT_SECONDS)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            errors += 1
            return
        if r.status == 200:
            latencies.append(r.seconds)
        else:
            errors += 1

    tasks = []
    start = time.perf_counter()
    for i in range(max(1, round(rate * seconds))):
        due = start + i / rate
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        lag = max(lag, time.perf_counter() - due)
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    client.close()
    if not latencies:
        raise RuntimeError(f"no successful request to {host}:{port}{path} ({errors} errors)")
    return OpenLoop(tuple(latencies), errors, lag)


@dataclass(frozen=True, slots=True)
class WrkResult:
    requests: int
    seconds: float
    p50: float
    p99: float
    max: float
    errors: int

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def parse_wrk(output: str) -> WrkResult:
    """The line :data:`WRK_SCRIPT` prints, among wrk's own output."""
    for line in output.splitlines():
        if line.startswith(_WRK_MARK):
            d = json.loads(line.removeprefix(_WRK_MARK))
            errors = sum(d[k] for k in ("connect_errors", "read_errors", "write_errors", "status_errors"))
            return WrkResult(
                requests=d["requests"],
                seconds=d["duration_us"] / 1e6,
                p50=d["p50_us"] / 1e6,
                p99=d["p99_us"] / 1e6,
                max=d["max_us"] / 1e6,
                errors=errors + d["timeouts"],
            )
    raise RuntimeError(f"wrk printed no summary:\n{output}")


def wrk_path() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise RuntimeError("wrk is not installed: run `bash hack/system-packages.sh` (Debian package wrk)")
    return path


async def wrk(
    url: str,
    *,
    connections: int,
    seconds: float,
    cpus: Sequence[int] = (),
    headers: Mapping[str, str] = PROMETHEUS_HEADERS,
) -> WrkResult:
    """A closed loop: ``connections`` clients, each sending its next request as soon as the last
    is answered, on one wrk thread (pinned to ``cpus`` when given)."""
    argv = [wrk_path(), "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s"]
    argv += ["-s", str(WRK_SCRIPT)]
    for name, value in headers.items():
        argv += ["-H", f"{name}: {value}"]
    argv.append(url)
    if cpus:
        argv = ["taskset", "-c", ",".join(map(str, cpus)), *argv]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), seconds + 30)
    if proc.returncode != 0:
        raise RuntimeError(f"wrk exited with {proc.returncode}:\n{out.decode(errors='replace')}")
    return parse_wrk(out.decode(errors="replace"))
