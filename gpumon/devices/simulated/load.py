"""The processes on a simulated GPU and the load they put on it: a generated workload (jobs that
come and go, a load that drifts and breathes), or the processes a test or scenario states."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpumon.devices.simulated.boards import GpuModelSpec, MiB
from gpumon.devices.simulated.noise import S_JOB, S_PROC, S_UTIL, bits, smooth_noise, unit
from gpumon.gpu.model import ProcessSample

_PROCESS_NAMES = ("python", "python3", "torchrun", "tritonserver", "vllm", "deepspeed")


@dataclass(frozen=True, slots=True)
class SimProcess:
    """A process stated to run on a simulated GPU (instead of the generated workload)."""

    pid: int
    used_memory_bytes: int
    sm_share: float  # fraction of the SM it keeps busy, 0..1
    name: str = "python"
    gpu_instance: int | None = None  # the MIG GPU instance it runs in (compute instance 0)


@dataclass(frozen=True, slots=True)
class Load:
    utilization: float
    memory_activity: float
    processes: tuple[ProcessSample, ...]
    used_memory_bytes: int


_JOB_EPOCH_SECONDS = 600.0


def generated_load(spec: GpuModelSpec, seed: int, index: int, t: float) -> Load:
    """Jobs come and go in epochs of ten minutes; within a job the load drifts and breathes."""
    offset = unit(seed, S_JOB, index, -1) * _JOB_EPOCH_SECONDS  # GPUs change jobs at different times
    epoch = math.floor((t + offset) / _JOB_EPOCH_SECONDS)
    if unit(seed, S_JOB, index, epoch) < 0.2:  # a fifth of the time a GPU sits idle
        return Load(0.0, 0.0, (), 0)
    intensity = 0.35 + 0.6 * unit(seed, S_JOB, index, epoch, 1)
    period = 20.0 + 40.0 * unit(seed, S_JOB, index, epoch, 2)  # training-step rhythm
    wave = 0.08 * math.sin(2 * math.pi * t / period + index)
    noise = 0.15 * (smooth_noise(seed, S_UTIL * 100 + index, t, 5.0) - 0.5)
    util = min(1.0, max(0.0, intensity + wave + noise))
    # Whole MiB, as NVML reports process memory.
    job_mib = int((spec.memory_mib - spec.reserved_mib) * (0.2 + 0.7 * unit(seed, S_JOB, index, epoch, 3)))
    count = 1 if unit(seed, S_PROC, index, epoch) < 0.7 else 2
    shares = (1.0,) if count == 1 else (0.7, 0.3)
    procs = tuple(
        ProcessSample(
            pid=1000 + bits(seed, S_PROC, index, epoch, n) % 4_000_000,
            used_memory_bytes=int(job_mib * share) * MiB,
            sm_utilization_ratio=round(util * share, 4),
            memory_utilization_ratio=round(util * 0.6 * share, 4),
            name=_PROCESS_NAMES[bits(seed, S_PROC, index, epoch, n, 1) % len(_PROCESS_NAMES)],
        )
        for n, share in enumerate(shares)
    )
    used = sum(p.used_memory_bytes or 0 for p in procs)
    return Load(util, util * (0.5 + 0.2 * smooth_noise(seed, S_UTIL, t, 7.0)), procs, used)


def stated_load(processes: Sequence[SimProcess]) -> Load:
    samples = tuple(
        ProcessSample(
            pid=p.pid,
            used_memory_bytes=p.used_memory_bytes,
            sm_utilization_ratio=p.sm_share,
            memory_utilization_ratio=round(p.sm_share * 0.6, 4),
            name=p.name,
            gpu_instance=p.gpu_instance,
            compute_instance=None if p.gpu_instance is None else 0,
        )
        for p in processes
    )
    util = min(1.0, sum(p.sm_share for p in processes))
    return Load(util, util * 0.6, samples, sum(p.used_memory_bytes for p in processes))
