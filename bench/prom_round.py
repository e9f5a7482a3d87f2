"""One query round of the controller's Prometheus source against a real Prometheus serving a
synthetic fleet, before and after its answers followed what is wrong (#29).

The fleet is written as OpenMetrics (the series a gpumon exporter exports for the built-in rules,
with the labels a scrape adds), turned into a TSDB block by ``promtool tsdb
create-blocks-from openmetrics``, and served by ``prometheus``. Each side's queries run
concurrently, as the source runs them; the figures are each query's answer (samples, bytes of
the HTTP body) and the round's wall time (median of ``--rounds``). "before" is the query set of
the source before #29, kept here as the baseline; "after" is the source's two steps
(:func:`bench.fleet_prometheus.checkout_queries`: the second for the nodes the first names, both
run at once here, one after the other in the source), and the round after is also run through
:meth:`PrometheusSource.poll_once`, which is how another bench can run one round of the source::

    source = PrometheusSource(PrometheusSettings(url), policy.rules, session, wall_clock=lambda: at)
    changed = await source.poll_once()   # one round; source.current() holds the readings

``python -m bench.prom_round --nodes 1000 --bad 10``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import aiohttp

from bench.fleet_prometheus import checkout_queries
from gpumon.config.controller import ControllerConfig
from gpumon.controller.configure import build_policy
from gpumon.controller.core.promql import POD_SERIES
from gpumon.controller.shell.signal_sources.prometheus import (
    PrometheusSettings,
    PrometheusSource,
    parse_vector,
)
from gpumon.devcluster.localservers import free_port
from gpumon.gpu.model import HealthState, RecoveryAction

XID_WINDOW = 600
BEFORE: Mapping[str, str] = {
    "__freshness": "timestamp(gpumon_gpu_info)",
    "__pods": f'group by (node, namespace, pod, container, gpu, uuid) ({{__name__=~"{POD_SERIES}"}})',
    "temperature": 'gpumon_gpu_temperature_celsius{sensor="gpu"}',
    "ecc_uncorrectable": 'gpumon_gpu_ecc_errors_total{type="uncorrected"}',
    "row_remap_failure": "gpumon_gpu_row_remap_failure",
    "gpu_lost": 'gpumon_gpu_health{state="lost"}',
    "recovery_action": "gpumon_gpu_recovery_action == 1",
    "xid": (
        f"(increase(gpumon_gpu_xid_errors_total[{XID_WINDOW}s]) > 0) or "
        f"(gpumon_gpu_xid_errors_total unless gpumon_gpu_xid_errors_total offset {XID_WINDOW}s)"
    ),
}


def write_fleet(path: Path, nodes: int, gpus: int, bad: int, at: int) -> None:
    """Every GPU healthy and half of them holding a pod, except the first ``bad`` nodes' GPU 0:
    hot, with uncorrectable ECC errors, an Xid 79 and a recovery action."""
    families: dict[str, list[str]] = {}

    def add(name: str, labels: str, value: float, times: tuple[int, ...] = (at - XID_WINDOW, at)) -> None:
        families.setdefault(name, []).extend(f"{name}{{{labels}}} {value} {t}" for t in times)

    for n in range(nodes):
        node = f"gpu-node-{n:05d}"
        for g in range(gpus):
            sick = n < bad and g == 0
            uuid = f"GPU-{n:08x}-{g:04x}-0000-0000-000000000000"
            target = f'job="gpumon-exporter",instance="10.0.{n // 250}.{n % 250}:9400"'
            ids = f'{target},node="{node}",gpu="{g}",uuid="{uuid}"'
            add(
                "gpumon_gpu_info",
                f'{ids},model="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:{g:02X}:00.0",'
                'driver_version="570.86.15",cuda_version="12.8"',
                1,
            )
            add("gpumon_gpu_temperature_celsius", f'{ids},sensor="gpu"', 97 if sick else 55)
            add("gpumon_gpu_temperature_celsius", f'{ids},sensor="memory"', 60)
            add("gpumon_gpu_ecc_errors_total", f'{ids},type="corrected"', 0)
            add("gpumon_gpu_ecc_errors_total", f'{ids},type="uncorrected"', 2 if sick else 0)
            add("gpumon_gpu_row_remap_failure", ids, 0)
            state = HealthState.UNHEALTHY if sick else HealthState.HEALTHY
            for s in HealthState:
                add("gpumon_gpu_health", f'{ids},state="{s.value}"', int(s is state))
            action = RecoveryAction.GPU_RESET if sick else RecoveryAction.NONE
            for a in RecoveryAction:
                add("gpumon_gpu_recovery_action", f'{ids},action="{a.label}"', int(a is action))
            if sick:
                add("gpumon_gpu_xid_errors_total", f'{ids},xid="79"', 1, (at,))
            if g % 2 == 0:
                add("gpumon_pod_gpu_allocated", f'{ids},namespace="ml",pod="job-{n}-{g}",container="main"', 1)
    with path.open("w") as f:
        for name, lines in families.items():
            f.write(f"# TYPE {name} {'counter' if name.endswith('_total') else 'gauge'}\n")
            f.write("\n".join(lines) + "\n")
        f.write("# EOF\n")


async def measure(
    url: str, queries: Mapping[str, str], at: float, rounds: int
) -> tuple[dict[str, tuple[int, int]], float]:
    """Each query's (samples, bytes), and the median wall time of a concurrent round."""
    sizes: dict[str, tuple[int, int]] = {}
    times = []
    async with aiohttp.ClientSession() as session:

        async def one(name: str, q: str) -> None:
            async with session.get(url + "/api/v1/query", params={"query": q, "time": str(at)}) as resp:
                body = await resp.read()
            sizes[name] = (len(parse_vector(json.loads(body))), len(body))

        for _ in range(rounds):
            started = time.perf_counter()
            await asyncio.gather(*(one(n, q) for n, q in queries.items()))
            times.append(time.perf_counter() - started)
    return sizes, statistics.median(times)


