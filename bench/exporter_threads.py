"""The exporter's CPU thread by thread, above the floor the mock library sets (issue #19).

    python -m bench.exporter_threads [--seconds 60] [--before DIR]

On the footprint bench's mock node (:mod:`bench.mock_node`: NVIDIA's mock libnvidia-ml, 8 A100s,
64 pods, pod attribution on), in one window, every process on CPU 0:

- **floor, library open**: a process that only loads the mock library (``nvmlInit``) and sleeps.
  The mock is a Go c-shared library, so its runtime comes with it into every process;
- **floor, bare pynvml**: one loop reading the fast fields of every GPU once a second, and the
  slow ones every 10 s, through pynvml, no threads, no event loop, no exposition;
- **gpumon** (and, with ``--before DIR``, the exporter of another checkout beside it: the same
  interpreter, that checkout's ``gpumon``), ``gpumon exporter --backend nvml``, scraped once a
  second as Prometheus scrapes (OpenMetrics, gzip).

Per thread: utime + stime from ``/proc/PID/task/TID/stat`` (10 ms ticks) over the window,
grouped by the names gpumon gives its threads (gpumon/runtime/threadnames.py). Threads a native library
starts while called from a named thread inherit that name: the Go runtime's threads, started
when NVML is opened from a device thread, are counted with the device threads. Prints Markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.footprint import one_per_second, wait_for
from bench.mock_node import NODE, mock_node
from bench.procs import Server, cpu_seconds, free_port, pinned
from bench.run import load_average

_TICKS = os.sysconf("SC_CLK_TCK")
CPU = 0
GROUPS = ("event loop (main thread)", "render", "Xid wait", "device calls (+ Go runtime)", "other")


def thread_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """Each live thread of ``pid``: its name and its CPU seconds so far."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rpartition(")")[2].split()
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / _TICKS)
    return out


def group(pid: int, tid: int, name: str) -> str:
    if tid == pid:
        return GROUPS[0]
    if name.startswith("gpumon-render"):
        return GROUPS[1]
    if name == "gpumon-xid":
        return GROUPS[2]
    if name.startswith("gpumon-device"):
        return GROUPS[3]
    return GROUPS[4]


