"""Autoscaling: the time one planning round takes at fleet scale, in-process.

2,000 GPU nodes in 4 pools (8 GPUs each), 95 % of them running GPU pods, 500 pending GPU pods of
mixed sizes, some nodes quarantined, idle, joining or without allocatable GPUs. Measured: the
pure planner (:func:`gpumon.controller.core.scale_plan.plan_pools`), and the whole CPU side of a round
(the shell reading its caches into planner inputs, then planning), the caches being the real
informer caches seeded with the same objects. API calls are not part of either. Beside it, the
replicas a GPU-unaware autoscaler would request (one node per pending pod).

The same fleet asked through DRA, planned in the same run: pools whose templates publish 8 GPUs
(``template.dra``), the pending pods claiming the same numbers of GPUs of NVIDIA's
``gpu.nvidia.com`` DeviceClass, half of them with a CEL selector on the GPUs' memory. The first
round compiles and evaluates every selector (nothing cached yet), later rounds reuse results.

``python -m bench.autoscale_plan [--repeats N]`` prints the table as Markdown.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from prometheus_client import CollectorRegistry

from bench.report import Row, Table, table_markdown
from gpumon.config.pools import PoolConfig
from gpumon.controller.act.events import EventRecorder
from gpumon.controller.act.evict import Evictor
from gpumon.controller.act.retry import RetryPolicy
from gpumon.controller.configure import pool_from_config
from gpumon.controller.core.backoff import Backoff
from gpumon.controller.core.contract import RECORD_ANNOTATION
from gpumon.controller.core.contract.autoscaler import Record, record_to_annotation
from gpumon.controller.core.demand import PodDemand
from gpumon.controller.core.device_claims import ClaimDemand, DeviceRequest, Selector
from gpumon.controller.core.objects import GpuResources, PdbView
from gpumon.controller.core.pools import Pool, PoolNode, ScaleState
from gpumon.controller.core.scale_plan import Action, plan_pools
from gpumon.controller.core.signals import EMPTY_FLEET, FleetSignals
from gpumon.controller.shell.autoscaler_loop import AutoscaleMetrics, Autoscaler, gpu_resources
from gpumon.controller.shell.node_pods import NodePods
from gpumon.k8s.dra_cel import compile_selector
from gpumon.kube.informer import Selection, View
from gpumon.kube.registry import Informers

NODES = 2_000
PENDING = 500
POOLS = 4
GPU = "nvidia.com/gpu"
NOW = 1_800_000_000.0
TARGET_SECONDS = 10.0  # docs/benchmarks.md, "Targets": pending GPU pods -> scale request


class _NoSignals:
    """Which nodes are busy is given to each round here (``busy``), not read from signals."""

    name = "none"

    def current(self) -> FleetSignals:
        return EMPTY_FLEET

    async def run(self, on_change: Any) -> None:
        raise AssertionError("not used")


class _NoApi:
    """The caches are seeded by hand; nothing here talks to an API server."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the benchmark made an API call ({name})")


GPU_CLASS = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
BIG_GPU = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'


def _dra_template() -> dict[str, Any]:
    gpu = {"name": "gpu", "count": 8, "attributes": {"type": "gpu", "productName": "NVIDIA H100 80GB HBM3"}}
    return {
        "resources": {"cpu": "96", "memory": "1Ti"},
        "dra": {"devices": [{**gpu, "capacity": {"memory": "80Gi"}}]},
    }


def _as_claims(pods: list[PodDemand], rng: random.Random) -> list[PodDemand]:
    """The same pods asking their GPUs through one claim each, as the shell resolves them."""
    class_selectors = (Selector(GPU_CLASS, compile_selector(GPU_CLASS)),)
    big = (Selector(BIG_GPU, compile_selector(BIG_GPU)),)
    out = []
    for pod in pods:
        count = pod.requests[GPU] // 1000
        request = DeviceRequest(
            "gpu", "gpu.nvidia.com", big if rng.random() < 0.5 else (), count, False, class_selectors
        )
        requests = {k: v for k, v in pod.requests.items() if k != GPU}
        out.append(
            replace(
                pod,
                requests=MappingProxyType(requests),
                claims=(ClaimDemand(f"ml/{pod.name}-gpu", (request,)),),
            )
        )
    return out


