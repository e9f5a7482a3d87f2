"""The fleet's series as Prometheus holds them after scraping every node's ``gpumon exporter``
(native profile), written as OpenMetrics text for ``promtool tsdb create-blocks-from openmetrics``.

Only the families the controller's queries read are written (``gpumon_gpu_info``, temperature,
memory utilization, ECC, row-remap failure, recovery action, Xids, health and its reasons, and
the pod series its placement query groups): the exporter's other families (clocks, power,
NVLink, ...) sit under other metric names, which a selector by name never touches; they would
make the TSDB larger, not the answers. Each series carries the exporter's labels and the two
Prometheus adds to a static target (``instance``, ``job``), with samples at
:data:`bench.fleet_model.SCRAPES` before ``at``. The text is streamed: a 65,000-node fleet's is
gigabytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TextIO

from bench.fleet_model import (
    GPUS_PER_NODE,
    JOB,
    NAMESPACE,
    SCRAPES,
    Fault,
    Fleet,
    Marks,
    gpu_uuid,
    instance,
    node_name,
    pod_name,
    temperature,
)
from gpumon.gpu.model import HealthState, RecoveryAction

MODEL = "NVIDIA H100 80GB HBM3"
DRIVER = "550.54.15"
CUDA = "12.4"


Values = tuple[float, ...]  # one per scrape, the last ones' when shorter
# A family's series of one GPU: (labels beyond the GPU's, values), from the GPU's index and
# number, its fault, and the number of scrapes.
PerGpu = Callable[[int, int, Fault | None, int], Iterator[tuple[str, Values]]]


def _info(g: int, number: int, fault: Fault | None, n: int) -> Iterator[tuple[str, Values]]:
    bus = f"00000000:{0x18 + 16 * g:02X}:00.0"
    yield f',model="{MODEL}",pci_bus_id="{bus}",driver_version="{DRIVER}",cuda_version="{CUDA}"', (1,) * n


def _temperature(g: int, number: int, fault: Fault | None, n: int) -> Iterator[tuple[str, Values]]:
    base = temperature(number)
    hot = fault.temperature if fault is not None else None
    yield ',sensor="gpu"', tuple(hot or base + k for k in range(n))
    yield ',sensor="memory"', tuple(base + 4 + k for k in range(n))


def _memory_utilization(g: int, number: int, fault: Fault | None, n: int) -> Iterator[tuple[str, Values]]:
    yield "", ((number * 37 % 100) / 100,) * n


def _ecc(g: int, number: int, fault: Fault | None, n: int) -> Iterator[tuple[str, Values]]:
    yield ',type="corrected"', (number % 3,) * n
    yield ',type="uncorrected"', (fault.ecc_uncorrected if fault is not None else 0,) * n


def _remap_failure(g: int, number: int, fault: Fault | None, n: int) -> Iterator[tuple[str, Values]]:
    yield "", (int(fault is not None and fault.row_remap_failure),) * n


def _recovery(g: int, number: int, fault: Fault | None, n: int) -> Iterator[tuple[str, Values]]:
    action = fault.recovery if fault is not None else RecoveryAction.NONE
    for a in RecoveryAction:
        yield f',action="{a.label}"', (int(a is action),) * n


def _health(g: int, number: int, fault: Fault | None, n: int) -> Iterator[tuple[str, Values]]:
    state = fault.state if fault is not None else HealthState.HEALTHY
    for s in HealthState:
        yield f',state="{s.value}"', (int(s is state),) * n


def _health_info(g: int, number: int, fault: Fault | None, n: int) -> Iterator[tuple[str, Values]]:
    yield (
        (',reason="",detail=""' if fault is None else f',reason="{fault.reason}",detail="{fault.kind}"'),
        (1,) * n,
    )


# (family, type, its samples' name, whether a lost GPU has it, its series): a lost GPU's
# readings cannot be trusted, so the exporter leaves them out (catalog_native).
_GPU_FAMILIES: tuple[tuple[str, str, str, bool, PerGpu], ...] = (
    ("gpumon_gpu_info", "gauge", "gpumon_gpu_info", True, _info),
    ("gpumon_gpu_temperature_celsius", "gauge", "gpumon_gpu_temperature_celsius", False, _temperature),
    ("gpumon_gpu_memory_utilization_ratio", "gauge", "gpumon_gpu_memory_utilization_ratio", False,
     _memory_utilization),
    ("gpumon_gpu_ecc_errors", "counter", "gpumon_gpu_ecc_errors_total", False, _ecc),
    ("gpumon_gpu_row_remap_failure", "gauge", "gpumon_gpu_row_remap_failure", False, _remap_failure),
    ("gpumon_gpu_recovery_action", "gauge", "gpumon_gpu_recovery_action", False, _recovery),
)  # fmt: skip
_HEALTH_FAMILIES: tuple[tuple[str, str, str, bool, PerGpu], ...] = (
    ("gpumon_gpu_health", "gauge", "gpumon_gpu_health", True, _health),
    ("gpumon_gpu_health_info", "gauge", "gpumon_gpu_health_info", True, _health_info),
)


def _pod_values(name: str, number: int, n: int) -> tuple[str, Values]:
    if name == "gpumon_pod_gpu_allocated":
        return ',resource="nvidia.com/gpu"', (1,) * n
    if name == "gpumon_pod_gpu_memory_used_bytes":
        return "", (float((number % 64 + 8) << 30),) * n
    return "", tuple((number * 13 + k) % 100 / 100 for k in range(n))


def _gpus(nodes: range) -> Iterator[tuple[int, int, int, str]]:
    """(node, GPU index, GPU number, the labels every series of that GPU has)."""
    for i in nodes:
        node, target = node_name(i), instance(i)
        for g in range(GPUS_PER_NODE):
            labels = f'node="{node}",gpu="{g}",uuid="{gpu_uuid(i, g)}",instance="{target}",job="{JOB}"'
            yield i, g, i * GPUS_PER_NODE + g, labels


def write_openmetrics(fleet: Fleet, marks: Marks, at: float, out: TextIO, nodes: range | None = None) -> int:
    """Write the series of the fleet's ``nodes`` (default: all), scraped at ``at`` +
    :data:`SCRAPES`; returns how many series."""
    nodes = range(fleet.nodes) if nodes is None else nodes
    times = tuple(f"{at + s:.3f}" for s in SCRAPES)
    n = len(times)
    count = 0

    def series(name: str, labels: str, values: Values) -> None:
        nonlocal count
        count += 1
        out.write(
            "".join(
                f"{name}{{{labels}}} {v:g} {t}\n" for v, t in zip(values, times[-len(values) :], strict=True)
            )
        )

    def per_gpu(families: tuple[tuple[str, str, str, bool, PerGpu], ...]) -> None:
        for family, kind, name, on_lost, each in families:
            out.write(f"# TYPE {family} {kind}\n")
            for _, g, number, labels in _gpus(nodes):
                fault = marks.faults.get(number)
                if on_lost or fault is None or fault.state is not HealthState.LOST:
                    for extra, values in each(g, number, fault, n):
                        series(name, labels + extra, values)

    per_gpu(_GPU_FAMILIES)
    out.write("# TYPE gpumon_gpu_xid_errors counter\n")
    for _, _, number, labels in _gpus(nodes):
        fault = marks.faults.get(number)
        old, new = marks.old_xids.get(number), marks.new_xids.get(number) or (fault and fault.xid)
        if old:
            series("gpumon_gpu_xid_errors_total", f'{labels},xid="{old}"', (1,) * n)
        if new:
            # The exporter creates an Xid's series when the code is first seen: within the window.
            series("gpumon_gpu_xid_errors_total", f'{labels},xid="{new}"', (1,) * (n - 1))
    per_gpu(_HEALTH_FAMILIES)
    for name in (
        "gpumon_pod_gpu_memory_used_bytes",
        "gpumon_pod_gpu_utilization_ratio",
        "gpumon_pod_gpu_allocated",
    ):
        out.write(f"# TYPE {name} gauge\n")
        for i, g, number, _ in _gpus(nodes):
            extra, values = _pod_values(name, number, n)
            labels = (
                f'node="{node_name(i)}",namespace="{NAMESPACE}",pod="{pod_name(i, g)}",container="main",'
                f'gpu="{g}",uuid="{gpu_uuid(i, g)}",instance="{instance(i)}",job="{JOB}"'
            )
            series(name, labels + extra, values)
    out.write("# EOF\n")
    return count
