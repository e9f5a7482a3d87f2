"""The benchmark run: both servers as subprocesses, every figure measured side by side, tables out.

The servers under test share CPU 0; this process, its scrapers and wrk run on CPU 1, so load
generation does not steal the server's core (on a machine with one CPU nothing is pinned).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Generic, TypeVar

from bench.httpclient import PLAIN_TEXT_HEADERS, PROMETHEUS_HEADERS, Client
from bench.load import OpenLoop, WrkResult, open_loop, pooled, wrk, wrk_path
from bench.procs import Server, core_busy_seconds, free_port
from bench.report import Row, Table
from bench.stats import format_ms, format_ratio, improvement, meets, percentile
from gpumon.devices.simulated import SimulatedBackend

REPO = Path(__file__).resolve().parents[1]
GPUS = 8
PODS = 64
SCRAPE_RATE = 20.0  # scrapes/s of the realistic open loop
SATURATION_CLIENTS = 20
STORM_CLIENTS = 50
PROBE_RATE = 10.0  # scrapes/s of the scraper that measures through the storm
XID_CODE = 13  # informational: counted, health unchanged, so trials do not disturb each other
CHURN_PER_TICK = 32
CHURN_FAST_INTERVAL = 0.05
MIB = 1 << 20
RSS_TARGET = ("≤ 80 MiB", 80.0)
P99_TARGET = ("≤ 2 ms", 0.002)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Plan:
    quick: bool
    rounds: int  # of each closed-loop phase per server, taking turns
    open_loop_rounds: int
    open_loop_seconds: float
    wrk_seconds: float
    cpu_seconds: float
    xid_trials: int
    churn_starts: int


FULL = Plan(
    quick=False,
    rounds=3,
    open_loop_rounds=4,
    open_loop_seconds=8,
    wrk_seconds=5,
    cpu_seconds=20,
    xid_trials=10,
    churn_starts=10_000,
)
QUICK = Plan(
    quick=True,
    rounds=1,
    open_loop_rounds=1,
    open_loop_seconds=5,
    wrk_seconds=3,
    cpu_seconds=5,
    xid_trials=5,
    churn_starts=2_000,
)


@dataclass(frozen=True, slots=True)
class Cpus:
    server: tuple[int, ...]
    load: tuple[int, ...]


def choose_cpus() -> Cpus:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return Cpus((), ())
    return Cpus((cpus[0],), (cpus[1],))


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# What a payload says


def samples(text: bytes) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))


def pod_names(text: bytes) -> set[bytes]:
    return set(re.findall(rb'pod="([^"]*)"', text))


def xid_count(text: bytes, gpu: int, code: int) -> float:
    m = re.search(
        rb'gpumon_gpu_xid_errors_total\{[^}]*gpu="%d"[^}]*xid="%d"[^}]*\} (\S+)' % (gpu, code), text
    )
    return float(m.group(1)) if m else 0.0


def fast_ticks(text: bytes) -> tuple[float, float]:
    """(count, sum of seconds) of the sampler's fast-tick duration histogram."""
    found = []
    for part in (b"count", b"sum"):
        m = re.search(rb'gpumon_exporter_sample_duration_seconds_%s\{cadence="fast"\} (\S+)' % part, text)
        if m is None:
            raise RuntimeError("the exporter's payload has no fast sample duration histogram")
        found.append(float(m.group(1)))
    return found[0], found[1]


async def plain(client: Client) -> bytes:
    r = await client.get("/metrics", PLAIN_TEXT_HEADERS)
    if r.status != 200:
        raise RuntimeError(f"/metrics answered {r.status} on port {client.port}")
    return r.body


# ---------------------------------------------------------------------------------------------
# Benchmarks: each returns its table


def compare(
    figure: str,
    measured: float,
    naive: float,
    text: Callable[[float], str],
    *,
    lower_is_better: bool,
    target: tuple[str, float] | None = None,
) -> Row:
    """A row of gpumon beside the naive design, with the ratio and, given a target, whether it is met."""
    ratio = format_ratio(improvement(measured, naive, lower_is_better=lower_is_better))
    if target is None:
        return Row(figure, "—", text(measured), text(naive), ratio)
    met = meets(measured, target[1], lower_is_better=lower_is_better)
    return Row(figure, target[0], text(measured), text(naive), ratio, met)


