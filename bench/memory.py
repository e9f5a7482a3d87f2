"""``python -m bench memory``: where the exporter's resident memory goes, and its floor.

Two measurements on one mock node (:mod:`bench.mock_node`: NVIDIA's mock libnvidia-ml, 8 GPUs,
64 pods, pod attribution on):

- **Imports**: a fresh interpreter imports, step by step, what the running exporter imports, and
  reads its VmRSS after each step: first what no exporter on a node can do without (asyncio,
  aiohttp's server, nvidia-ml-py, ``nvmlInit`` of the mock library), then gpumon's own layers.
  Each step counts what it imports first (a library both need is counted once, where it first
  comes), so the order is the exporter's.
- **Processes**, side by side in one window, each scraped once a second: the floor
  (:mod:`bench.floor_server`, no gpumon code), ``gpumon exporter --backend nvml`` from this
  checkout, and any ``--baseline LABEL=DIR`` (another checkout's ``gpumon`` package put first on
  ``PYTHONPATH``, e.g. a ``git archive`` of main), each after its pods are attributed.

Writes its own section of bench/RESULTS.md; ``--quick`` (a 10 s window) prints it instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from bench.footprint import one_per_second, publish, wait_for
from bench.mock_node import NODE, MockNode, mock_node
from bench.procs import Server, free_port
from bench.report import Grid, section_markdown
from bench.run import REPO, load_average

SECTION = "exporter-memory"
MiB = 2**20

# (what the step is, the modules it imports). "nvmlInit" opens the mock library.
FLOOR_STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("asyncio", ("asyncio",)),
    ("aiohttp, aiohttp.web", ("aiohttp", "aiohttp.web")),
    ("pynvml (nvidia-ml-py)", ("pynvml",)),
    ("nvmlInit: the mock library opened (a Go runtime)", ("nvmlInit",)),
)
GPUMON_STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gpumon.gpu.model, gpumon.gpu.health (dataclasses)", ("gpumon.gpu.model", "gpumon.gpu.health")),
    ("pydantic", ("pydantic",)),
    ("gpumon.wire.v1 (the wire schema's pydantic models)", ("gpumon.wire.v1",)),
    ("gpumon.config (the exporter's config models)", ("gpumon.config",)),
    ("prometheus_client", ("prometheus_client",)),
    (
        "gpumon.exporter.server (sampler, exposition, gpu.model, kube.client, httpauth)",
        ("gpumon.exporter.server",),
    ),
    (
        "gpumon.exporter.attribution (pod-resources client, /proc, pod watch)",
        ("gpumon.exporter.attribution",),
    ),
    (
        "gpumon.devices.nvml, gpumon.exporter.command, gpumon.runtime.serving",
        ("gpumon.devices.nvml", "gpumon.exporter.command", "gpumon.runtime.serving"),
    ),
)

_PROBE = """
import importlib, json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
out = [("the interpreter", rss(), len(sys.modules))]
for label, modules in json.loads(sys.argv[1]):
    for m in modules:
        if m == "nvmlInit":
            import pynvml
            pynvml.nvmlInit()
        else:
            importlib.import_module(m)
    out.append((label, rss(), len(sys.modules)))