async def source_round(url: str, at: float) -> tuple[int, float]:
    """One round of the source itself (what the controller runs): nodes read, seconds."""
    policy = build_policy(ControllerConfig())
    async with aiohttp.ClientSession() as session:
        settings = PrometheusSettings(url, timeout_seconds=60)
        src = PrometheusSource(settings, policy.rules, session, wall_clock=lambda: at)
        started = time.perf_counter()
        await src.poll_once()
        return len(src.current().nodes), time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.prom_round", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--bad", type=int, default=10, help="nodes with one sick GPU")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    at = (int(time.time()) // 3600 - 3) * 3600  # in a closed block, away from the head
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_fleet(work / "fleet.om", args.nodes, args.gpus, args.bad, at)
        subprocess.run(
            [
                "promtool",
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                str(work / "fleet.om"),
                str(work / "data"),
            ],
            check=True,
            capture_output=True,
        )
        (work / "prometheus.yml").write_text("global: {}\n")
        port = free_port()
        server = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            asyncio.run(_wait(url))
            after_queries = checkout_queries(url, at)
            before, before_s = asyncio.run(measure(url, BEFORE, at, args.rounds))
            after, after_s = asyncio.run(measure(url, after_queries, at, args.rounds))
            nodes_read, poll_s = asyncio.run(source_round(url, at))
        finally:
            server.terminate()
            server.wait()
    gpus = args.nodes * args.gpus
    print(f"fleet: {args.nodes:,} nodes x {args.gpus} GPUs = {gpus:,} GPUs, {args.bad} with a sick GPU")
    print("| query | before samples | before bytes | after samples | after bytes |")
    print("| --- | --- | --- | --- | --- |")
    for name in sorted(set(before) | set(after)):
        b, a = before.get(name), after.get(name)
        cells = [f"{x[0]:,} | {x[1]:,}" if x else "— | —" for x in (b, a)]
        print(f"| {name} | {cells[0]} | {cells[1]} |")
    tb = tuple(sum(x[i] for x in before.values()) for i in (0, 1))
    ta = tuple(sum(x[i] for x in after.values()) for i in (0, 1))
    print(f"| **round** | {tb[0]:,} | {tb[1]:,} | {ta[0]:,} | {ta[1]:,} |")
    print(f"samples ratio {tb[0] / ta[0]:.1f}x, bytes ratio {tb[1] / ta[1]:.1f}x")
    print(
        f"round wall time (median of {args.rounds}): before {before_s * 1000:.0f} ms, "
        f"after {after_s * 1000:.0f} ms, ratio {before_s / after_s:.1f}x"
    )
    print(f"PrometheusSource.poll_once: {nodes_read:,} node readings in {poll_s * 1000:.0f} ms")
    return 0


async def _wait(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            try:
                async with session.get(url + "/-/ready") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError("prometheus not ready")


if __name__ == "__main__":
    sys.exit(main())
