"""What the direct source's streams cost the controller: setting them up, holding them, and their
heartbeats, at two heartbeat periods side by side.

``python -m bench stream-costs [--nodes N] [--quick]`` starts the signal farm
(bench/signal_farm.py: every node's exporter watch endpoint, served by one process), then runs
the controller's real :class:`~gpumon.controller.shell.signal_sources.direct.DirectSource` in a
child process of its own, once per heartbeat period and turn, taking turns: 10 s (the default
before issue #29), the default now, 10 s, the default. Each child subscribes to every node,
reports when every node was heard (the set-up: its CPU, the farm's CPU meanwhile, its RSS
after), then sits through a steady window in which the only traffic is heartbeats, and reports
its CPU. The section says, per period, the medians of its turns, and their ratio. It writes its
section of bench/RESULTS.md (``--quick``: 1,000 nodes, short windows, printed).

The controller's own figures at fleet scale (the API server, the policy, the lease) are the
scale curve's (bench/controller_scale.py); these are the part of them the streams alone cost,
without a control plane on the same two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import aiohttp

from bench.controller_scale import HEARTBEAT_SECONDS, REPO, signal_farm
from bench.footprint import publish
from bench.procs import cpu_seconds, memory
from bench.report import Grid, section_markdown
from bench.run import cpu_model, log
from bench.scale_fleet import GPUS_PER_NODE, node_names
from bench.stats import format_ratio, improvement
from gpumon.controller.shell.signal_sources.direct import DirectSettings, DirectSource
from gpumon.controller.shell.signal_sources.endpoints import StaticEndpoints
from gpumon.runtime.tasks import cancel_and_wait

SECTION = "stream-costs"
TITLE = "Direct source: what the streams cost (issue #29)"
BEFORE_SECONDS = 10.0  # the heartbeat before issue #29 made it a third of the staleness


@dataclass(frozen=True, slots=True)
class Turn:
    """One child's figures: ``nodes`` streams at one heartbeat period."""

    heartbeat: float
    nodes: int
    setup_wall: float  # subscribed -> every node heard
    setup_cpu: float  # the child's CPU over the set-up (interpreter and imports excluded)
    farm_setup_cpu: float  # the farm's CPU over the same span
    held_bytes: int  # the child's RSS after the set-up, less before it
    window: float  # the steady window's length
    steady_cpu: float  # the child's CPU over it

    @property
    def lines(self) -> float:
        """Heartbeats in the window (one a node a period; nothing else changes)."""
        return self.nodes * self.window / self.heartbeat


@dataclass(frozen=True, slots=True)
class Plan:
    nodes: int
    settle_seconds: float  # after the set-up, before the window: late first lines done
    window_seconds: float
    turns: int  # of each period
    quick: bool


FULL = Plan(nodes=10_000, settle_seconds=10, window_seconds=60, turns=2, quick=False)
QUICK = Plan(nodes=1_000, settle_seconds=2, window_seconds=20, turns=1, quick=True)


def whole_periods(window: float, periods: Sequence[float]) -> None:
    """A window of whole periods holds nodes × window / period heartbeats whatever their phase
    (each stream's count from its connect); any other window may hold one more or one fewer a
    stream, or, as all streams start together, none at all."""
    for period in periods:
        if (window / period) % 1:
            raise ValueError(f"a {window:g} s window is not a whole number of {period:g} s heartbeats")


# ---------------------------------------------------------------------------------------------
# The child: one source, one period (python -m bench.stream_costs --child ...)


def _rss() -> int:
    gc.collect()
    return memory(os.getpid())[0]


async def child(url: str, farm_pid: int, nodes: int, heartbeat: float, settle: float, window: float) -> Turn:
    endpoints = StaticEndpoints({n: f"{url}/nodes/{n}" for n in node_names(nodes)})
    heard: set[str] = set()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        source = DirectSource(DirectSettings(heartbeat_seconds=heartbeat), endpoints, session)
        rss, cpu, farm_cpu, started = _rss(), time.process_time(), cpu_seconds(farm_pid), time.monotonic()
        task = asyncio.create_task(source.run(heard.update))
        while len(heard) < nodes:
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
        setup_wall = time.monotonic() - started
        setup_cpu, farm_setup_cpu = time.process_time() - cpu, cpu_seconds(farm_pid) - farm_cpu
        held = _rss() - rss
        await asyncio.sleep(settle)
        cpu, started = time.process_time(), time.monotonic()
        await asyncio.sleep(window)
        steady_cpu, window = time.process_time() - cpu, time.monotonic() - started
        failures = sum(source.errors.values())
        await cancel_and_wait([task])
    if failures:
        raise RuntimeError(f"{failures} stream failures during the turn: {dict(source.errors)}")
    return Turn(heartbeat, nodes, setup_wall, setup_cpu, farm_setup_cpu, held, window, steady_cpu)