def _pools(dra: bool = False, nodes: int = NODES) -> list[Pool]:
    return [
        pool_from_config(
            PoolConfig.model_validate(
                {
                    "name": f"pool-{i}",
                    "target": {"namespace": "capi", "name": f"md-{i}"},
                    "node_selector": f"pool=pool-{i}",
                    "template": _dra_template()
                    if dra
                    else {"resources": {GPU: 8, "cpu": "96", "memory": "1Ti"}},
                    "max_replicas": max(1_000, 2 * nodes // POOLS),
                    "max_step": 200,
                    "headroom_nodes": 2,
                    "min_replicas": 10,
                    "scale_down_unneeded_seconds": 600,
                }
            )
        )
        for i in range(POOLS)
    ]


def _pending(rng: random.Random) -> list[PodDemand]:
    out = []
    for i in range(PENDING):
        gpus = rng.choice((1, 1, 2, 2, 4, 8))
        selector = {"pool": f"pool-{rng.randrange(POOLS)}"} if rng.random() < 0.5 else {}
        out.append(
            PodDemand(
                "ml",
                f"pending-{i}",
                f"uid-pending-{i}",
                MappingProxyType({GPU: gpus * 1000, "cpu": 8000, "memory": 64 * 2**30 * 1000, "pods": 1000}),
                node_selector=MappingProxyType(selector),
                priority=rng.choice((0, 0, 100)),
                pending_since=NOW - rng.random() * 5,
            )
        )
    return out


def _autoscaler(
    pools: list[Pool], rng: random.Random, dra: bool = False, nodes: int = NODES
) -> tuple[Autoscaler, dict[str, ScaleState], frozenset[str]]:
    """The autoscaler with its caches seeded, each pool's scale, and the nodes running GPU pods
    (what :meth:`Autoscaler.busy_nodes` finds from the exporters' signals and node lists)."""
    api: Any = _NoApi()
    informers = Informers()
    evictor = Evictor(api, RetryPolicy(Backoff()))
    pdbs: View[PdbView] = informers.informer(Selection("/apis/policy/v1/poddisruptionbudgets")).view(
        lambda o: None, name="pdbs"
    )
    a = Autoscaler(
        api,
        pools,
        informers=informers,
        node_pods=NodePods(api, GpuResources(), evictor),
        source=_NoSignals(),
        pdbs=pdbs,
        recorder=EventRecorder(api, instance="bench"),
        evictor=evictor,
        metrics=AutoscaleMetrics(CollectorRegistry()),
        is_leader=lambda: True,
        dry_run=True,
        resources=gpu_resources(GpuResources(), pools),
        wall_clock=lambda: NOW,
    )
    per_pool = nodes // POOLS
    names = []
    for pool in pools:
        for i in range(per_pool):
            name = f"{pool.name}-{i}"
            names.append(name)
            roll = rng.random()
            view = PoolNode(
                name,
                created_at=NOW - (30 if roll < 0.01 else 86_400),
                gpus_allocatable=roll >= 0.01,  # 1 % joining, device plugin starting
                quarantined=0.01 <= roll < 0.02,
                unschedulable=0.02 <= roll < 0.025,
            )
            a.nodes[pool.name].update_local(name, view, "1")
    busy = frozenset(names[: int(len(names) * 0.95)])  # 5 % idle
    pending = _pending(rng)
    for demand in _as_claims(pending, rng) if dra else pending:
        a.pending.update_local(demand.key, demand, "1")
    provided = {f"uid-pending-{i}": NOW - 20 for i in range(0, PENDING, 10)}  # a scale-up on its way
    record = record_to_annotation(Record(provided=MappingProxyType(provided), scaled_up_at=NOW - 20))
    scales = {
        pool.name: ScaleState(
            per_pool + 5, per_pool, "", "1", "uid", MappingProxyType({RECORD_ANNOTATION: record})
        )
        for pool in pools
    }
    # Warm the shell's observations, as a running controller has them.
    a.inputs(scales, busy, NOW - 1_000)
    return a, scales, busy


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"p50 {statistics.median(ordered) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms"


def _dra_rounds(repeats: int, seed: int) -> tuple[float, list[float], int]:
    """The DRA fleet: (first round, later rounds, nodes added for pending pods)."""
    pools = _pools(dra=True)
    a, scales, busy = _autoscaler(pools, random.Random(seed), dra=True)
    pending = list(a.pending.items().values())
    times: list[float] = []
    plans: tuple[Any, ...] = ()
    for _ in range(repeats + 1):
        inputs = a.inputs(scales, busy, NOW)
        started = time.perf_counter()
        plans = plan_pools(inputs, pending, NOW)
        times.append(time.perf_counter() - started)
    return times[0], times[1:], sum(p.demand_nodes for p in plans)


def measure(repeats: int = 30, seed: int = 1) -> Table:
    rng = random.Random(seed)
    pools = _pools()
    a, scales, busy = _autoscaler(pools, rng)
    pending = list(a.pending.items().values())
    pure: list[float] = []
    full: list[float] = []
    plans: tuple[Any, ...] = ()
    for _ in range(repeats):
        inputs = a.inputs(scales, busy, NOW)
        started = time.perf_counter()
        plans = plan_pools(inputs, pending, NOW)
        pure.append(time.perf_counter() - started)
        started = time.perf_counter()
        plans = plan_pools(a.inputs(scales, busy, NOW), list(a.pending.items().values()), NOW)
        full.append(time.perf_counter() - started)
    added = sum(p.demand_nodes for p in plans)
    dra_first, dra_later, dra_added = _dra_rounds(repeats, seed)
    replacing = sum(p.desired - p.current - p.demand_nodes for p in plans if p.action is Action.SCALE_UP)
    for_pods = sum(len(p.pods) for p in plans)
    naive = for_pods  # one node per pod
    by_key = {p.key: p for p in pending}
    # No packing beats each pool's GPUs asked for / 8 per node.
    bound = sum(-(-sum(by_key[k].requests[GPU] for k in p.pods) // 8000) for p in plans)
    return Table(
        title="Autoscaling: planning at fleet scale",
        method=(
            f"{NODES:,} GPU nodes in {POOLS} pools (8 GPUs each), 95 % of them running GPU pods, "
            f"{PENDING} pending GPU pods (1-8 GPUs); {repeats} rounds in-process "
            "(`python -m bench.autoscale_plan`). A round's CPU side is the shell reading its informer "
            "caches and which nodes are busy into planner inputs, then planning; API calls (the lists "
            "of the nodes the exporters do not show busy) excluded. The naive autoscaler asks one node "
            "per pending pod. "
            "DRA: the same fleet and pods, GPUs published by `template.dra` and claimed "
            "(gpu.nvidia.com, half with a CEL memory selector), planned in the same run."
        ),
        rows=(
            Row("planning time (pure planner)", "—", _ms(pure)),
            Row(
                "planning time, DRA claims (pure planner)",
                "—",
                _ms(dra_later),
                # Beside the same pods through nvidia.com/gpu, measured in the same run (row above).
                ratio=f"p50 {statistics.median(dra_later) / statistics.median(pure):.2f}x nvidia.com/gpu's",
            ),
            Row(
                "first DRA round (every selector evaluated on the templates, nothing cached yet)",
                "—",
                f"{dra_first * 1000:.1f} ms",
            ),
            Row(
                "nodes requested, DRA claims",
                f"as for nvidia.com/gpu ({added})",
                f"{dra_added} nodes",
                met="yes" if dra_added == added else "no",
            ),
            Row(
                "round CPU time (caches -> plans)",
                f"≤ {TARGET_SECONDS:.0f} s pending -> request",
                _ms(full),
                met="yes" if max(full) < TARGET_SECONDS else "no",
            ),
            Row(
                "nodes requested for the pending pods",
                "exactly what they need",
                f"{added} nodes for {for_pods} pods (lower bound {bound}); {replacing} more replace "
                "quarantined nodes",
                naive=f"{naive} nodes",
                ratio=f"{naive / added:.1f}x fewer" if added else "—",
            ),
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.autoscale_plan", description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    print(table_markdown(measure(args.repeats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
