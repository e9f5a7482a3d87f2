"""An Xid storm against the exporter: 5,000 Xids a second through the simulated backend while
Prometheus scrapes at 20/s (issue #18).

    python -m bench.xid_storm [--before DIR] [--seconds 10] [--rate 5000]

The storm is one ``xid_storm`` entry of a scenario file (the simulated backend delivers it
itself, so no HTTP request competes with the scrapes): ``rate`` Xids a second from 2 s after the
backend opens until after the scrapes end, codes drawn from 1..999 over the 8 GPUs (most of
them outside the documented range, as a driver or a fuzzer gone wrong would send them).
``--before DIR`` runs the same storm against the exporter of another checkout (a git worktree of
an older commit) first, so both are measured on the same machine in the same minute; copy this
checkout's simulator into it (gpumon/devices/simulated/ in place of an older simulated.py, and
gpumon/config/files.py, where it finds its error formatting), which the storm needs (its sampler,
state and rendering stay its own). ``--calm`` adds this checkout's exporter without a storm, the
same scrapes in the same minute: the floor a shared, loaded machine gives any scrape. Prints
one Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.httpclient import Client
from bench.load import OpenLoop, open_loop
from bench.procs import Server, free_port
from bench.report import side_by_side
from bench.stats import format_ms

GPUS = 8
SCRAPE_RATE = 20.0
STORM_STARTS_AT = 2.0
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class StormResult:
    label: str
    scrapes: int
    errors: int
    p50: float
    p99: float
    worst: float
    payload_bytes: int
    xid_series: int
    rss_mib: float
    log_bytes: int


def scenario(path: Path, *, rate: int, seconds: float) -> None:
    storm = {"at": STORM_STARTS_AT, "fault": "xid_storm", "rate": rate, "seconds": seconds + 5}
    path.write_text(yaml.safe_dump({"faults": [storm]}))


async def one(
    label: str, cwd: Path, scenario_file: Path | None, seconds: float, workdir: Path
) -> StormResult:
    port = free_port()
    log = workdir / f"{label}.log"
    argv = [
        sys.executable, "-m", "bench.exporter_server",
        "--backend", "simulated", "--simulate-gpus", str(GPUS), "--bench-pods", "64",
        *(("--scenario", str(scenario_file)) if scenario_file is not None else ()),
        "--listen-address", "127.0.0.1", "--port", str(port), "--node-name", "bench-node",
        "--log-level", "warning",
    ]  # fmt: skip
    with Server(label, argv, port=port, cpus=(), log=log, cwd=cwd, noop_path="/healthz") as server:
        await server.wait_ready("/readyz")
        # Ready comes with the first sample, within a second of the backend opening: by then
        # the storm (STORM_STARTS_AT after the opening) has begun, and every timed scrape is in it.
        await asyncio.sleep(STORM_STARTS_AT)
        started = time.monotonic()
        try:
            run = await open_loop("127.0.0.1", port, "/metrics", rate=SCRAPE_RATE, seconds=seconds)
        except RuntimeError:  # not one scrape answered within the client's timeout
            n = round(SCRAPE_RATE * seconds)
            run = OpenLoop((float("inf"),), n, 0.0)
        client = Client("127.0.0.1", port)
        try:
            body = await _metrics(client)
        except TimeoutError:  # still stormed: no payload to weigh
            body = b""
        client.close()
        rss, _peak = server.memory()
        waited = time.monotonic() - started
    lat = run.latency
    series = sum(1 for line in body.decode().splitlines() if line.startswith("gpumon_gpu_xid_errors_total{"))
    print(f"{label}: measured over {waited:.1f} s", file=sys.stderr)
    return StormResult(
        label,
        0 if math.isinf(lat.max) else len(run.seconds),
        run.errors,
        lat.p50,
        lat.p99,
        lat.max,
        len(body),
        series,
        rss / 2**20,
        log.stat().st_size,
    )


async def _metrics(client: Client) -> bytes:
    # A stormed exporter took 37 s for one scrape (issue #18): wait that long, not for ever.
    return (await asyncio.wait_for(client.get("/metrics", headers={}), 60)).body


def table(results: list[StormResult], *, rate: int, seconds: float) -> str:
    rows = [
        ("scrapes answered / errors (10 s timeout)", lambda r: f"{r.scrapes} / {r.errors}"),
        ("scrape p50", lambda r: format_ms(r.p50) if r.scrapes else "none answered"),
        ("scrape p99 (target ≤ 2 ms)", lambda r: format_ms(r.p99) if r.scrapes else "none answered"),
        ("slowest scrape", lambda r: format_ms(r.worst) if r.scrapes else "over 10 s"),
        (
            "payload after the storm, text 0.0.4",
            lambda r: f"{r.payload_bytes:,} B" if r.payload_bytes else "no answer in 60 s",
        ),
        ("Xid series after the storm", lambda r: f"{r.xid_series:,}" if r.payload_bytes else "—"),
        ("RSS after the storm", lambda r: f"{r.rss_mib:.1f} MiB"),
        ("log written", lambda r: f"{r.log_bytes:,} B"),
    ]
    head = f"{rate:,} Xids/s for {seconds:g} s, {SCRAPE_RATE:g} scrapes/s (OpenMetrics, gzip)"
    return side_by_side(
        head, [r.label for r in results], [(n, [cell(r) for r in results]) for n, cell in rows]
    )


async def main_async(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="gpumon-xid-storm-") as tmp:
        workdir = Path(tmp)
        storm = workdir / "storm.yaml"
        scenario(storm, rate=args.rate, seconds=args.seconds)
        results = []
        if args.before is not None:
            results.append(await one("before", args.before, storm, args.seconds, workdir))
        results.append(
            await one("after" if args.before is not None else "gpumon", REPO, storm, args.seconds, workdir)
        )
        if args.calm:
            results.append(await one("no storm", REPO, None, args.seconds, workdir))
    print(table(results, rate=args.rate, seconds=args.seconds))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.xid_storm", description=__doc__)
    parser.add_argument("--before", type=Path, help="a checkout whose exporter to storm first")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--calm", action="store_true", help="also this exporter without a storm")
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
