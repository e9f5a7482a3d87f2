"""``python -m bench footprint``: the gpumon exporter beside a real peer, nvidia_gpu_exporter (Go,
its NVML backend), both on NVIDIA's mock libnvidia-ml with the same 8-GPU profile, in one run.

gpumon runs as ``gpumon exporter --backend nvml`` with its real pod attribution (pod-resources,
host /proc, the API's list+watch: :mod:`bench.mock_node`); the peer with per-process metrics.
Both servers share CPU 0, the bench and wrk CPU 1. Figures: open loop at 20 scrapes/s (p99),
a 50-client wrk storm (scrapes/s), CPU over one window at 1 scrape/s each (the same window for
both, so both see the same disturbance), RSS after it all, payload bytes and bytes per series.
Writes its own section of bench/RESULTS.md; ``--quick`` prints instead.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench import peer
from bench.httpclient import PROMETHEUS_HEADERS, Client
from bench.load import OpenLoop, WrkResult, open_loop, pooled, wrk
from bench.mock_node import NODE, mock_node
from bench.procs import Server, free_port
from bench.report import Row, Table, section_markdown, splice
from bench.run import choose_cpus, load_average, mib, rate
from bench.stats import format_ms, format_ratio, improvement, meets

RESULTS = Path(__file__).with_name("RESULTS.md")
SECTION = "exporter-footprint"
PEER = "nvidia_gpu_exporter"
MiB = 2**20


@dataclass(frozen=True)
class Plan:
    open_rounds: int
    open_seconds: float
    storm_runs: int
    storm_seconds: float
    cpu_seconds: float


FULL = Plan(open_rounds=3, open_seconds=10, storm_runs=3, storm_seconds=5, cpu_seconds=60)
QUICK = Plan(open_rounds=1, open_seconds=4, storm_runs=1, storm_seconds=2, cpu_seconds=10)


def gpumon_argv(port: int, *extra: str) -> list[str]:
    """``gpumon exporter --backend nvml`` on the mock node's name and a loopback port."""
    return [
        sys.executable, "-m", "gpumon.cli", "exporter", "--backend", "nvml", "--node-name", NODE,
        "--listen-address", "127.0.0.1", "--port", str(port), *extra,
    ]  # fmt: skip


def series_count(text: bytes) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))


async def scrape(server: Server, headers: Mapping[str, str] | None = None) -> bytes:
    client = Client("127.0.0.1", server.port)
    try:
        r = await client.get("/metrics", headers=headers or {"Accept": "text/plain"})
        return r.body
    finally:
        client.close()


async def wait_for(server: Server, done: str, seconds: float = 120) -> bytes:
    """Scrape until the payload holds ``done`` (the pods attributed, a GPU listed)."""
    await server.wait_ready("/metrics", seconds)
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        body = await scrape(server)
        if body.count(done.encode()) >= 64 or (done == "nvidia_smi_gpu_info" and done.encode() in body):
            return body
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{server.name}: no {done} within {seconds} s:\n{server.tail()}")


async def one_per_second(server: Server, seconds: float) -> None:
    client = Client("127.0.0.1", server.port)
    start = time.monotonic()
    n = 0
    try:
        while time.monotonic() - start < seconds:
            await client.get("/metrics", headers=PROMETHEUS_HEADERS)
            n += 1
            await asyncio.sleep(max(0.0, start + n - time.monotonic()))
    finally:
        client.close()


def ratio_row(
    figure: str,
    target: str,
    ours: float,
    theirs: float,
    fmt: Callable[[float], str],
    lower: bool,
    goal: float | None = None,
) -> Row:
    """A row of gpumon against the peer; ``goal``, in the figures' own unit, fills "target met"."""
    met = "—" if goal is None else meets(ours, goal, lower_is_better=lower)
    return Row(
        figure,
        target,
        fmt(ours),
        fmt(theirs),
        format_ratio(improvement(ours, theirs, lower_is_better=lower)),
        met,
    )


