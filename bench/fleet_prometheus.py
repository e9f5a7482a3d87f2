"""The signal side of ``python -m bench fleet-65k``: a real Prometheus TSDB holding a generated
fleet's series, and the controller's query round against it.

The TSDB is built with ``promtool tsdb create-blocks-from openmetrics`` in parts of
``part_nodes`` nodes: promtool holds every series of its input in memory (about 3 KiB each
here), so one 65,000-node file would need some 35 GiB. The parts' blocks cover the same hours
with different series; Prometheus merges such overlapping blocks by itself (vertical
compaction) soon after it starts, and the queries wait for that, so they read one block, as
they would a fleet's. Each part's text is deleted once promtool has read it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.fleet_model import SCRAPE_SECONDS, Fleet, Marks
from bench.fleet_openmetrics import write_openmetrics
from bench.procs import memory
from gpumon.config.controller import ControllerConfig
from gpumon.controller.configure import build_policy
from gpumon.controller.core.promql import detail_queries, queries_for
from gpumon.controller.shell.signal_sources.prometheus import (
    DETAIL_CHUNK,
    Sample,
    chunks,
    named,
    parse_vector,
)
from gpumon.devcluster.localservers import PrometheusProcess

# The query set of main before issue #29 (gpumon/controller/shell/signal_sources/prometheus.py,
# queries_for on the default rules): every GPU's series, fleet-wide. Kept as the named
# baseline the checkout's own query set is timed beside.
NAIVE_QUERIES: Mapping[str, str] = {
    "__freshness": "timestamp(gpumon_gpu_info)",
    "__pods": (
        "group by (node, namespace, pod, container, gpu, uuid) "
        '({__name__=~"gpumon_pod_gpu_(allocated|memory_used_bytes|utilization_ratio|'
        'memory_allocated_bytes|core_allocated_ratio)"})'
    ),
    "temperature": 'gpumon_gpu_temperature_celsius{sensor="gpu"}',
    "row_remap_failure": "gpumon_gpu_row_remap_failure",
    "recovery_action": "gpumon_gpu_recovery_action == 1",
    "xid": (
        "(increase(gpumon_gpu_xid_errors_total[600s]) > 0) or "
        "(gpumon_gpu_xid_errors_total unless gpumon_gpu_xid_errors_total offset 600s)"
    ),
    "ecc_uncorrectable": 'gpumon_gpu_ecc_errors_total{type="uncorrected"}',
    "gpu_lost": 'gpumon_gpu_health{state="lost"}',
}
COMPACTION_DEADLINE_SECONDS = 3600.0
QUERY_REPEATS = 3
# The longest query timeout the controller's config allows (signals.prometheus.timeout_seconds).
MAX_TIMEOUT_SECONDS = 120.0


async def _first_step(url: str, queries: Mapping[str, str], at: float) -> dict[str, list[Sample]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        out = {}
        for name, promql in queries.items():
            params = {"query": promql, "time": f"{at:.3f}"}
            async with session.post(f"{url}/api/v1/query", data=params) as resp:
                out[name] = parse_vector(await resp.json())
        return out


def checkout_queries(url: str, at: float) -> dict[str, str]:
    """The checkout's query set for the default rules: what its controller asks each round,
    with autoscaled pools (``__busy``, which :mod:`bench.fleet_round`'s default config without
    pools does not ask). The first step's, then the second's for the nodes its answers name (at
    rest, the nodes the reconciler holds state on are those), a chunk at a time as the source
    sends them."""
    policy = build_policy(ControllerConfig())
    first = queries_for(policy.rules, policy.health.xid_window_seconds, busy=True)
    parts = chunks(sorted(named(asyncio.run(_first_step(url, first, at)), policy.rules)), DETAIL_CHUNK)
    out = dict(first)
    for i, part in enumerate(parts):
        suffix = f" [{i + 1}/{len(parts)}]" if len(parts) > 1 else ""
        out.update({name + suffix: promql for name, promql in detail_queries(policy.rules, part).items()})
    return out


@dataclass(frozen=True, slots=True)
class BuildCost:
    series: int
    text_bytes: int
    write_seconds: float  # generating the OpenMetrics text (Python)
    promtool_seconds: float  # wall, all parts
    promtool_peak_rss: int  # the largest part's
    parts: int


def build_tsdb(fleet: Fleet, marks: Marks, at: float, data: Path, part_nodes: int) -> BuildCost:
    data.mkdir(parents=True, exist_ok=True)
    series = text_bytes = peak = 0
    write_seconds = promtool_seconds = 0.0
    parts = range(0, fleet.nodes, part_nodes)
    for first in parts:
        text = data.parent / f"part-{first}.om"
        started = time.perf_counter()
        with text.open("w", buffering=1 << 20) as out:
            series += write_openmetrics(
                fleet, marks, at, out, range(first, min(fleet.nodes, first + part_nodes))
            )
        write_seconds += time.perf_counter() - started
        text_bytes += text.stat().st_size
        started = time.perf_counter()
        child = subprocess.Popen(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(text), str(data)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        promtool_seconds += time.perf_counter() - started
        if child.returncode:
            assert child.stderr is not None
            raise RuntimeError(f"promtool failed on {text}: {child.stderr.read().decode()[-2000:]}")
        peak = max(peak, usage.ru_maxrss * 1024)
        text.unlink()
    return BuildCost(series, text_bytes, write_seconds, promtool_seconds, peak, len(parts))


def _blocks(data: Path) -> list[tuple[int, int]]:
    out = []
    for meta in data.glob("*/meta.json"):
        doc = json.loads(meta.read_text())
        out.append((doc["minTime"], doc["maxTime"]))
    return sorted(out)


def compacted(data: Path) -> bool:
    """No two blocks overlap and no compaction is half written."""
    if any(p.name.endswith((".tmp-for-creation", ".tmp-for-deletion")) for p in data.iterdir()):
        return False
    blocks = _blocks(data)
    return all(a[1] <= b[0] for a, b in itertools.pairwise(blocks))


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@dataclass(frozen=True, slots=True)
class QueryFigure:
    name: str
    promql: str
    seconds: float  # median wall of QUERY_REPEATS: request to the last byte of the answer
    samples: int
    answer_bytes: int


async def time_queries(url: str, queries: Mapping[str, str], at: float) -> list[QueryFigure]:
    """Each query alone, as the source sends it (an instant query at ``at``), timed to the last
    byte of its JSON answer; the answer decoded once to count its samples."""
    out = []
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for name, promql in queries.items():
            walls, body = [], b""
            for _ in range(QUERY_REPEATS):
                started = time.perf_counter()
                async with session.post(
                    f"{url}/api/v1/query", data={"query": promql, "time": f"{at:.3f}"}
                ) as resp:
                    body = await resp.read()
                walls.append(time.perf_counter() - started)
            doc = json.loads(body)
            if doc.get("status") != "success":
                raise RuntimeError(f"{name}: {doc}")
            out.append(
                QueryFigure(name, promql, statistics.median(walls), len(doc["data"]["result"]), len(body))
            )
    return out


def controller_rounds(url: str, timeout: float, times: list[float]) -> dict[str, Any]:
    """:mod:`bench.fleet_round` in a child process; its JSON report."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.fleet_round", url, str(timeout), *map(str, times)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    if done.returncode:
        raise RuntimeError(f"bench.fleet_round failed:\n{done.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return report


@dataclass(frozen=True, slots=True)
class SignalSide:
    fleet: Fleet
    build: BuildCost
    tsdb_bytes: int
    start_seconds: float  # Prometheus started to ready
    compaction_seconds: float  # ready to the parts merged
    prometheus_rss_idle: int  # after the merge, before any query
    prometheus_rss_peak: int  # VmHWM after every query
    checkout: list[QueryFigure]
    naive: list[QueryFigure]
    default_round: dict[str, Any]  # the source with the config's own timeout
    patient_round: dict[str, Any]  # ... and with time enough to finish


def signal_side(fleet: Fleet, marks: Marks, at: float, workdir: Path, part_nodes: int) -> SignalSide:
    server = PrometheusProcess(workdir)
    data = workdir / "data"
    build = build_tsdb(fleet, marks, at, data, part_nodes)
    started = time.perf_counter()
    try:
        server.start(deadline_seconds=600)
        ready = time.perf_counter()
        deadline = ready + COMPACTION_DEADLINE_SECONDS
        while not compacted(data):
            if time.perf_counter() > deadline:
                raise TimeoutError(
                    f"Prometheus did not merge the blocks in {COMPACTION_DEADLINE_SECONDS:.0f} s"
                )
            time.sleep(2)
        merged = time.perf_counter()
        assert server.child is not None
        pid = server.child.pid
        idle = memory(pid)[0]
        gpus = server.api("query", query="count(gpumon_gpu_info)", time=f"{at:.3f}")["result"]
        if not gpus or int(gpus[0]["value"][1]) != fleet.gpus:
            raise RuntimeError(f"Prometheus answers {gpus} GPUs, not {fleet.gpus}: are the blocks loaded?")
        checkout = checkout_queries(server.url, at)
        ours = asyncio.run(time_queries(server.url, checkout, at))
        naive = asyncio.run(time_queries(server.url, NAIVE_QUERIES, at))
        default_timeout = ControllerConfig().signals.prometheus.timeout_seconds
        default_round = controller_rounds(server.url, default_timeout, [at])
        patient_round = controller_rounds(server.url, MAX_TIMEOUT_SECONDS, [at - SCRAPE_SECONDS, at])
        peak = memory(pid)[1]
    finally:
        server.stop()
    return SignalSide(
        fleet, build, dir_bytes(data), ready - started, merged - ready, idle, peak, ours, naive,
        default_round, patient_round,
    )  # fmt: skip
