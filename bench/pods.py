"""Bench fixture: a :class:`~gpumon.exporter.sources.PodAttributor` that puts N pods on the GPUs.

The real attributor needs a kubelet pod-resources socket, a host /proc tree and the API server;
the bench needs only what the sampler hands to exposition: one :class:`PodGpuUsage` per
container and GPU, changing every tick. Pods share the GPUs evenly, as time-sliced or HAMi pods
do, each with its share of the GPU's used memory and SM time and an allocation of memory and
cores. ``attribute`` costs what the real one does on a tick: a pass over the GPUs' data with no
I/O.

With ``churn`` > 0, every tick stops the ``churn`` oldest pods and starts as many new ones, with
new names: the series of a stopped pod must leave the payload, and memory must stay flat.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpumon.gpu.model import GpuSample, PodGpuUsage, PodRef

NAMESPACES = 8


def pod_ref(serial: int) -> PodRef:
    return PodRef(
        namespace=f"team-{serial % NAMESPACES}",
        pod=f"train-{serial:06d}",
        container="main",
        uid=f"00000000-0000-4000-8000-{serial:012d}",
    )


def pod_usages(gpus: Sequence[GpuSample], first: int, count: int) -> tuple[PodGpuUsage, ...]:
    """Pods ``first`` .. ``first + count - 1``, pod ``n`` on GPU ``n % len(gpus)``."""
    if not gpus:
        return ()
    per_gpu = -(-count // len(gpus))
    out = []
    for serial in range(first, first + count):
        gpu = gpus[serial % len(gpus)]
        fast = gpu.fast
        memory = fast.memory if fast is not None else None
        out.append(
            PodGpuUsage(
                ref=pod_ref(serial),
                gpu_index=gpu.identity.index,
                gpu_uuid=gpu.identity.uuid,
                used_memory_bytes=memory.used_bytes // per_gpu if memory is not None else None,
                utilization_ratio=(
                    round(fast.utilization_ratio / per_gpu, 4)
                    if fast is not None and fast.utilization_ratio is not None
                    else None
                ),
                allocated_memory_bytes=memory.total_bytes // per_gpu if memory is not None else None,
                allocated_core_ratio=round(1 / per_gpu, 4),
            )
        )
    return tuple(out)


class BenchPods:
    """``count`` pods on the node; ``churn`` of them replaced by new pods on every tick."""

    def __init__(self, count: int = 64, churn: int = 0) -> None:
        if not 0 <= churn <= count:
            raise ValueError(f"churn must be between 0 and the pod count {count}, got {churn}")
        self.count = count
        self.churn = churn
        self._first = 0  # serial of the oldest pod running

    async def refresh(self) -> None:
        """Nothing slow to read: the pods are made up."""

    def attribute(self, gpus: Sequence[GpuSample]) -> tuple[PodGpuUsage, ...]:
        first = self._first
        self._first += self.churn
        return pod_usages(gpus, first, self.count)