def alone(
    figure: str, measured: float, text: Callable[[float], str], *, target: tuple[str, float] | None = None
) -> Row:
    """A row with no naive counterpart; lower is better for every such figure."""
    if target is None:
        return Row(figure, "—", text(measured))
    return Row(figure, target[0], text(measured), met=meets(measured, target[1], lower_is_better=True))


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def over(seconds: Sequence[float], limit: float) -> str:
    return f"{sum(s > limit for s in seconds)} of {len(seconds)}"


def rate(value: float) -> str:
    return f"{value:,.0f}"


def percent(value: float) -> str:
    return f"{value:.2f} %"


def mib(value: float) -> str:
    return f"{value:.1f} MiB"


def signed_mib(value: float) -> str:
    return f"{value:+.1f} MiB"


@dataclass(frozen=True, slots=True)
class Run(Generic[T]):
    value: T
    # Share of the servers' core that other processes (other people's builds and tests, the
    # hypervisor's steal) took meanwhile: how much this run was disturbed. None when unpinned.
    outside: float | None


class Side:
    """The servers under test on their core, measured in turns."""

    def __init__(self, exporter: Server, naive: Server, cpus: Cpus) -> None:
        self.exporter = exporter
        self.naive = naive
        self.cpus = cpus

    async def observe(self, server: Server, measure: Callable[[Server], Awaitable[T]]) -> Run[T]:
        if not self.cpus.server:
            return Run(await measure(server), None)
        core = self.cpus.server[0]
        servers = (self.exporter, self.naive)
        busy, own, started = core_busy_seconds(core), sum(s.cpu_seconds() for s in servers), time.monotonic()
        value = await measure(server)
        others = core_busy_seconds(core) - busy - (sum(s.cpu_seconds() for s in servers) - own)
        return Run(value, max(0.0, others) / (time.monotonic() - started))

    async def alternate(
        self, rounds: int, measure: Callable[[Server], Awaitable[T]]
    ) -> tuple[list[Run[T]], list[Run[T]]]:
        """``rounds`` runs of each server (gpumon, naive), taking turns: gpumon first in even
        rounds, the naive server in odd ones, so a burst of outside load is not all on one side."""
        runs: dict[str, list[Run[T]]] = {self.exporter.name: [], self.naive.name: []}
        for r in range(rounds):
            for server in (self.exporter, self.naive) if r % 2 == 0 else (self.naive, self.exporter):
                runs[server.name].append(await self.observe(server, measure))
        return runs[self.exporter.name], runs[self.naive.name]


def calmest(runs: Sequence[Run[T]]) -> Run[T]:
    return min(runs, key=lambda r: r.outside or 0.0)


def calm_rate(e_runs: Sequence[Run[WrkResult]], n_runs: Sequence[Run[WrkResult]]) -> tuple[Row, ...]:
    """Throughput and p99 of each server's least disturbed run, when there was a choice."""
    if len(e_runs) < 2:
        return ()
    e, n = calmest(e_runs).value, calmest(n_runs).value
    return (
        compare("scrapes/s in each server's calmest run", e.rate, n.rate, rate, lower_is_better=False),
        compare("p99 in each server's calmest run", e.p99, n.p99, format_ms, lower_is_better=True),
    )


def disturbance(runs: Sequence[Run[T]]) -> str:
    shares = [r.outside for r in runs if r.outside is not None]
    return " / ".join(f"{100 * x:.0f}" for x in shares) + " %" if shares else "not measured (unpinned)"


