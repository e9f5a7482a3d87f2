"""GPM (GPU performance monitoring) of a GPU and of its MIG GPU instances, over the interval
between two slow ticks: each tick takes one sample into a buffer held for the next, so no thread
of the NVML pool sleeps between two samples. The first tick after open has no interval yet."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pynvml

from gpumon.devices.nvml.convert import GPM_METRICS, GPM_MIG_METRICS, gpu_instance_profiles, profiling
from gpumon.devices.nvml.errors import ErrorClass, classify_error
from gpumon.devices.nvml.gpu import GpmInterval, Gpu
from gpumon.devices.nvml.reads import FieldReader
from gpumon.gpu.model import MigInstance, MigProfiling, Profiling


def read_profiling(reader: FieldReader, gpu: Gpu) -> Profiling | None:
    """GPM over the interval since the previous slow tick: one sample now, held for the
    next tick, and the metrics between it and the one held from the last."""
    h = gpu.handle
    if gpu.gpm_supported is None:
        try:
            gpu.gpm_supported = bool(pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        except pynvml.NVMLError as err:
            reader.failed(gpu.index, "gpm", err.value)
            if classify_error(err.value) is not ErrorClass.UNSUPPORTED:
                return None  # ask again next tick
            gpu.gpm_supported = False
        else:
            if not gpu.gpm_supported:
                reader.not_supported(gpu.index, "gpm")
    if not gpu.gpm_supported:
        return None
    if gpu.gpm is None:
        gpu.gpm = _alloc(reader, gpu, "gpm")
        if gpu.gpm is None:
            return None
    return _tick(reader, gpu, "gpm", gpu.gpm, functools.partial(pynvml.nvmlGpmSampleGet, h), GPM_METRICS)


def read_mig_profiling(
    reader: FieldReader, gpu: Gpu, migs: Sequence[MigInstance]
) -> tuple[MigProfiling, ...]:
    """GPM per MIG GPU instance (``nvmlGpmMigSampleGet``), held between ticks like the
    whole GPU's. A GPU instance that went away has its buffers freed; a driver answering
    the call unsupported is counted once (``nvml.gpm_mig``) and not asked again."""
    profiles = gpu_instance_profiles(migs) if gpu.gpm_supported and not gpu.gpm_mig_unsupported else {}
    for gone in gpu.gpm_mig.keys() - profiles.keys():
        _free_interval(gpu.gpm_mig.pop(gone))
    out = []
    for gi, profile in sorted(profiles.items()):
        interval = gpu.gpm_mig.get(gi) or _alloc(reader, gpu, "gpm_mig")
        if interval is None:
            continue
        gpu.gpm_mig[gi] = interval
        take = functools.partial(_mig_sample, gpu, gi)
        result = _tick(reader, gpu, "gpm_mig", interval, take, GPM_MIG_METRICS)
        if gpu.gpm_mig_unsupported:
            for unused in gpu.gpm_mig.values():
                _free_interval(unused)
            gpu.gpm_mig = {}
            return ()
        if result is not None:
            out.append(MigProfiling(gi, profile, result))
    return tuple(out)


def free_samples(gpu: Gpu) -> None:
    """Give back every GPM buffer of ``gpu`` (NVML is about to shut down)."""
    for interval in (gpu.gpm, *gpu.gpm_mig.values()):
        if interval is not None:
            _free_interval(interval)
    gpu.gpm, gpu.gpm_mig = None, {}


def _mig_sample(gpu: Gpu, gpu_instance: int, sample: Any) -> Any:
    try:
        return pynvml.nvmlGpmMigSampleGet(gpu.handle, gpu_instance, sample)
    except pynvml.NVMLError as err:
        gpu.gpm_mig_unsupported = classify_error(err.value) is ErrorClass.UNSUPPORTED
        raise


def _alloc(reader: FieldReader, gpu: Gpu, source: str) -> GpmInterval | None:
    first = reader.read(gpu.index, source, pynvml.nvmlGpmSampleAlloc)
    second = None if first is None else reader.read(gpu.index, source, pynvml.nvmlGpmSampleAlloc)
    if first is None or second is None:
        if first is not None:
            reader.read(gpu.index, source, functools.partial(pynvml.nvmlGpmSampleFree, first))
        return None
    return GpmInterval((first, second))


def _tick(
    reader: FieldReader,
    gpu: Gpu,
    source: str,
    interval: GpmInterval,
    take: Callable[[Any], Any],
    metrics: Mapping[str, int],
) -> Profiling | None:
    """Sample into the free buffer with ``take``; the metrics over the interval since the
    held one, if one is held. A failed sample breaks the interval: it starts again."""
    older, newer = interval.samples[interval.older], interval.samples[1 - interval.older]
    if reader.read(gpu.index, source, functools.partial(take, newer)) is None:
        interval.held = False
        return None
    held, interval.held, interval.older = interval.held, True, 1 - interval.older
    if not held:
        return None
    request = _request(older, newer, metrics)
    if reader.read(gpu.index, source, functools.partial(pynvml.nvmlGpmMetricsGet, request)) is None:
        return None
    names = list(metrics)
    result, failed = profiling(
        (names[i], request.metrics[i].nvmlReturn, request.metrics[i].value) for i in range(len(names))
    )
    for name, code in failed.items():
        reader.failed(gpu.index, f"{source}.{name}", code)
    return result


def _request(older: Any, newer: Any, metrics: Mapping[str, int]) -> Any:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(metrics)
    request.sample1, request.sample2 = older, newer
    for i, metric in enumerate(metrics.values()):
        request.metrics[i].metricId = metric
    return request


def _free_interval(interval: GpmInterval) -> None:
    for sample in interval.samples:
        with contextlib.suppress(pynvml.NVMLError):  # freed either way: NVML shuts down or the instance went
            pynvml.nvmlGpmSampleFree(sample)
