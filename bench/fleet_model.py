"""A generated GPU fleet, the one both sides of ``python -m bench fleet-65k`` read: its
controller-side state (Node views, readings, pods) and its Prometheus series
(:mod:`bench.fleet_openmetrics`) are two views of the same nodes, GPUs and faults.

Nodes of 8 GPUs in 4 pools, one single-GPU pod on each GPU and two CPU pods per node (the
controller's pod cache keeps only the GPU pods). A share of the GPUs is faulted, each with one
fault of :data:`FAULTS`, drawn by a seeded generator: the same arguments give the same fleet.
Besides them, 1 % of the healthy GPUs counted an informational Xid (an application's fault)
long ago, and 0.1 % within the Xid window: series the Xid query reads that no rule acts on.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from types import MappingProxyType

from gpumon.controller.core.contract import LABEL_POOL
from gpumon.controller.core.objects import NodeView, PodView
from gpumon.controller.core.signals import GpuReading, NodeReading, XidSeen
from gpumon.gpu.model import HealthState, PodRef, RecoveryAction

GPUS_PER_NODE = 8
CPU_PODS_PER_NODE = 2
POOLS = 4
NAMESPACE = "ml"
JOB = "gpumon-exporter"
SCRAPE_SECONDS = 280.0
# Scrapes before the query time: one before the Xid window (600 s) so that `offset 600s` finds
# each series that existed then, and three within it, the last inside the 5 min lookback.
SCRAPES = (-850.0, -570.0, -290.0, -10.0)


@dataclass(frozen=True, slots=True)
class Fault:
    """What the exporter says of a broken GPU: its health, why, and the readings behind it."""

    kind: str
    state: HealthState
    reason: str
    xid: int | None = None  # counted within the Xid window
    ecc_uncorrected: int = 0
    row_remap_failure: bool = False
    recovery: RecoveryAction = RecoveryAction.NONE
    temperature: float | None = None


# Kinds of fault, with their weights: what a large fleet's GPUs go wrong with, most to least.
FAULTS: tuple[tuple[Fault, int], ...] = (
    (Fault("ecc", HealthState.UNHEALTHY, "EccUncorrectable", 48, 2, False, RecoveryAction.GPU_RESET), 3),
    (Fault("contained-ecc", HealthState.DEGRADED, "EccContained", 94), 2),
    (Fault("off-the-bus", HealthState.LOST, "GpuLost", 79), 2),
    (Fault("remap", HealthState.UNHEALTHY, "RowRemapFailure", 64, 0, True, RecoveryAction.GPU_RESET), 1),
    (Fault("gsp", HealthState.UNHEALTHY, "XidFatal", 119, 0, False, RecoveryAction.GPU_RESET), 1),
    (Fault("hot", HealthState.DEGRADED, "Thermal", temperature=97.0), 1),
)
INFORMATIONAL_XIDS = (13, 31, 43)


@dataclass(frozen=True, slots=True)
class Fleet:
    nodes: int
    fault_share: float = 0.003
    seed: int = 1

    @property
    def gpus(self) -> int:
        return self.nodes * GPUS_PER_NODE


@dataclass(frozen=True, slots=True)
class Marks:
    """The GPUs that are not plain healthy ones, by global GPU number (node × 8 + index)."""

    faults: MappingProxyType[int, Fault]
    old_xids: MappingProxyType[int, int]  # an informational Xid counted before the window
    new_xids: MappingProxyType[int, int]  # ... and within it


def marks(fleet: Fleet) -> Marks:
    rng = random.Random(fleet.seed)
    kinds = [f for f, _ in FAULTS]
    weights = [w for _, w in FAULTS]
    faulted = rng.sample(range(fleet.gpus), round(fleet.gpus * fleet.fault_share))
    healthy = [g for g in rng.sample(range(fleet.gpus), round(fleet.gpus * 0.011)) if g not in set(faulted)]
    cut = round(fleet.gpus * 0.01)
    return Marks(
        MappingProxyType(dict(zip(faulted, rng.choices(kinds, weights, k=len(faulted)), strict=True))),
        MappingProxyType({g: rng.choice(INFORMATIONAL_XIDS) for g in healthy[:cut]}),
        MappingProxyType({g: rng.choice(INFORMATIONAL_XIDS) for g in healthy[cut:]}),
    )


def node_name(i: int) -> str:
    return f"gpu-{i:06d}"


def pool_name(i: int) -> str:
    return f"pool-{i % POOLS}"


def instance(i: int) -> str:
    return f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}:9400"


def gpu_uuid(i: int, index: int) -> str:
    return f"GPU-{i:08x}-{index:04x}-4a1b-8c2d-{i * GPUS_PER_NODE + index:012x}"


def pod_name(i: int, index: int) -> str:
    return f"train-{i:06d}-{index}"


def temperature(number: int) -> float:
    return float(35 + (number * 7) % 40)


def node_views(fleet: Fleet) -> Iterator[NodeView]:
    for i in range(fleet.nodes):
        labels = {LABEL_POOL: pool_name(i), "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        yield NodeView(node_name(i), str(i + 1), MappingProxyType(labels))


def node_pods(i: int) -> tuple[PodView, ...]:
    """What the controller's pod cache holds of node ``i``: its GPU pods."""
    name = node_name(i)
    return tuple(
        PodView(NAMESPACE, pod_name(i, g), f"uid-{i}-{g}", name, "Running", owner_kind="Job", uses_gpu=True)
        for g in range(GPUS_PER_NODE)
    )


def readings(fleet: Fleet, m: Marks, at: float) -> Iterator[NodeReading]:
    """Each node's reading as the Prometheus source builds it from the default rules' queries,
    scraped at ``at``."""
    for i in range(fleet.nodes):
        gpus = []
        for g in range(GPUS_PER_NODE):
            number = i * GPUS_PER_NODE + g
            fault = m.faults.get(number)
            lost = fault is not None and fault.state is HealthState.LOST
            recent = m.new_xids.get(number) or (fault.xid if fault is not None else None)
            pods = (PodRef(NAMESPACE, pod_name(i, g), "main"),)
            if lost:
                gpus.append(GpuReading(gpu_uuid(i, g), g, at, lost=True, xids=(XidSeen(79, at),), pods=pods))
                continue
            gpus.append(
                GpuReading(
                    gpu_uuid(i, g),
                    g,
                    at,
                    temperature_celsius=fault.temperature
                    if fault and fault.temperature
                    else temperature(number),
                    ecc_uncorrectable=fault.ecc_uncorrected if fault else 0,
                    row_remap_failure=bool(fault and fault.row_remap_failure),
                    lost=False,
                    recovery_action=fault.recovery if fault else RecoveryAction.NONE,
                    xids=(XidSeen(recent, at),) if recent else (),
                    pods=pods,
                )
            )
        yield NodeReading(node_name(i), at, tuple(gpus), pods_attributed=True)