print(json.dumps(out))
"""


def import_steps(env: Mapping[str, str]) -> list[tuple[str, int, int]]:
    """(step, VmRSS after it, modules loaded after it), in one fresh interpreter."""
    steps = json.dumps([*FLOOR_STEPS, *GPUMON_STEPS])
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, steps], env=dict(env), capture_output=True, text=True, check=True
    ).stdout
    return [(label, rss, modules) for label, rss, modules in json.loads(out)]


def _status(pid: int) -> dict[str, int]:
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM", "Threads"):
            values[name] = int(rest.split()[0])
    return values


async def measure_processes(
    node: MockNode, baselines: Sequence[tuple[str, Path]], window: float, workdir: Path
) -> list[tuple[str, dict[str, int]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMON_", "MOCK_NVML_", "PYTHONPATH"))}
    servers: list[Server] = []
    exporters: list[tuple[str, Path | None]] = [("gpumon exporter (this checkout)", None)]
    exporters += [(f"gpumon exporter ({label})", d) for label, d in baselines]
    try:
        port = free_port()
        servers.append(
            Server(
                "floor (bench/floor_server.py)", [sys.executable, "-m", "bench.floor_server", str(port)],
                port=port, cpus=(), log=workdir / "floor.log", cwd=REPO, noop_path="/metrics",
                env=env | node.env(),
            )
        )  # fmt: skip
        for i, (name, checkout) in enumerate(exporters):
            port = free_port()
            argv = [
                sys.executable, "-m", "gpumon.cli", "exporter", "--backend", "nvml", "--node-name", NODE,
                "--listen-address", "127.0.0.1", "--port", str(port),
            ]  # fmt: skip
            path = {"PYTHONPATH": str(checkout)} if checkout is not None else {}
            servers.append(
                Server(
                    name, argv, port=port, cpus=(), log=workdir / f"exporter-{i}.log", cwd=workdir,
                    noop_path="/healthz", env=env | node.gpumon_env() | path,
                )
            )  # fmt: skip
        await servers[0].wait_ready("/metrics")
        for s in servers[1:]:
            await wait_for(s, "gpumon_pod_gpu_memory_used_bytes{")
        await asyncio.sleep(12)  # past the first slow tick and the pod watch's list
        await asyncio.gather(*(one_per_second(s, window) for s in servers))
        return [(s.name, _status(s.pid)) for s in servers]
    finally:
        for s in servers:
            s.stop()


def _mib(value: float) -> str:
    return f"{value / MiB:.1f}"


def run(baselines: Sequence[tuple[str, Path]], window: float) -> tuple[list[tuple[str, str]], list[Grid]]:
    import tempfile

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpumon-memory-") as tmp, mock_node() as node:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMON_", "MOCK_NVML_"))}
        steps = import_steps(env | node.env())
        processes = asyncio.run(measure_processes(node, baselines, window, Path(tmp)))
    rows = []
    previous = None
    floor_end = len(FLOOR_STEPS)
    for i, (label, rss, modules) in enumerate(steps):
        added = "—" if previous is None else f"{(rss - previous) / MiB:+.1f}"
        rows.append((label, _mib(rss), added, str(modules)))
        if i == floor_end:
            rows.append(("**the floor: no gpumon code**", f"**{_mib(rss)}**", "", ""))
        previous = rss
    imports = Grid(
        "Exporter memory: imports, in the running exporter's order",
        "One fresh interpreter on the mock node's environment imports each step in turn; VmRSS after "
        "each (MiB) and what the step added. A module two steps need is counted in the first.",
        ("step", "VmRSS after", "added", "modules loaded"),
        tuple(rows),
    )
    proc_rows = tuple(
        (name, _mib(s["VmRSS"] * 1024), _mib(s["VmHWM"] * 1024), str(s["Threads"])) for name, s in processes
    )
    procs = Grid(
        "Exporter memory: processes",
        f"Side by side on the same mock node (8 GPUs, 64 pods, pod attribution on), each scraped once "
        f"a second for the same {window:g} s window after its pods were attributed and 12 s more; "
        "VmRSS, VmHWM (MiB) and threads from /proc at the end. Goal (issue #19): 48 MiB.",
        ("process", "VmRSS", "VmHWM", "threads"),
        proc_rows,
    )
    machine = [
        ("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("command", "python -m bench memory" + "".join(f" --baseline {label}=…" for label, _ in baselines)),
        ("load average (1/5/15 min) at the end", load_average()),
        ("Python", platform.python_version()),
        ("duration", f"{time.monotonic() - started:.0f} s"),
    ]
    return machine, [imports, procs]


INTRO = """\
Where the exporter's resident memory goes, step by step in its own import order, and the floor
under it: a server with no gpumon code (bench/floor_server.py: asyncio, aiohttp's server,
nvidia-ml-py and the opened mock library, reading 8 GPUs once a second). Regenerate with
`python -m bench memory` (about a minute; `--baseline LABEL=DIR` runs another checkout's
exporter beside this one)."""

NOTES = (
    "RSS after an import is nearly deterministic (±0.1 MiB run to run); a running process's RSS "
    "moves with its threads' stacks touched and allocator fragmentation, about ±1 MiB here.",
    "The mock library is a Go c-shared library: its Go runtime is in every process that opens it "
    "(the floor's included); a real libnvidia-ml is C, and its cost was not measured here.",
)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench memory", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a 10 s window; print, do not write")
    parser.add_argument(
        "--baseline", action="append", default=[], metavar="LABEL=DIR",
        help="also run the exporter of the gpumon package in DIR (put first on PYTHONPATH)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    baselines = [(label, Path(d).resolve()) for label, _, d in (b.partition("=") for b in args.baseline)]
    machine, tables = run(baselines, 10.0 if args.quick else 60.0)
    section = section_markdown(
        SECTION, title="Exporter memory", intro=INTRO, machine=machine, tables=tables, notes=NOTES
    )
    publish(section, quick=args.quick, what="exporter memory")
    return 0