def run_child(url: str, farm_pid: int, plan: Plan, heartbeat: float) -> Turn:
    argv = [
        sys.executable, "-m", "bench.stream_costs", "--child",
        "--farm", url, "--farm-pid", str(farm_pid), "--nodes", str(plan.nodes),
        "--heartbeat", f"{heartbeat:g}",
        "--settle", f"{plan.settle_seconds:g}", "--window", f"{plan.window_seconds:g}",
    ]  # fmt: skip
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"the stream-costs child failed:\n{out.stderr[-4000:]}")
    return Turn(**json.loads(out.stdout.splitlines()[-1]))


# ---------------------------------------------------------------------------------------------
# The table (pure)


@dataclass(frozen=True, slots=True)
class Medians:
    setup_wall: float
    setup_cpu_per_stream: float
    farm_cpu_per_stream: float
    held_per_node: float
    steady_cores: float
    per_line: float


def medians(turns: Sequence[Turn]) -> Medians:
    def m(values: Sequence[float]) -> float:
        return statistics.median(values)

    return Medians(
        setup_wall=m([t.setup_wall for t in turns]),
        setup_cpu_per_stream=m([t.setup_cpu / t.nodes for t in turns]),
        farm_cpu_per_stream=m([t.farm_setup_cpu / t.nodes for t in turns]),
        held_per_node=m([t.held_bytes / t.nodes for t in turns]),
        steady_cores=m([t.steady_cpu / t.window for t in turns]),
        per_line=m([t.steady_cpu / t.lines for t in turns]),
    )


FIGURES: tuple[tuple[str, str, str], ...] = (
    # (label, Medians field, unit)
    ("set-up: subscribed → every node heard (wall)", "setup_wall", "s"),
    ("set-up: controller CPU a stream", "setup_cpu_per_stream", "ms"),
    ("set-up: the farm's CPU a stream (the exporters' side)", "farm_cpu_per_stream", "ms"),
    ("held: RSS a node (the stream and its readings)", "held_per_node", "KiB"),
    ("steady: controller CPU, heartbeats only (cores)", "steady_cores", "cores"),
    ("steady: controller CPU a heartbeat", "per_line", "µs"),
)


def _text(value: float, unit: str) -> str:
    match unit:
        case "s":
            return f"{value:.2f} s"
        case "ms":
            return f"{value * 1e3:.2f} ms"
        case "KiB":
            return f"{value / 1024:.1f} KiB"
        case "cores":
            return f"{value:.3f}"
        case _:
            return f"{value * 1e6:.0f} µs"


def grid(turns: Sequence[Turn], nodes: int, default: float) -> Grid:
    """The figures at the old period beside the default's, with how many times lower the
    default's is (above 1: lower)."""
    before = medians([t for t in turns if t.heartbeat == BEFORE_SECONDS])
    now = medians([t for t in turns if t.heartbeat == default])
    rows = []
    for label, key, unit in FIGURES:
        a, b = getattr(before, key), getattr(now, key)
        rows.append(
            (label, _text(a, unit), _text(b, unit), format_ratio(improvement(b, a, lower_is_better=True)))
        )
    at = len([t for t in turns if t.heartbeat == default])
    return Grid(
        f"Direct source: {nodes:,} streams, heartbeats every {BEFORE_SECONDS:g} s and every {default:g} s",
        f"Medians of {at} turn{'s' if at != 1 else ''} per period, taking turns, each a child process of "
        f"its own holding {nodes:,} streams of {GPUS_PER_NODE}-GPU nodes. ratio: the {BEFORE_SECONDS:g} s "
        f"figure over the {default:g} s one (above 1: the default costs less).",
        (
            "figure",
            f"heartbeat {BEFORE_SECONDS:g} s (before #29)",
            f"heartbeat {default:g} s (default)",
            "ratio",
        ),
        tuple(rows),
    )