def median_run(runs: Sequence[Run[WrkResult]]) -> WrkResult:
    """The run of median throughput (the lower middle one for an even count)."""
    return sorted((r.value for r in runs), key=lambda w: w.rate)[(len(runs) - 1) // 2]


def rates(runs: Sequence[Run[WrkResult]]) -> str:
    return " / ".join(rate(r.value.rate) for r in runs)


def wrk_errors(runs: Sequence[Run[WrkResult]]) -> int:
    return sum(r.value.errors for r in runs)


async def payload_table(exporter: Server, naive: Server) -> Table:
    found = {}
    for server in (exporter, naive):
        client = Client("127.0.0.1", server.port)
        text = await plain(client)
        gzipped = (await client.get("/metrics", PROMETHEUS_HEADERS)).body
        client.close()
        if len(pod_names(text)) != PODS:
            raise RuntimeError(f"{server.name} shows {len(pod_names(text))} pods, not {PODS}")
        found[server.name] = (samples(text), len(text), len(gzipped))
    (es, et, eg), (ns, nt, ng) = found[exporter.name], found[naive.name]
    return Table(
        "What is scraped",
        f"{GPUS} simulated A100-SXM4-80GB, {PODS} pods (8 per GPU), native profile. The gpumon "
        "payload also carries the exporter's own self-metrics; the naive one does not.",
        (
            Row("samples (series) per scrape", "—", str(es), str(ns)),
            Row("bytes, text 0.0.4", "—", f"{et:,}", f"{nt:,}"),
            Row("bytes, OpenMetrics gzip (what Prometheus asks for)", "—", f"{eg:,}", f"{ng:,}"),
        ),
    )


async def open_loop_table(side: Side, plan: Plan) -> Table:
    async def measure(server: Server) -> tuple[OpenLoop, OpenLoop]:
        log(f"open loop, {SCRAPE_RATE:g} scrapes/s for {plan.open_loop_seconds:g} s: {server.name}")

        async def floor() -> OpenLoop:
            await asyncio.sleep(0.5 / SCRAPE_RATE)  # halfway between two scrapes
            return await open_loop(
                "127.0.0.1", server.port, server.noop_path, rate=SCRAPE_RATE, seconds=plan.open_loop_seconds
            )

        scrapes = open_loop(
            "127.0.0.1", server.port, "/metrics", rate=SCRAPE_RATE, seconds=plan.open_loop_seconds
        )
        return await asyncio.gather(scrapes, floor())

    e_runs, n_runs = await side.alternate(plan.open_loop_rounds, measure)
    e, n = pooled([r.value[0] for r in e_runs]), pooled([r.value[0] for r in n_runs])
    el, nl = e.latency, n.latency
    ef = pooled([r.value[1] for r in e_runs]).latency
    nf = pooled([r.value[1] for r in n_runs]).latency
    rounds = [(f"{r.outside:.0%}" if r.outside is not None else "?", r.value[0].latency.p99) for r in e_runs]
    calm_e, calm_n = calmest(e_runs).value[0].latency, calmest(n_runs).value[0].latency
    calm_rows: tuple[Row, ...] = ()
    if len(e_runs) > 1:
        figure = "p99 in each server's calmest round"
        calm_rows = (
            compare(figure, calm_e.p99, calm_n.p99, format_ms, lower_is_better=True, target=P99_TARGET),
        )
    return Table(
        f"Scrape latency at a realistic load ({SCRAPE_RATE:g} scrapes/s, open loop)",
        f"{el.count} scrapes per server at a fixed rate ({plural(plan.open_loop_rounds, 'round')} of "
        f"{plan.open_loop_seconds:g} s, taking turns), Prometheus's headers (OpenMetrics, gzip), "
        "connections kept alive where the server allows (the stock server closes each one, and its "
        "connect time counts). Halfway between scrapes, a second client sends as many requests that "
        f"the server answers without work (gpumon `{side.exporter.noop_path}`, the stock server "
        f"`{side.naive.noop_path}`): their p99 is the floor this machine, the client and the HTTP "
        "server put under any scrape. gpumon's p99 in each round, with the share of its core other "
        f"processes took meanwhile: {', '.join(f'{format_ms(p)} ({o})' for o, p in rounds)}; a "
        f"server's calmest round is the one it was disturbed least in. Errors: gpumon {e.errors}, "
        f"naive {n.errors}; worst client send lag {format_ms(max(e.max_send_lag, n.max_send_lag))}.",
        (
            compare("p50", el.p50, nl.p50, format_ms, lower_is_better=True),
            compare("p99", el.p99, nl.p99, format_ms, lower_is_better=True, target=P99_TARGET),
            compare("max", el.max, nl.max, format_ms, lower_is_better=True),
            Row("scrapes over 2 ms", "—", over(e.seconds, 0.002), over(n.seconds, 0.002)),
            compare("floor: p99 of a no-op request", ef.p99, nf.p99, format_ms, lower_is_better=True),
            *calm_rows,
        ),
    )


async def saturation_table(side: Side, plan: Plan) -> Table:
    async def measure(server: Server) -> WrkResult:
        log(f"saturation, wrk {SATURATION_CLIENTS} connections for {plan.wrk_seconds:g} s: {server.name}")
        url = f"http://127.0.0.1:{server.port}/metrics"
        return await wrk(url, connections=SATURATION_CLIENTS, seconds=plan.wrk_seconds, cpus=side.cpus.load)

    e_runs, n_runs = await side.alternate(plan.rounds, measure)
    e, n = median_run(e_runs), median_run(n_runs)
    return Table(
        f"Saturation throughput ({SATURATION_CLIENTS} clients, closed loop)",
        f"`wrk -t1 -c{SATURATION_CLIENTS} -d{round(plan.wrk_seconds)}s` with Prometheus's headers, "
        f"{plural(plan.rounds, 'run')} per server taking turns; the run of median throughput is shown. "
        f"Scrapes/s of each run: gpumon {rates(e_runs)}, naive {rates(n_runs)}; share of the "
        f"servers' core other processes took: {disturbance(e_runs)} and {disturbance(n_runs)}. "
        f"Errors: gpumon {wrk_errors(e_runs)}, naive {wrk_errors(n_runs)}.",
        (
            compare("scrapes/s", e.rate, n.rate, rate, lower_is_better=False, target=("≥ 2,000", 2000)),
            compare("p50 latency at saturation", e.p50, n.p50, format_ms, lower_is_better=True),
            compare("p99 latency at saturation", e.p99, n.p99, format_ms, lower_is_better=True),
            *calm_rate(e_runs, n_runs),
        ),
    )


async def storm_table(side: Side, plan: Plan) -> Table:
    async def measure(server: Server) -> tuple[WrkResult, OpenLoop]:
        log(f"storm, wrk {STORM_CLIENTS} connections for {plan.wrk_seconds:g} s: {server.name}")
        url = f"http://127.0.0.1:{server.port}/metrics"
        storm = asyncio.create_task(
            wrk(url, connections=STORM_CLIENTS, seconds=plan.wrk_seconds, cpus=side.cpus.load)
        )
        await asyncio.sleep(0.5)  # let the storm build up before probing through it
        probe = await open_loop(
            "127.0.0.1", server.port, "/metrics", rate=PROBE_RATE, seconds=max(1.0, plan.wrk_seconds - 1.5)
        )
        return await storm, probe

    e_runs, n_runs = await side.alternate(plan.rounds, measure)
    e_storms = [Run(r.value[0], r.outside) for r in e_runs]
    n_storms = [Run(r.value[0], r.outside) for r in n_runs]
    e, n = median_run(e_storms), median_run(n_storms)
    pe = pooled([r.value[1] for r in e_runs]).latency
    pn = pooled([r.value[1] for r in n_runs]).latency
    return Table(
        f"Scrape storm ({STORM_CLIENTS} clients, closed loop)",
        f"`wrk -t1 -c{STORM_CLIENTS} -d{round(plan.wrk_seconds)}s`, {plural(plan.rounds, 'run')} per "
        "server taking turns, the run of median throughput shown (scrapes/s of each: gpumon "
        f"{rates(e_storms)}, naive {rates(n_storms)}; share of the servers' core other processes took: "
        f"{disturbance(e_runs)} and {disturbance(n_runs)}). wrk times a request from its first byte "
        "written, so a connection waiting in the stock server's accept queue is not counted; so one "
        f"more scraper sends {PROBE_RATE:g} scrapes/s through each storm and counts its connect "
        f"time, as Prometheus would wait it ({pe.count} and {pn.count} scrapes). Errors: gpumon "
        f"{wrk_errors(e_storms)}, naive {wrk_errors(n_storms)}.",
        (
            compare("p50 (wrk)", e.p50, n.p50, format_ms, lower_is_better=True),
            compare("p99 (wrk)", e.p99, n.p99, format_ms, lower_is_better=True),
            compare("scrapes/s", e.rate, n.rate, rate, lower_is_better=False),
            compare("p50 of a scraper in the storm", pe.p50, pn.p50, format_ms, lower_is_better=True),
            compare("p99 of a scraper in the storm", pe.p99, pn.p99, format_ms, lower_is_better=True),
            *calm_rate(e_storms, n_storms),
        ),
    )


async def xid_latencies(server: Server, trials: int) -> list[float]:
    client = Client("127.0.0.1", server.port)
    seconds = []
    for trial in range(trials):
        gpu = trial % GPUS
        before = xid_count(await plain(client), gpu, XID_CODE)
        started = time.perf_counter()
        body = json.dumps({"fault": "xid", "gpu": gpu, "code": XID_CODE}).encode()
        r = await client.request("POST", "/api/v1/faults", {"Content-Type": "application/json"}, body)
        if r.status != 200:
            raise RuntimeError(f"the fault endpoint answered {r.status}: {r.body!r}")
        while xid_count(await plain(client), gpu, XID_CODE) <= before:
            if time.perf_counter() - started > 10:
                raise RuntimeError(f"Xid {XID_CODE} on GPU {gpu} did not reach /metrics within 10 s")
        seconds.append(time.perf_counter() - started)
        await asyncio.sleep(0.37)  # land the next trial elsewhere in the sampler's tick
    client.close()
    return seconds


async def xid_table(side: Side, plan: Plan) -> Table:
    log(f"Xid to /metrics, {plan.xid_trials} trials")
    run = await side.observe(side.exporter, lambda server: xid_latencies(server, plan.xid_trials))
    seconds = run.value
    return Table(
        "Xid event to /metrics",
        f"`POST /api/v1/faults` (Xid {XID_CODE}), then scrape in a tight loop until "
        "`gpumon_gpu_xid_errors_total` counts it; from the POST to the end of that scrape "
        f"({', '.join(format_ms(x) for x in seconds)}; share of the servers' core other processes "
        f"took meanwhile: {disturbance([run])}). The "
        "naive design has no event path: an Xid shows at the next scrape after the driver "
        "reports it, one scrape interval at worst.",
        (
            alone(f"median of {len(seconds)}", percentile(seconds, 50), format_ms, target=("≤ 1 s", 1.0)),
            alone("worst", max(seconds), format_ms, target=("≤ 1 s", 1.0)),
        ),
    )


def device_read_seconds(ticks: int = 200) -> tuple[float, float]:
    """CPU seconds to read every simulated GPU once, fast and slow fields: the part of a tick
    that stands in for NVML and is excluded from the exporter's own work."""
    backend = SimulatedBackend(GPUS)
    backend.open()
    costs = []
    for read in (backend.read_fast, backend.read_slow):
        started = time.thread_time()
        for _ in range(ticks):
            for index in range(GPUS):
                read(index)
        costs.append((time.thread_time() - started) / ticks)
    return costs[0], costs[1]


async def cpu_window(server: Server, seconds: float, *, rate: float) -> tuple[float, int]:
    """CPU seconds the server used over ``seconds`` while scraped at ``rate`` (0: not at all)."""
    before = server.cpu_seconds()
    scrapes = 0
    if rate:
        result = await open_loop("127.0.0.1", server.port, "/metrics", rate=rate, seconds=seconds)
        scrapes = result.latency.count
    else:
        await asyncio.sleep(seconds)
    return server.cpu_seconds() - before, scrapes


async def cpu_table(exporter: Server, naive: Server, plan: Plan) -> Table:
    fast_read, slow_read = device_read_seconds()
    window = plan.cpu_seconds
    client = Client("127.0.0.1", exporter.port)
    ticks_before = fast_ticks(await plain(client))
    log(f"CPU, {window:g} s: gpumon without scrapes, naive at 1 scrape/s")
    (idle_cpu, _), (naive_cpu, naive_scrapes) = await asyncio.gather(
        cpu_window(exporter, window, rate=0), cpu_window(naive, window, rate=1.0)
    )
    ticks_after = fast_ticks(await plain(client))
    client.close()
    log(f"CPU, {window:g} s: gpumon at 1 scrape/s")
    scraped_cpu, _ = await cpu_window(exporter, window, rate=1.0)

    ticks = ticks_after[0] - ticks_before[0]
    tick_wall = (ticks_after[1] - ticks_before[1]) / ticks if ticks else 0.0
    reads_per_window = window * (fast_read + slow_read / 10)  # fast every 1 s, slow every 10 s

    def own(cpu: float, reads: float) -> float:
        return max(0.0, cpu - reads) / window * 100

    idle_own = own(idle_cpu, reads_per_window)
    scraped_own = own(scraped_cpu, reads_per_window)
    naive_own = own(naive_cpu, naive_scrapes * (fast_read + slow_read))
    return Table(
        "Exporter CPU at 1 s sampling",
        f"Process CPU time (utime + stime from /proc, 10 ms resolution) over {window:g} s windows, "
        "minus the simulated device reads, which stand in for NVML: measured apart at "
        f"{fast_read * 1000:.2f} ms per fast read of {GPUS} GPUs and {slow_read * 1000:.2f} ms per slow "
        "read. The naive server does nothing between scrapes, so it is compared at 1 scrape/s, "
        "the same freshness as 1 s sampling (an HA pair of Prometheus doubles its cost, not gpumon's).",
        (
            alone("own CPU, no scrapes (% of one core)", idle_own, percent, target=("≤ 2 %", 2.0)),
            alone("own CPU per fast tick", idle_own / 100, format_ms),
            compare("own CPU at 1 scrape/s", scraped_own, naive_own, percent, lower_is_better=True),
            alone("CPU with the simulated reads, no scrapes", idle_cpu / window * 100, percent),
            alone("fast tick, wall time (sampler histogram, mean)", tick_wall, format_ms),
        ),
    )


def memory_rows(exporter: Server, naive: Server) -> tuple[Row, ...]:
    (er, eh), (nr, nh) = exporter.memory(), naive.memory()
    return (
        compare("RSS after the load above", er / MIB, nr / MIB, mib, lower_is_better=True, target=RSS_TARGET),
        compare("peak RSS (VmHWM)", eh / MIB, nh / MIB, mib, lower_is_better=True, target=RSS_TARGET),
    )


async def churn_rows(plan: Plan, cpus: Cpus, workdir: Path) -> tuple[Row, ...]:
    """A second exporter sampling every 50 ms with 32 of its 64 pods replaced on every tick."""
    port = free_port()
    churn = ["--fast-interval", str(CHURN_FAST_INTERVAL), "--bench-churn", str(CHURN_PER_TICK)]
    argv = [*exporter_argv(port), *churn]
    log_file = workdir / "churn.log"
    with Server(
        "gpumon-churn", argv, port=port, cpus=cpus.server, log=log_file, cwd=REPO, noop_path="/healthz"
    ) as server:
        await server.wait_ready("/readyz")
        client = Client("127.0.0.1", port)

        async def started() -> tuple[int, int]:
            """(pods started so far, pods in the payload)."""
            names = pod_names(await plain(client))
            return max(int(n.rpartition(b"-")[2]) for n in names) + 1, len(names)

        warm = min(1_000, plan.churn_starts // 4)
        log(f"churn: {plan.churn_starts:,} pod starts and stops")
        await wait_until(started, lambda s: s[0] >= warm)
        rss_warm = server.memory()[0]
        last = await wait_until(started, lambda s: s[0] >= plan.churn_starts)
        rss_end = server.memory()[0]
        client.close()
    if last[1] != PODS:
        raise RuntimeError(f"after churn the payload shows {last[1]} pods, not {PODS}: stopped pods linger")
    growth = (rss_end - rss_warm) / MIB
    return (
        alone(f"RSS after {last[0]:,} pod starts and stops", rss_end / MIB, mib, target=RSS_TARGET),
        # "Flat": within the 2 MiB an allocator's arenas move by on their own.
        alone(f"RSS growth from pod {warm:,} to pod {last[0]:,}", growth, signed_mib, target=("flat", 2.0)),
    )


async def wait_until(probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], seconds: float = 120) -> T:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        value = await probe()
        if done(value):
            return value
        await asyncio.sleep(0.2)
    raise RuntimeError(f"gave up after {seconds:g} s")


# ---------------------------------------------------------------------------------------------
# The run


def exporter_argv(port: int) -> list[str]:
    return [
        sys.executable, "-m", "bench.exporter_server",
        "--backend", "simulated", "--simulate-gpus", str(GPUS), "--bench-pods", str(PODS),
        "--listen-address", "127.0.0.1", "--port", str(port), "--node-name", "bench-node",
        "--log-level", "warning",
    ]  # fmt: skip


def naive_argv(port: int) -> list[str]:
    return [
        sys.executable, "-m", "bench.naive_server",
        "--port", str(port), "--gpus", str(GPUS), "--pods", str(PODS), "--node-name", "bench-node",
    ]  # fmt: skip


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or "unknown"


def wrk_version() -> str:
    out = subprocess.run([wrk_path(), "-v"], capture_output=True, text=True, check=False)
    return (out.stdout or out.stderr).splitlines()[0].split(" Copyright")[0]


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


@dataclass(frozen=True, slots=True)
class Outcome:
    tables: tuple[Table, ...]
    machine: tuple[tuple[str, str], ...]
    seconds: float


async def run(plan: Plan, workdir: Path) -> Outcome:
    started = time.monotonic()
    cpus = choose_cpus()
    if cpus.load:
        os.sched_setaffinity(0, cpus.load)
    load_before = load_average()
    with ExitStack() as stack:
        exporter_port, naive_port = free_port(), free_port()
        exporter = stack.enter_context(Server(
            "gpumon", exporter_argv(exporter_port), port=exporter_port, cpus=cpus.server,
            log=workdir / "exporter.log", cwd=REPO, noop_path="/healthz",
        ))  # fmt: skip
        naive = stack.enter_context(Server(
            "naive", naive_argv(naive_port), port=naive_port, cpus=cpus.server,
            log=workdir / "naive.log", cwd=REPO, noop_path="/favicon.ico",
        ))  # fmt: skip
        await exporter.wait_ready("/readyz")
        await naive.wait_ready("/metrics")
        side = Side(exporter, naive, cpus)
        tables = [
            await payload_table(exporter, naive),
            await open_loop_table(side, plan),
            await saturation_table(side, plan),
            await storm_table(side, plan),
            await cpu_table(exporter, naive, plan),
        ]
        memory = memory_rows(exporter, naive)
        tables.append(await xid_table(side, plan))
    churn = await churn_rows(plan, cpus, workdir)
    tables.insert(-1, Table(
        "Memory",
        "Resident set size from /proc of the servers above, after every load so far. Then a "
        f"second exporter samples every {CHURN_FAST_INTERVAL * 1000:g} ms and replaces "
        f"{CHURN_PER_TICK} of its {PODS} pods on every tick, each new pod with a new name; its RSS is "
        "read after the first pods have come and gone and again at the end, and its payload must "
        f"still hold exactly {PODS} pods.",
        memory + churn,
    ))  # fmt: skip
    pinning = (
        f"servers on CPU {cpus.server[0]}, this run and wrk on CPU {cpus.load[0]} (taskset)"
        if cpus.load
        else "none (one CPU)"
    )
    software = (
        f"Linux {platform.release()}, Python {platform.python_version()}, aiohttp {version('aiohttp')}, "
        f"prometheus_client {version('prometheus-client')}, {wrk_version()}"
    )
    machine = (
        ("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("command", " ".join(["python -m bench", *(["--quick"] if plan.quick else [])])),
        ("CPU", f"{cpu_model()}, nproc {os.cpu_count()}"),
        ("pinning", pinning),
        ("load average (1/5/15 min) before / after", f"{load_before}  →  {load_average()}"),
        ("software", software),
        ("duration", f"{time.monotonic() - started:.0f} s"),
    )  # fmt: skip
    return Outcome(tuple(tables), machine, time.monotonic() - started)