def by_group(
    pid: int, before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    out = dict.fromkeys(GROUPS, 0.0)
    for tid, (name, seconds) in after.items():
        out[group(pid, tid, name)] += seconds - before.get(tid, (name, 0.0))[1]
    return out


def _bare_loop() -> None:
    """The floor of reading the fields: pynvml alone, in one thread."""
    import pynvml

    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def tried(call: object, *args: object) -> None:
        with contextlib.suppress(pynvml.NVMLError):
            call(*args)  # type: ignore[operator]

    start, n = time.monotonic(), 0
    while True:
        for h in handles:
            tried(pynvml.nvmlDeviceGetMemoryInfo, h, pynvml.nvmlMemory_v2)
            tried(pynvml.nvmlDeviceGetUtilizationRates, h)
            tried(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
            tried(pynvml.nvmlDeviceGetPowerUsage, h)
            tried(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
            tried(pynvml.nvmlDeviceGetTotalEnergyConsumption, h)
            tried(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
            tried(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)
            tried(pynvml.nvmlDeviceGetCurrentClocksEventReasons, h)
            tried(pynvml.nvmlDeviceGetFieldValues, h, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
            tried(pynvml.nvmlDeviceGetComputeRunningProcesses, h)
            tried(pynvml.nvmlDeviceGetGraphicsRunningProcesses, h)
            tried(pynvml.nvmlDeviceGetProcessUtilization, h, 0)
            if n % 10 == 0:
                tried(pynvml.nvmlDeviceGetPcieReplayCounter, h)
                for kind in (
                    pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                ):
                    tried(pynvml.nvmlDeviceGetTotalEccErrors, h, kind, pynvml.NVML_VOLATILE_ECC)
                tried(pynvml.nvmlDeviceGetRemappedRows, h)
                tried(pynvml.nvmlDeviceGetEncoderUtilization, h)
                tried(pynvml.nvmlDeviceGetDecoderUtilization, h)
                tried(pynvml.nvmlDeviceGetFanSpeed, h)
                tried(pynvml.nvmlDeviceGetPerformanceState, h)
        n += 1
        time.sleep(max(0.0, start + n - time.monotonic()))


def _library_open() -> None:
    import pynvml

    pynvml.nvmlInit()
    while True:
        time.sleep(3600)


def measure(seconds: float, checkouts: Sequence[tuple[str, Path]], workdir: Path) -> str:
    with mock_node() as node:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMON_", "MOCK_NVML_"))}
        floors = {
            label: subprocess.Popen(
                pinned([sys.executable, "-m", "bench.exporter_threads", "--floor", mode], [CPU]),
                env=env | node.env(),
                cwd=Path.cwd(),
            )
            for label, mode in (("floor: library open", "open"), ("floor: bare pynvml", "loop"))
        }
        servers: list[Server] = []
        for label, checkout in checkouts:
            port = free_port()
            argv = [
                sys.executable, "-m", "gpumon.cli", "exporter", "--backend", "nvml", "--node-name", NODE,
                "--listen-address", "127.0.0.1", "--port", str(port),
            ]  # fmt: skip
            log = workdir / f"{len(servers)}.log"
            servers.append(
                Server(
                    label,
                    argv,
                    port=port,
                    cpus=[CPU],
                    log=log,
                    cwd=checkout,
                    noop_path="/healthz",
                    env=env | node.gpumon_env(),
                )
            )
        try:
            pids = {label: p.pid for label, p in floors.items()} | {s.name: s.pid for s in servers}
            before, after, elapsed = asyncio.run(_window(seconds, servers, pids))
        finally:
            for s in servers:
                s.stop()
            for p in floors.values():
                p.kill()
                p.wait()
    labels = list(pids)
    rows = ["| % of a core | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    groups = {label: by_group(pids[label], before[label][1], after[label][1]) for label in labels}
    for name in GROUPS:
        cells = " | ".join(f"{100 * groups[label][name] / elapsed:.2f}" for label in labels)
        rows.append(f"| {name} | {cells} |")
    cells = " | ".join(f"**{100 * (after[label][0] - before[label][0]) / elapsed:.2f}**" for label in labels)
    rows.append(f"| **process** (dead threads too) | {cells} |")
    head = f"{elapsed:.0f} s window, CPU {CPU}, load average {load_average()} at the end"
    return head + "\n\n" + "\n".join(rows) + "\n"


_Reading = dict[str, tuple[float, dict[int, tuple[str, float]]]]


async def _window(
    seconds: float, servers: Sequence[Server], pids: dict[str, int]
) -> tuple[_Reading, _Reading, float]:
    """Each process's CPU and its threads', before and after ``seconds`` of one scrape a second."""
    for s in servers:
        await wait_for(s, "gpumon_pod_gpu_memory_used_bytes{")
    await asyncio.sleep(12)  # past the first slow tick and the pod watch's list
    before = {label: (cpu_seconds(pid), thread_seconds(pid)) for label, pid in pids.items()}
    start = time.monotonic()
    await asyncio.gather(*(one_per_second(s, seconds) for s in servers))
    elapsed = time.monotonic() - start
    after = {label: (cpu_seconds(pid), thread_seconds(pid)) for label, pid in pids.items()}
    return before, after, elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.exporter_threads", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--before", type=Path, help="another checkout's exporter, measured beside this one")
    parser.add_argument("--floor", choices=("open", "loop"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.floor:
        (_library_open if args.floor == "open" else _bare_loop)()
        return 0
    checkouts = [("gpumon", Path.cwd())]
    if args.before:
        checkouts.insert(0, ("gpumon before", args.before.resolve()))
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpumon-threads-") as tmp:
        print(measure(args.seconds, checkouts, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
