"""The exporter's cost with every NVML field on (issue #17): 8 H100s of NVIDIA's mock
libnvidia-ml (GPM on every GPU), 64 pods, default cadences (1 s fast, 10 s slow).

    python -m bench.all_fields --before DIR [--seconds 30]

``--before DIR`` measures the exporter of another checkout (a git worktree of the commit before
the GPM and extra fields) first, then this one, on the same machine in the same minutes: each
runs through ``bench.exporter_server`` with ``--backend nvml`` on the same mock library and
profile. Per exporter: the process's CPU over ``--seconds`` with no scrapes (its sampler and
renders, and the mock library's own work in its threads: NVML runs in-process, there is no
separating it), then ``--seconds`` of scrapes at 20/s (open loop, OpenMetrics, gzip) for the
scrape latency. Measurement starts after two slow ticks, once GPM has its first interval.
Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.httpclient import Client
from bench.load import open_loop
from bench.procs import Server, free_port
from bench.report import side_by_side
from bench.stats import format_ms
from gpumon.devcluster.binaries import locate_mock_nvml

SCRAPE_RATE = 20.0
SLOW_INTERVAL = 10.0
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class Result:
    label: str
    cpu_percent: float
    p50: float
    p99: float
    worst: float
    scrapes: int
    errors: int
    samples: int
    payload_bytes: int


async def one(label: str, cwd: Path, seconds: float, workdir: Path) -> Result:
    mock = locate_mock_nvml()
    port = free_port()
    argv = [
        sys.executable, "-m", "bench.exporter_server",
        "--backend", "nvml", "--bench-pods", "64", "--metrics-profile", "both",
        "--listen-address", "127.0.0.1", "--port", str(port), "--node-name", "bench-node",
        "--log-level", "warning",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOCK_NVML_", "GPUMON_"))}
    env |= {"LD_LIBRARY_PATH": str(mock.lib_dir), "MOCK_NVML_CONFIG": str(mock.profile("h100"))}
    log = workdir / f"{label}.log"
    with Server(label, argv, port=port, cpus=(), log=log, cwd=cwd, noop_path="/healthz", env=env) as server:
        await server.wait_ready("/readyz")
        # Two slow ticks: GPM has its first interval, every field is in the payload.
        await asyncio.sleep(2 * SLOW_INTERVAL + 1)
        before = server.cpu_seconds()
        await asyncio.sleep(seconds)
        cpu = server.cpu_seconds() - before
        run = await open_loop("127.0.0.1", port, "/metrics", rate=SCRAPE_RATE, seconds=seconds)
        client = Client("127.0.0.1", port)
        body = (await client.get("/metrics", headers={})).body
        client.close()
    samples = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    lat = run.latency
    return Result(
        label, 100 * cpu / seconds, lat.p50, lat.p99, lat.max, lat.count, run.errors, samples, len(body)
    )


def table(results: list[Result], seconds: float) -> str:
    rows = [
        ("exporter CPU, no scrapes (% of one core, mock NVML included)", lambda r: f"{r.cpu_percent:.2f} %"),
        ("samples per scrape", lambda r: f"{r.samples:,}"),
        ("payload, text 0.0.4", lambda r: f"{r.payload_bytes:,} B"),
        ("scrapes / errors", lambda r: f"{r.scrapes} / {r.errors}"),
        ("scrape p50", lambda r: format_ms(r.p50)),
        ("scrape p99 (target ≤ 2 ms)", lambda r: format_ms(r.p99)),
        ("slowest scrape", lambda r: format_ms(r.worst)),
    ]
    head = (
        f"8 H100 (mock libnvidia-ml), 64 pods, 1 s / {SLOW_INTERVAL:g} s sampling; CPU over {seconds:g} s, "
        f"then {SCRAPE_RATE:g} scrapes/s for {seconds:g} s (OpenMetrics, gzip)"
    )
    return side_by_side(
        head, [r.label for r in results], [(n, [cell(r) for r in results]) for n, cell in rows]
    )


async def main_async(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="gpumon-all-fields-") as tmp:
        workdir = Path(tmp)
        results = []
        if args.before is not None:
            results.append(await one("before", args.before, args.seconds, workdir))
        results.append(
            await one("after" if args.before is not None else "gpumon", REPO, args.seconds, workdir)
        )
    print(table(results, args.seconds))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.all_fields", description=__doc__)
    parser.add_argument("--before", type=Path, help="a checkout whose exporter to measure first")
    parser.add_argument("--seconds", type=float, default=30.0)
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
