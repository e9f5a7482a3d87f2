"""The pure parts of the controller on a generated fleet, in-process (``python -m bench
fleet-65k``): a whole policy round, the admission, the drain plans and the scale plan, timed in
CPU seconds with the real gpumon functions, and the memory of the state they read.

A whole round is what a restart or a resync does (every node evaluated; after a restart with
no state but the nodes' annotations, which are empty here); in steady state the reconciler
evaluates only the nodes marked dirty (a reading changed, a timer due), so the figures per
evaluated node, healthy and bad, are given apart. The scale plan is bench/autoscale_plan.py's
fleet grown to this size: its own nodes (4 pools), 95 % of them running GPU pods (the busy set the
exporters' signals give) and 500 pending pods.
"""

from __future__ import annotations

import random
import statistics
import time
import tracemalloc
from dataclasses import dataclass, replace

from bench import autoscale_plan
from bench.fleet_model import (
    GPUS_PER_NODE,
    SCRAPES,
    Fleet,
    marks,
    node_pods,
    node_views,
    pool_name,
    readings,
)
from gpumon.config.controller import ControllerConfig
from gpumon.controller.configure import build_policy
from gpumon.controller.core.breaker import Candidate, PoolView, SafetyPolicy, admit
from gpumon.controller.core.contract.node import node_records
from gpumon.controller.core.drain_plan import DrainPolicy, needs_drain, plan_drain
from gpumon.controller.core.policy import EMPTY_NODE_STATE, NodeRuleState, evaluate_node, with_records
from gpumon.controller.core.scale_plan import plan_pools
from gpumon.controller.core.verdicts import NodeVerdict, SignalStatus

NOW = 1_800_000_000.0
RESYNC_SECONDS = 10.0
REPEATS = 3  # rounds of the cheap parts; the median is reported


@dataclass(frozen=True, slots=True)
class Pure:
    nodes: int
    gpus: int
    faulted_gpus: int
    nodes_with_findings: int  # nodes whose state the round kept: a rule pending or firing
    candidates: int  # nodes with a verdict, offered to the admission
    admitted: int
    drains: int  # nodes with a drain plan (unhealthy GPUs)
    state_bytes: int  # views, readings and pods as built (tracemalloc), what a round reads
    restart_cpu: float  # every node, no state held
    # ... as the Prometheus source reads them: the nodes its answers name GPU by GPU, the others
    # as a whole (summaries, no GPUs listed)
    restart_summaries_cpu: float
    resync_cpu: float  # every node, the states of the round before
    healthy_cpu: float  # per healthy node evaluated, from the resync round
    bad_cpu: float  # per node with findings evaluated (median of REPEATS rounds over them)
    admit_cpu: float
    drain_cpu: float  # all the drain plans
    scale_plan_cpu: float  # the pure planner
    scale_inputs_cpu: float  # the shell reading its caches into the planner's inputs


def _cpu() -> float:
    return time.process_time()


def pure_side(fleet: Fleet) -> Pure:
    policy = build_policy(ControllerConfig())
    m = marks(fleet)
    at = NOW + SCRAPES[-1]
    tracemalloc.start()
    views = list(node_views(fleet))
    fleet_readings = {r.node: r for r in readings(fleet, m, at)}
    pods = {v.name: node_pods(i) for i, v in enumerate(views)}
    state_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()

    def round_(states: dict[str, NodeRuleState], names: list[int], now: float) -> dict[str, NodeVerdict]:
        verdicts = {}
        for i in names:
            view = views[i]
            prev = with_records(states.get(view.name, EMPTY_NODE_STATE), node_records(view), policy)
            ev = evaluate_node(view.name, view.labels, fleet_readings.get(view.name), prev, now, policy)
            if ev.state.targets:
                states[view.name] = ev.state
            else:
                states.pop(view.name, None)
            verdicts[view.name] = ev.verdict
        return verdicts

    states: dict[str, NodeRuleState] = {}
    everyone = list(range(fleet.nodes))
    named = {number // GPUS_PER_NODE for number in (*m.faults, *m.new_xids)}
    full = fleet_readings
    fleet_readings = {
        r.node: r if i in named else replace(r, gpus=(), pods_attributed=False, busy=True, gpus_read=False)
        for i, r in enumerate(full.values())
    }
    started = _cpu()
    round_({}, everyone, NOW)
    restart_summaries_cpu = _cpu() - started
    fleet_readings = full
    started = _cpu()
    round_(states, everyone, NOW)
    restart_cpu = _cpu() - started
    started = _cpu()
    verdicts = round_(states, everyone, NOW + RESYNC_SECONDS)
    resync_cpu = _cpu() - started
    index = {v.name: i for i, v in enumerate(views)}
    bad = [index[name] for name in states]
    bad_rounds = []
    for k in range(REPEATS):
        started = _cpu()
        round_(states, bad, NOW + RESYNC_SECONDS * (k + 2))
        bad_rounds.append(_cpu() - started)
    bad_cpu = statistics.median(bad_rounds) / max(1, len(bad))
    healthy_cpu = (resync_cpu - bad_cpu * len(bad)) / max(1, fleet.nodes - len(bad))

    candidates = [
        Candidate(name, pool_name(index[name]), v.first_bad_at or NOW)
        for name, v in verdicts.items()
        if v.severity is not None and v.signals is SignalStatus.FRESH
    ]
    sizes: dict[str, int] = {}
    for i in everyone:
        sizes[pool_name(i)] = sizes.get(pool_name(i), 0) + 1
    pools = {p: PoolView(n) for p, n in sizes.items()}
    admit_rounds, admitted = [], 0
    for _ in range(REPEATS):
        started = _cpu()
        admitted = len(admit(candidates, pools, {}, now=NOW, policy=SafetyPolicy()).admitted)
        admit_rounds.append(_cpu() - started)
    drain = DrainPolicy()
    draining = [name for name, v in verdicts.items() if needs_drain(v, drain)]
    started = _cpu()
    for name in draining:
        plan_drain(
            verdicts[name], fleet_readings[name], pods[name], (), now=NOW, started_at=NOW, policy=drain
        )
    drain_cpu = _cpu() - started
    plan_cpu, inputs_cpu = _scale(fleet.nodes)
    return Pure(
        fleet.nodes, fleet.gpus, len(m.faults), len(bad), len(candidates), admitted, len(draining),
        state_bytes, restart_cpu, restart_summaries_cpu, resync_cpu, healthy_cpu, bad_cpu,
        statistics.median(admit_rounds), drain_cpu, plan_cpu, inputs_cpu,
    )  # fmt: skip


def _scale(nodes: int) -> tuple[float, float]:
    """The scale plan: (pure planner, caches -> inputs), medians of REPEATS rounds."""
    pools = autoscale_plan._pools(nodes=nodes)
    a, scales, busy = autoscale_plan._autoscaler(pools, random.Random(1), nodes=nodes)
    pending = list(a.pending.items().values())
    plans, inputs = [], []
    for _ in range(REPEATS):
        started = _cpu()
        made = a.inputs(scales, busy, autoscale_plan.NOW)
        inputs.append(_cpu() - started)
        started = _cpu()
        plan_pools(made, pending, autoscale_plan.NOW)
        plans.append(_cpu() - started)
    return statistics.median(plans), statistics.median(inputs)
