"""What runs on a GPU, as NVML lists it: the processes with their memory and utilization, and the
MIG devices of a GPU in MIG mode."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

import pynvml

from gpumon.devices.nvml.convert import (
    fold_process_utilization,
    memory_info,
    mig_profile_name,
    process_samples,
    text,
)
from gpumon.devices.nvml.gpu import Gpu
from gpumon.devices.nvml.reads import FieldReader
from gpumon.gpu.model import MigInstance, ProcessSample

_PROCESS_BUFFER = 32
_UTILIZATION_BUFFER = 128


def read_processes(reader: FieldReader, gpu: Gpu) -> tuple[ProcessSample, ...]:
    compute = reader.read(
        gpu.index,
        "processes",
        lambda: _running_processes(gpu.handle, "nvmlDeviceGetComputeRunningProcesses_v3"),
    )
    graphics = reader.read(
        gpu.index,
        "processes",
        lambda: _running_processes(gpu.handle, "nvmlDeviceGetGraphicsRunningProcesses_v3"),
    )
    if not compute and not graphics:
        return ()
    return process_samples(
        compute or (), graphics or (), _utilization_by_pid(reader, gpu), mig=gpu.identity.mig_mode is True
    )


def read_mig_instances(reader: FieldReader, gpu: Gpu) -> tuple[MigInstance, ...]:
    h = gpu.handle
    mode = reader.read(gpu.index, "mig", lambda: pynvml.nvmlDeviceGetMigMode(h)[0])
    if mode != pynvml.NVML_DEVICE_MIG_ENABLE:
        return ()
    count = reader.read(gpu.index, "mig", lambda: pynvml.nvmlDeviceGetMaxMigDeviceCount(h)) or 0
    total = reader.read(gpu.index, "mig", lambda: pynvml.nvmlDeviceGetMemoryInfo(h).total)
    instances = []
    for i in range(count):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
        except pynvml.NVMLError as err:
            if err.value != pynvml.NVML_ERROR_NOT_FOUND:  # NOT_FOUND: no instance in this slot
                reader.failed(gpu.index, "mig", err.value)
            continue
        instance = reader.read(gpu.index, "mig", functools.partial(_mig_instance, mig, total))
        if instance is not None:
            instances.append(instance)
    return tuple(instances)


def _utilization_by_pid(reader: FieldReader, gpu: Gpu) -> dict[int, tuple[float, float]] | None:
    try:
        samples = _process_utilization(gpu.handle, gpu.last_seen_us)
    except pynvml.NVMLError as err:
        if err.value == pynvml.NVML_ERROR_NOT_FOUND:
            return {}  # no sample newer than the last one seen: every process was idle
        reader.failed(gpu.index, "process_utilization", err.value)
        return None
    by_pid, gpu.last_seen_us = fold_process_utilization(samples, gpu.last_seen_us)
    return by_pid


def _sized_call(
    fn_name: str, element: type[ctypes.Structure], start: int, call: Callable[..., int]
) -> list[Any]:
    """Call an NVML function that fills a caller-sized array, as NVIDIA's go-nvml does: start
    with a buffer and grow it on ``INSUFFICIENT_SIZE``.

    pynvml's own wrappers first pass a NULL buffer and treat ``SUCCESS`` as "nothing to
    report"; NVIDIA's mock library answers that probe with ``SUCCESS`` and the count, so those
    wrappers would never see a process there."""
    fn = pynvml._nvmlGetFunctionPointer(fn_name)
    size = start
    for _ in range(6):
        count = ctypes.c_uint(size)
        buffer = (element * size)()
        ret = call(fn, buffer, count)
        if ret == pynvml.NVML_SUCCESS:
            return list(buffer[: min(count.value, size)])
        if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            raise pynvml.NVMLError(ret)
        size = max(2 * size, count.value + 8)
    raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)


def _running_processes(handle: Any, fn_name: str) -> list[Any]:
    return _sized_call(
        fn_name,
        pynvml.c_nvmlProcessInfo_v3_t,
        _PROCESS_BUFFER,
        lambda fn, buffer, count: fn(handle, ctypes.byref(count), buffer),
    )


def _process_utilization(handle: Any, last_seen_us: int) -> list[Any]:
    return _sized_call(
        "nvmlDeviceGetProcessUtilization",
        pynvml.c_nvmlProcessUtilizationSample_t,
        _UTILIZATION_BUFFER,
        lambda fn, buffer, count: fn(handle, buffer, ctypes.byref(count), ctypes.c_ulonglong(last_seen_us)),
    )


def _mig_instance(mig: Any, device_memory_bytes: int | None) -> MigInstance:
    attributes = pynvml.nvmlDeviceGetAttributes_v2(mig)
    memory = memory_info(pynvml.nvmlDeviceGetMemoryInfo(mig))
    profile = functools.partial(
        mig_profile_name,
        gi_slices=attributes.gpuInstanceSliceCount,
        instance_memory_mb=attributes.memorySizeMB,
        device_memory_bytes=device_memory_bytes or memory.total_bytes,
    )
    return MigInstance(
        gpu_instance=pynvml.nvmlDeviceGetGpuInstanceId(mig),
        compute_instance=pynvml.nvmlDeviceGetComputeInstanceId(mig),
        profile=profile(ci_slices=attributes.computeInstanceSliceCount),
        uuid=text(pynvml.nvmlDeviceGetUUID(mig)),
        memory=memory,
        gpu_instance_profile=profile(ci_slices=attributes.gpuInstanceSliceCount),
    )