# ---------------------------------------------------------------------------------------------
# The run


INTRO = """\
The direct source's streams alone: the signal farm as every node's exporter, and the controller's
real `DirectSource` in a child process of its own, without a control plane. Setting up every
stream (as a restart does), what holding one costs in memory, and what its heartbeats cost once
nothing else changes, at the heartbeat period before issue #29 (10 s) beside the default now (a
third of the 60 s staleness). Regenerate with `python -m bench stream-costs`."""


def notes(plan: Plan) -> list[str]:
    return [
        "Heartbeats counted, not read: every stream sends one a period and nothing else once the "
        "state lines are in, so a window holds nodes × window / period of them; the CPU a heartbeat "
        "divides the child's whole CPU by that (the event loop's timers and the staleness sweep "
        "included).",
        "The set-up is a restart's: every stream opened at once (at most 200 being set up, the "
        "source's default), through aiohttp, each answered by its state line of "
        f"{GPUS_PER_NODE} GPUs; the farm's CPU is what the exporters' side costs on the same "
        "machine, which a real fleet spreads over its nodes.",
        "RSS: the child's resident set after the set-up less before it, garbage collected both "
        "times: aiohttp's connection state and the readings the source keeps.",
        f"Each turn: the set-up, {plan.settle_seconds:g} s to let the last lines in, a "
        f"{plan.window_seconds:g} s window. Two cores, shared with the farm and other people's work "
        "(the load row): the ratios are the figures to read.",
    ]


def machine(plan: Plan, seconds: float, load: Sequence[float]) -> list[tuple[str, str]]:
    return [
        ("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("command", "python -m bench stream-costs" + (" --quick" if plan.quick else "")),
        ("CPU", f"{cpu_model()}, nproc {os.cpu_count()}; nothing pinned"),
        ("load average (1/5/15 min) at the end", " / ".join(f"{v:.2f}" for v in load)),
        ("software", f"Python {sys.version.split()[0]}, aiohttp {version('aiohttp')}"),
        ("took", f"{seconds:.0f} s"),
    ]


async def measure(plan: Plan) -> list[Turn]:
    whole_periods(plan.window_seconds, (BEFORE_SECONDS, HEARTBEAT_SECONDS))
    turns: list[Turn] = []
    with tempfile.TemporaryDirectory(prefix="gpumon-stream-costs-") as tmp:
        async with signal_farm(Path(tmp), plan.nodes) as farm:
            for _ in range(plan.turns):
                for heartbeat in (BEFORE_SECONDS, HEARTBEAT_SECONDS):
                    turn = await asyncio.to_thread(run_child, farm.url, farm.child.pid, plan, heartbeat)
                    log(f"heartbeat {heartbeat:g} s: {asdict(turn)}")
                    turns.append(turn)
    return turns


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench stream-costs", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1,000 nodes, short windows; print")
    parser.add_argument("--nodes", type=int, help="streams (default: 10,000, or 1,000 with --quick)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.nodes:
        plan = Plan(args.nodes, plan.settle_seconds, plan.window_seconds, plan.turns, plan.quick)
    started = time.monotonic()
    turns = asyncio.run(measure(plan))
    tables = [grid(turns, plan.nodes, HEARTBEAT_SECONDS)]
    section = section_markdown(
        SECTION,
        title=TITLE,
        intro=INTRO,
        machine=machine(plan, time.monotonic() - started, os.getloadavg()),
        tables=tables,
        notes=notes(plan),
    )
    publish(section, quick=plan.quick, what="stream costs")
    return 0


def _child_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stream_costs --child")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--farm", required=True)
    parser.add_argument("--farm-pid", type=int, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--heartbeat", type=float, required=True)
    parser.add_argument("--settle", type=float, required=True)
    parser.add_argument("--window", type=float, required=True)
    a = parser.parse_args(argv)
    turn = asyncio.run(child(a.farm, a.farm_pid, a.nodes, a.heartbeat, a.settle, a.window))
    print(json.dumps(asdict(turn)))
    return 0


if __name__ == "__main__":
    raise SystemExit(_child_main(sys.argv[1:]))