async def measure(plan: Plan, workdir: Path) -> tuple[list[tuple[str, str]], list[Table]]:
    cpus = choose_cpus()
    peer_binary = peer.build()
    with mock_node() as node:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMON_", "MOCK_NVML_"))}
        gp_port, peer_port = free_port(), free_port()
        gpumon = Server(
            "gpumon", gpumon_argv(gp_port), port=gp_port, cpus=cpus.server, log=workdir / "gpumon.log",
            cwd=Path.cwd(), noop_path="/healthz", env=env | node.gpumon_env(),
        )  # fmt: skip
        other = Server(
            PEER, peer.argv(peer_port), port=peer_port, cpus=cpus.server, log=workdir / "peer.log",
            cwd=workdir, noop_path="/", env=env | node.env(),
        )  # fmt: skip
        with gpumon, other:
            gp_body = await wait_for(gpumon, "gpumon_pod_gpu_memory_used_bytes{")
            peer_body = await wait_for(other, "nvidia_smi_gpu_info")
            await asyncio.sleep(12)  # past the first slow tick and the pod watch's list
            gp_gzip = await scrape(gpumon, PROMETHEUS_HEADERS)
            peer_gzip = await scrape(other, PROMETHEUS_HEADERS)

            opens: dict[str, list[OpenLoop]] = {gpumon.name: [], other.name: []}
            for i in range(plan.open_rounds):
                for s in (gpumon, other) if i % 2 == 0 else (other, gpumon):
                    opens[s.name].append(
                        await open_loop("127.0.0.1", s.port, "/metrics", rate=20, seconds=plan.open_seconds)
                    )
            storms: dict[str, list[WrkResult]] = {gpumon.name: [], other.name: []}
            for i in range(plan.storm_runs):
                for s in (gpumon, other) if i % 2 == 0 else (other, gpumon):
                    storms[s.name].append(
                        await wrk(
                            f"http://127.0.0.1:{s.port}/metrics",
                            connections=50,
                            seconds=plan.storm_seconds,
                            cpus=cpus.load,
                        )
                    )
            await asyncio.sleep(2)
            before = {s.name: s.cpu_seconds() for s in (gpumon, other)}
            t0 = time.monotonic()
            await asyncio.gather(
                one_per_second(gpumon, plan.cpu_seconds), one_per_second(other, plan.cpu_seconds)
            )
            elapsed = time.monotonic() - t0
            cpu = {s.name: (s.cpu_seconds() - before[s.name]) / elapsed for s in (gpumon, other)}
            rss = {s.name: s.memory() for s in (gpumon, other)}
            threads = {s.name: _threads(s.pid) for s in (gpumon, other)}

    g, p = gpumon.name, other.name
    gp_open, peer_open = pooled(opens[g]), pooled(opens[p])
    gp_storm = sorted(storms[g], key=lambda r: r.rate)[len(storms[g]) // 2]
    peer_storm = sorted(storms[p], key=lambda r: r.rate)[len(storms[p]) // 2]
    gp_series, peer_series = series_count(gp_body), series_count(peer_body)

    def num(v: float) -> str:
        return f"{v:,.0f}"

    def pct(v: float) -> str:
        return f"{100 * v:.2f} %"

    tables = [
        Table(
            "Exporter footprint: payload",
            "One scrape of each after start-up, plain text (0.0.4) and as Prometheus asks for it "
            "(OpenMetrics where offered, gzip). The two export different families: gpumon per GPU "
            f"and per pod ({gp_body.count(b'gpumon_pod_gpu_memory_used_bytes{')} pod series of memory "
            f"alone), {PEER} the nvidia-smi query fields per GPU and one set per process; so bytes "
            "per series is the comparable figure.",
            (
                Row("series (samples) per scrape", "—", num(gp_series), num(peer_series)),
                ratio_row("bytes, text", "—", len(gp_body), len(peer_body), num, True),
                ratio_row("bytes, as Prometheus asks (gzip)", "—", len(gp_gzip), len(peer_gzip), num, True),
                ratio_row(
                    "bytes per series, text",
                    "—",
                    len(gp_body) / gp_series,
                    len(peer_body) / peer_series,
                    lambda v: f"{v:.0f}",
                    True,
                ),
            ),
            baseline=PEER,
        ),
        Table(
            "Exporter footprint: scrapes",
            f"Open loop: 20 scrapes/s, {plan.open_rounds} rounds of {plan.open_seconds:g} s per server "
            f"taking turns, pooled ({len(gp_open.seconds)} and {len(peer_open.seconds)} scrapes; errors "
            f"{gp_open.errors} and {peer_open.errors}). Storm: `wrk -t1 -c50 -d{plan.storm_seconds:g}s`, "
            f"{plan.storm_runs} runs each taking turns, the run of median throughput (scrapes/s of each: "
            f"gpumon {' / '.join(rate(r.rate) for r in storms[g])}, {PEER} "
            f"{' / '.join(rate(r.rate) for r in storms[p])}; errors {gp_storm.errors} and "
            f"{peer_storm.errors}). {PEER} collects from NVML on each scrape (its default); gpumon "
            "serves the bytes its sampler rendered.",
            (
                ratio_row(
                    "open loop 20/s, p50", "—", gp_open.latency.p50, peer_open.latency.p50, format_ms, True
                ),
                ratio_row(
                    "open loop 20/s, p99",
                    "≤ 2 ms",
                    gp_open.latency.p99,
                    peer_open.latency.p99,
                    format_ms,
                    True,
                ),
                ratio_row("50-client storm, scrapes/s", "—", gp_storm.rate, peer_storm.rate, rate, False),
                ratio_row("50-client storm, p99 (wrk)", "—", gp_storm.p99, peer_storm.p99, format_ms, True),
            ),
            baseline=PEER,
        ),
        Table(
            "Exporter footprint: CPU and memory",
            f"CPU: utime + stime from /proc over the same {elapsed:.0f} s window for both, each "
            "scraped once a second (gpumon samples every second on its own; the peer collects on "
            "each scrape: the same 1 s freshness), NVML calls included (the mock library's Go code "
            "runs in each process). RSS from /proc after all the load above. Threads: the process's "
            f"own count at the end (gpumon {threads[g]}, {PEER} {threads[p]}).",
            (
                ratio_row("CPU at 1 s freshness (1 scrape/s)", "≤ 1 %", cpu[g], cpu[p], pct, True, goal=0.01),
                ratio_row("RSS", "≤ 48 MiB", rss[g][0] / MiB, rss[p][0] / MiB, mib, True, goal=48),
                ratio_row("peak RSS (VmHWM)", "—", rss[g][1] / MiB, rss[p][1] / MiB, mib, True),
            ),
            baseline=PEER,
        ),
    ]
    machine = [
        ("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("command", "python -m bench footprint"),
        ("CPU", f"nproc {os.cpu_count()}; servers on CPU {cpus.server}, bench and wrk on {cpus.load}"),
        ("load average (1/5/15 min) at the end", load_average()),
        (
            "gpumon",
            f"Python {platform.python_version()}, `gpumon exporter --backend nvml`, pod attribution on",
        ),
        (PEER, f"commit {peer.COMMIT[:12]}, built here from source ({peer_binary.name}, go-nvml)"),
        ("GPUs", "NVIDIA's mock libnvidia-ml, A100 profile, 8 GPUs, 8 processes on each (64 pods)"),
    ]
    return machine, tables


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


INTRO = f"""\
The gpumon exporter beside {PEER} (Go, github.com/utkuozdemir/nvidia_gpu_exporter, its NVML
backend, built from source: bench/peer.py), both reading NVIDIA's mock libnvidia-ml with the same
8-GPU profile, in one run on one machine (issue #19). gpumon runs `gpumon exporter --backend nvml`
with its real pod attribution: the kubelet's pod-resources API, a host /proc and the API server's
list+watch of the node's pods, from bench/mock_node.py. **ratio**: how many times better gpumon is
(above 1: better). Regenerate with `python -m bench footprint` (about 3 minutes; needs
`GPUMON_PEER_SRC`, a checkout of the peer, for its first build)."""

NOTES = (
    "The machine has 2 cores shared with other engineers' builds and tests; both servers run on "
    "the same core in the same run, taking turns for the load phases and side by side for the "
    "CPU window, so the ratios are the figures to read.",
    f"{PEER} with `--collect.backend=nvml` reads NVML through go-nvml (cgo, dlopen of "
    "libnvidia-ml.so.1): one call per field per GPU, the fields nvmlDeviceGetFieldValues serves "
    "in one batch, and by default one collection per scrape. It does not run nvidia-smi in this "
    "mode. `--collect.compute-apps` adds its per-process series.",
    "The mock library is a Go c-shared library: each process that loads it also carries a Go "
    "runtime (about 7.6 MiB of RSS in gpumon's process, measured after nvmlInit).",
)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench footprint", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short windows; print, do not write")
    args = parser.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpumon-footprint-") as tmp:
        machine, tables = asyncio.run(measure(QUICK if args.quick else FULL, Path(tmp)))
    section = section_markdown(
        SECTION, title="Exporter footprint", intro=INTRO, machine=machine, tables=tables, notes=NOTES
    )
    publish(section, quick=args.quick, what="footprint")
    return 0


def publish(section: str, *, quick: bool, what: str) -> None:
    """A quick run's section is printed; a full run's replaces its copy in bench/RESULTS.md."""
    if quick:
        print(section)
    else:
        RESULTS.write_text(splice(RESULTS.read_text(), section))
        print(f"bench: wrote the {what} section of {RESULTS}", file=sys.stderr)
