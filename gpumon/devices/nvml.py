"""The NVML device backend, on NVIDIA's nvidia-ml-py binding (``import pynvml``).

The functional core comes first: pure conversions from NVML's values and structs to gpumon's
model (units, clock event reasons, process utilization bookkeeping, MIG profile names, what an
NVML error means). :class:`NvmlBackend` is the imperative shell around them. Every call is
synchronous and may block: the sampler runs them in its own pool with a timeout per call and
runs :meth:`NvmlBackend.wait_xids` in one dedicated thread. docs/nvml.md lists what is read
with which call.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from gpumon.devices.backend import (
    BackendError,
    BackendUnavailable,
    DeviceCallError,
    ErrorSink,
    GpuLostError,
)
from gpumon.devices.model import (
    CLOCK_EVENT_REASONS,
    NVLINK_ERROR_KINDS,
    VIOLATION_POLICIES,
    DriverInfo,
    FastFields,
    GpuIdentity,
    MemoryInfo,
    MigInstance,
    MigProfiling,
    ProcessSample,
    Profiling,
    RecoveryAction,
    SlowFields,
    XidEvent,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

# ---------------------------------------------------------------------------------------------
# Functional core
# ---------------------------------------------------------------------------------------------

# NVML's clock event reason bits are the values of model.CLOCK_EVENT_REASONS, so one table
# names them for every backend; bits NVML adds later are left out rather than guessed at.
THROTTLE_REASONS: frozenset[str] = frozenset(CLOCK_EVENT_REASONS)


def throttle_reasons(bitmask: int) -> frozenset[str]:
    """Short names of the clock event reasons set in NVML's bitmask."""
    return frozenset(name for name, bit in CLOCK_EVENT_REASONS.items() if bitmask & bit)


def watts(milliwatts: int) -> float:
    return milliwatts / 1000.0


def joules(millijoules: int) -> float:
    return millijoules / 1000.0


def hertz(megahertz: int) -> float:
    return megahertz * 1_000_000.0


def ratio(percent: float) -> float:
    return percent / 100.0


def memory_info(mem: Any) -> MemoryInfo:
    """From ``c_nvmlMemory_v2_t`` (``used`` excludes ``reserved``) or ``c_nvmlMemory_t``
    (no reserved figure: ``used`` includes the driver's reservation)."""
    reserved = getattr(mem, "reserved", None)
    return MemoryInfo(
        total_bytes=int(mem.total),
        used_bytes=int(mem.used),
        free_bytes=int(mem.free),
        reserved_bytes=None if reserved is None else int(reserved),
    )


def cuda_version(encoded: int) -> str:
    """NVML's CUDA driver version integer (``12040``) as people write it (``12.4``)."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def text(value: str | bytes) -> str:
    """Some pynvml calls return ``bytes``, most return ``str``."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def canonical_bus_id(bus_id: str) -> str:
    """NVML's spelling of a PCI address (8 hex digits of domain, upper case), so that
    ``0000:07:00.0`` and ``00000000:07:00.0`` name one card."""
    parts = bus_id.strip().upper().split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3:
        return bus_id.strip().upper()
    domain, bus, devfn = parts
    return f"{int(domain, 16):08X}:{bus}:{devfn}"


_FIELD_VALUE_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def field_value(value: Any) -> float | None:
    """The number in a ``c_nvmlFieldValue_t`` union, read through its ``valueType``."""
    member = _FIELD_VALUE_MEMBER.get(value.valueType)
    return None if member is None else float(getattr(value.value, member))


# The GPM metrics gpumon reads, by Profiling field. NVML returns activity in percent of the
# interval between the two samples and traffic in MiB per second (its header, nvml.h).
GPM_METRICS: Mapping[str, int] = {
    "graphics_active_ratio": pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
    "sm_active_ratio": pynvml.NVML_GPM_METRIC_SM_UTIL,
    "sm_occupancy_ratio": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    "tensor_active_ratio": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    "fp64_active_ratio": pynvml.NVML_GPM_METRIC_FP64_UTIL,
    "fp32_active_ratio": pynvml.NVML_GPM_METRIC_FP32_UTIL,
    "fp16_active_ratio": pynvml.NVML_GPM_METRIC_FP16_UTIL,
    "dram_active_ratio": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
    "pcie_tx_bytes_per_second": pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
    "pcie_rx_bytes_per_second": pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
    "nvlink_tx_bytes_per_second": pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
    "nvlink_rx_bytes_per_second": pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
}
# What GPM measures per MIG GPU instance (nvmlGpmMigSampleGet): the engine and pipe activities
# and DRAM. DCGM 4.6 serves these fields for GPU-instance entities and PCIe and NVLink traffic
# for whole GPUs only (dcgm_fields.cpp: entity level GPU_CI or GPU_I, against GPU), so that is
# all gpumon asks a GPU instance for.
GPM_MIG_METRICS: Mapping[str, int] = {
    name: metric for name, metric in GPM_METRICS.items() if not name.startswith(("pcie_", "nvlink_"))
}
_MIB = 2**20


def gpm_value(field_name: str, value: float) -> float:
    """One GPM metric in gpumon's units: a ratio from NVML's percent, bytes/s from MiB/s."""
    return ratio(value) if field_name.endswith("_ratio") else value * _MIB


def profiling(results: Iterable[tuple[str, int, float]]) -> tuple[Profiling, dict[str, int]]:
    """The Profiling of one ``nvmlGpmMetricsGet`` answer, given as (field, per-metric return,
    value), and the fields that were not answered with their NVML return codes."""
    values: dict[str, float] = {}
    failed: dict[str, int] = {}
    for name, code, value in results:
        if code == pynvml.NVML_SUCCESS:
            values[name] = gpm_value(name, value)
        else:
            failed[name] = code
    return Profiling(**values), failed


# NVLink counters of nvmlDeviceGetFieldValues, read per link (scopeId = link id, nvml.h). Data is
# cumulative KiB (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_*); nvml.h defines scopeId UINT_MAX as
# "aggregate value summed up across all links", so the per-link values add up to the GPU's total.
NVLINK_DATA_FIELDS: Mapping[str, int] = {
    "tx": pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    "rx": pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
}
NVLINK_ERROR_FIELDS: Mapping[str, int] = dict(
    zip(
        NVLINK_ERROR_KINDS,
        (
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
        ),
        strict=True,
    )
)
_KIB = 1024


def nvlink_requests(links: int) -> list[tuple[int, int]]:
    """(fieldId, scopeId) of every NVLink counter on links 0..links-1, for one batched call."""
    fields = (*NVLINK_DATA_FIELDS.values(), *NVLINK_ERROR_FIELDS.values())
    return [(f, link) for link in range(links) for f in fields]


@dataclass(frozen=True, slots=True)
class NvLinkCounters:
    data_bytes: dict[str, int]  # by direction, summed over links
    errors: dict[tuple[int, str], int]  # by (link, kind)
    failed: dict[str, int]  # "nvlink.<direction or kind>": an NVML return other than success


def nvlink_counters(answers: Iterable[tuple[int, int, int, float | None]]) -> NvLinkCounters:
    """The NVLink counters of one ``nvmlDeviceGetFieldValues`` answer, given as (fieldId,
    scopeId, per-field return, value). A direction is left out unless every link answered it
    (a partial sum would read as a counter reset); an error counter is per link."""
    names = {v: k for k, v in (*NVLINK_DATA_FIELDS.items(), *NVLINK_ERROR_FIELDS.items())}
    data: dict[str, int] = {}
    errors: dict[tuple[int, str], int] = {}
    failed: dict[str, int] = {}
    for field_id, link, code, value in answers:
        name = names.get(field_id)
        if name is None:
            continue
        if code != pynvml.NVML_SUCCESS or value is None:
            failed.setdefault(f"nvlink.{name}", code)
        elif name in NVLINK_DATA_FIELDS:
            data[name] = data.get(name, 0) + int(value) * _KIB
        else:
            errors[(link, name)] = int(value)
    for key in failed:
        data.pop(key.removeprefix("nvlink."), None)
    return NvLinkCounters(data, errors, failed)


def nvlink_rate(previous: tuple[float, int] | None, now: float, total: int) -> float | None:
    """Bytes per second between two readings (time, bytes) of a cumulative total; None without
    a previous reading, with no time between the two, or when the counter went back (a reset)."""
    if previous is None:
        return None
    then, before = previous
    if now <= then or total < before:
        return None
    return (total - before) / (now - then)


def vgpu_licensed(features: Any) -> bool | None:
    """Whether a vGPU's licence is held, from a ``c_nvmlGridLicensableFeatures_v4_t``, read as
    DCGM 4.6 reads DCGM_FI_DEV_VGPU_LICENSE_STATUS (``DcgmCacheManager.cpp``): not licensed
    when the device supports no GRID licence at all, else the state of its vGPU feature
    (``featureState`` non-zero: licensed); None when it lists no vGPU feature (DCGM then stores
    no value)."""
    if not features.isGridLicenseSupported:
        return False
    listed = features.gridLicensableFeatures
    for feature in listed[: min(features.licensableFeaturesCount, len(listed))]:
        if feature.featureCode == pynvml.NVML_GRID_LICENSE_FEATURE_CODE_VGPU:
            return bool(feature.featureState)
    return None


# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, by number: nvidia-ml-py before 13 does not name it.
FI_GPU_RECOVERY_ACTION = 230


def recovery_action(value: float) -> RecoveryAction | None:
    """The field's nvmlDeviceGpuRecoveryAction_t; None for a number gpumon does not know (a
    driver newer than this table)."""
    try:
        return RecoveryAction(int(value))
    except ValueError:
        return None


def gpu_instance_profiles(instances: Iterable[MigInstance]) -> dict[int, str]:
    """Each GPU instance's profile, from its MIG devices (one per compute instance)."""
    return {m.gpu_instance: m.gpu_instance_profile or m.profile for m in instances}


def performance_state(pstate: int) -> int | None:
    """NVML's P-state (0..15); NVML_PSTATE_UNKNOWN (32) is no reading."""
    return pstate if 0 <= pstate <= 15 else None


def seconds(nanoseconds: int) -> float:
    return nanoseconds / 1e9


class ErrorClass(enum.Enum):
    UNSUPPORTED = "unsupported"  # the field is absent on this GPU or driver: say nothing
    LOST = "lost"  # this GPU is gone; the others are not
    UNAVAILABLE = "unavailable"  # the library or driver as a whole is unusable
    FAILED = "failed"  # this read failed this time: reported, the field is left out


_UNSUPPORTED_CODES = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
_UNAVAILABLE_CODES = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    }
)
# A versioned call answering one of these means "try the older version".
_TRY_OLDER_CODES = _UNSUPPORTED_CODES | {pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH}

_ERROR_NAMES: Mapping[int, str] = {
    value: name.removeprefix("NVML_ERROR_").lower()
    for name, value in vars(pynvml).items()
    if name.startswith("NVML_ERROR_") and isinstance(value, int)
}


def classify_error(code: int) -> ErrorClass:
    if code == pynvml.NVML_ERROR_GPU_IS_LOST:
        return ErrorClass.LOST
    if code in _UNSUPPORTED_CODES:
        return ErrorClass.UNSUPPORTED
    if code in _UNAVAILABLE_CODES:
        return ErrorClass.UNAVAILABLE
    return ErrorClass.FAILED


def error_kind(code: int) -> str:
    """The ``kind`` label of an NVML error: its ``NVML_ERROR_*`` name in lower case
    (``timeout``, ``unknown``, ``no_permission``, ``gpu_is_lost``, ...)."""
    return _ERROR_NAMES.get(code, f"nvml_error_{code}")


def read_failure(index: int | None, source: str, code: int) -> BackendError | tuple[str, str] | None:
    """What one failed read of ``source`` means: nothing (the field is simply absent), an
    ``(error source, kind)`` pair to report, or the exception that fails the whole read."""
    match classify_error(code):
        case ErrorClass.UNSUPPORTED:
            return None
        case ErrorClass.LOST if index is not None:
            return GpuLostError(index, f"NVML_ERROR_GPU_IS_LOST reading {source}")
        case ErrorClass.UNAVAILABLE:
            return BackendUnavailable(f"NVML became unusable: {error_kind(code)} reading {source}")
    return f"nvml.{source}", error_kind(code)


_NOT_ON_LOADER_PATH = "libnvidia-ml.so.1: cannot open shared object file"


def init_failure_message(code: int, library_path: Path | None, load_error: str | None = None) -> str:
    """One line for people when ``nvmlInit`` fails. ``load_error`` is the loader's own word
    (``dlerror``) when the library could not be loaded."""
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        if library_path is not None:
            return (
                f"NVML unavailable: loaded {library_path}, but libnvidia-ml.so.1 still cannot be "
                "opened (the file's SONAME must be libnvidia-ml.so.1)"
            )
        # pynvml says "not found" for any load failure; a file that is there but refused (not
        # an ELF, wrong architecture, a dependency missing) needs another fix than no driver.
        if load_error and not load_error.startswith(_NOT_ON_LOADER_PATH):
            return f"NVML unavailable: libnvidia-ml.so.1 is there but cannot be loaded: {load_error}"
        return (
            "NVML unavailable: libnvidia-ml.so.1 not found (no NVIDIA driver on this machine, or its "
            "library is not on the loader path: set nvml_library or LD_LIBRARY_PATH)"
        )
    reasons = {
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
        pynvml.NVML_ERROR_NO_PERMISSION: "no permission to open the GPU device files (/dev/nvidia*)",
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
            "libnvidia-ml and the kernel driver are different versions (driver upgraded, node not rebooted?)"
        ),
    }
    return f"NVML unavailable: {reasons.get(code, f'nvmlInit failed ({error_kind(code)})')}"


def fold_process_utilization(
    samples: Iterable[Any], last_seen_us: int
) -> tuple[dict[int, tuple[float, float]], int]:
    """Per pid, the mean SM and memory-controller busy ratios of the samples newer than
    ``last_seen_us`` (``c_nvmlProcessUtilizationSample_t``), and the new last-seen timestamp.

    NVML keeps a ring of samples per GPU; passing the newest timestamp seen back on the next
    call returns only what happened since, so each tick averages its own interval."""
    sums: dict[int, tuple[float, float, int]] = {}
    newest = last_seen_us
    for s in samples:
        if s.timeStamp <= last_seen_us or s.pid == 0:
            continue
        sm, mem, n = sums.get(s.pid, (0.0, 0.0, 0))
        sums[s.pid] = (sm + s.smUtil, mem + s.memUtil, n + 1)
        newest = max(newest, int(s.timeStamp))
    return {pid: (ratio(sm / n), ratio(mem / n)) for pid, (sm, mem, n) in sums.items()}, newest


def process_samples(
    compute: Sequence[Any],
    graphics: Sequence[Any],
    utilization: Mapping[int, tuple[float, float]] | None,
    *,
    mig: bool = False,
) -> tuple[ProcessSample, ...]:
    """One sample per pid from the running-process lists (``c_nvmlProcessInfo_v3_t``).

    ``utilization`` is None when per-process utilization is unsupported (ratios left out); a
    pid without new samples in it was idle (ratios 0). On a GPU in MIG mode (``mig``) each
    process carries the GPU and compute instance it runs in; elsewhere those IDs mean nothing
    (NVML writes 0xFFFFFFFF, NVIDIA's mock library 0) and are left out."""
    not_available = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
    memory: dict[int, int | None] = {}
    instances: dict[int, tuple[int | None, int | None]] = {}
    for info in (*compute, *graphics):
        used = None if info.usedGpuMemory == not_available else int(info.usedGpuMemory)
        known = memory.get(info.pid)
        # A process that is both compute and graphics is listed twice with the same memory.
        memory[info.pid] = used if known is None else max(known, used or 0)
        if mig:
            instances[info.pid] = (_instance_id(info.gpuInstanceId), _instance_id(info.computeInstanceId))
    out = []
    for pid in sorted(memory):
        sm, mem = (None, None) if utilization is None else utilization.get(pid, (0.0, 0.0))
        gi, ci = instances.get(pid, (None, None))
        out.append(
            ProcessSample(
                pid,
                memory[pid],
                sm_utilization_ratio=sm,
                memory_utilization_ratio=mem,
                gpu_instance=gi,
                compute_instance=ci,
            )
        )
    return tuple(out)


_NO_INSTANCE = 0xFFFFFFFF


def _instance_id(value: int) -> int | None:
    return None if value == _NO_INSTANCE else int(value)


def mig_memory_gb(device_memory_bytes: int, instance_memory_mb: int) -> int:
    """The "Ngb" of a MIG profile name, as NVIDIA's tools round it: the instance's share of the
    board, rounded up to eighths, times the board's size in whole GiB."""
    eighths = math.ceil(instance_memory_mb * 2**20 * 8 / device_memory_bytes) / 8
    return round(eighths * math.ceil(device_memory_bytes / 2**30))


def mig_profile_name(
    *, gi_slices: int, ci_slices: int, instance_memory_mb: int, device_memory_bytes: int
) -> str:
    """``3g.20gb`` for a compute instance spanning its GPU instance, ``1c.3g.20gb`` otherwise."""
    name = f"{gi_slices}g.{mig_memory_gb(device_memory_bytes, instance_memory_mb)}gb"
    return name if ci_slices in (0, gi_slices) else f"{ci_slices}c.{name}"


def xid_event(event_type: int, event_data: int, uuid: str, index: int | None, now: float) -> XidEvent | None:
    """An Xid from one ``c_nvmlEventData_t`` (its ``eventData`` is the Xid); None for other
    event types."""
    if not event_type & pynvml.nvmlEventTypeXidCriticalError:
        return None
    return XidEvent(uuid=uuid, xid=int(event_data), timestamp=now, index=index)


def placeholder_identity(index: int) -> GpuIdentity:
    """A GPU NVML counts but whose handle or identity could not be read."""
    return GpuIdentity(index=index, uuid="", model="", pci_bus_id="")


def merge_enumeration(
    previous: Sequence[GpuIdentity], found: Sequence[GpuIdentity | int]
) -> tuple[tuple[GpuIdentity, int | None], ...]:
    """Cards keyed by PCI bus id across re-initialisations, so that series stay put when the
    driver renumbers its GPUs.

    ``found`` is this enumeration in NVML index order: an identity (carrying NVML's index), or
    the NVML index of a GPU that could not be read. Returns every GPU in gpumon index order
    with the NVML index it was found at, or None for a previously known card that is gone:

    - a known card keeps the index it first had, present or not;
    - a new card takes NVML's index if no known card holds it, else the next free one;
    - an unreadable GPU gets a placeholder at NVML's index, unless a known card is missing
      (that card already stands for it) or the index is taken.
    """
    known = {g.pci_bus_id: g for g in previous if g.pci_bus_id}
    present = {f.pci_bus_id: f for f in found if isinstance(f, GpuIdentity)}
    out: dict[int, tuple[GpuIdentity, int | None]] = {}
    for bus_id, card in known.items():
        now = present.get(bus_id)
        out[card.index] = (card, None) if now is None else (replace(now, index=card.index), now.index)
    for bus_id, card in present.items():
        if bus_id not in known:
            index = card.index if card.index not in out else max(out) + 1
            out[index] = (replace(card, index=index), card.index)
    if not known.keys() - present.keys():
        for f in found:
            if isinstance(f, int) and f not in out:
                out[f] = (placeholder_identity(f), f)
    return tuple(out[i] for i in sorted(out))


# ---------------------------------------------------------------------------------------------
# Imperative shell
# ---------------------------------------------------------------------------------------------

_PROCESS_BUFFER = 32
_UTILIZATION_BUFFER = 128
_XID_DRAIN = 64


def _ignore(source: str, kind: str) -> None:
    """The error sink of a backend nobody asked to report to."""


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


def _address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


@dataclass(slots=True)
class _GpmInterval:
    """Two GPM sample buffers: the older one holds the previous tick's sample while ``held``,
    so that each slow tick measures the interval since the last."""

    samples: tuple[Any, Any]
    older: int = 0
    held: bool = False


@dataclass(slots=True)
class _Gpu:
    identity: GpuIdentity
    handle: Any = None  # None when the GPU could not be addressed at open()
    lost: bool = False
    unreadable: str | None = None  # error kind, when the handle is None but the GPU is not lost
    last_seen_us: int = 0  # newest per-process utilization sample taken
    # Which of a field's versioned calls this GPU answers (index into the call chain).
    variant: dict[str, int] = field(default_factory=dict)
    # GPM: None until asked; the whole GPU's interval, and each MIG GPU instance's by id
    # (not asked again once the driver answers per-instance GPM unsupported).
    gpm_supported: bool | None = None
    gpm: _GpmInterval | None = None
    gpm_mig_unsupported: bool = False
    gpm_mig: dict[int, _GpmInterval] = field(default_factory=dict)
    # NVLink: the link count, once known (0: no NVLink); the last (time, bytes both ways).
    nvlink_links: int | None = None
    nvlink_last: tuple[float, int] | None = None
    # NVML_GPU_VIRTUALIZATION_MODE_*, once read.
    virtualization_mode: int | None = None

    @property
    def index(self) -> int:
        return self.identity.index


class NvmlBackend:
    """:class:`~gpumon.devices.backend.DeviceBackend` over NVML.

    ``library_path`` loads that ``libnvidia-ml.so.1`` before ``nvmlInit`` (pynvml opens the
    library by its soname, which then resolves to the one already loaded). Field errors other
    than "not supported" go to ``errors`` as ``("nvml.<field>", kind)``. ``clock`` stamps Xid
    events (NVML's event data carries no time)."""

    name = "nvml"

    def __init__(
        self,
        library_path: Path | None = None,
        errors: ErrorSink | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._library_path = library_path
        self._errors = errors or _ignore
        self._clock = clock
        self._lock = threading.Lock()  # open/close
        self._gpus: dict[int, _Gpu] | None = None  # None while closed
        self._driver = DriverInfo("", "")
        self._known: tuple[GpuIdentity, ...] = ()  # every card seen by this process, by bus id
        self._xid_lock = threading.Lock()  # the event set and the one thread waiting on it
        self._event_set: Any = None
        self._xid_sources: dict[int, GpuIdentity] = {}  # handle address -> GPU, for event data
        self._closing = threading.Event()
        self._library: ctypes.CDLL | None = None
        # (field source, GPU index) found NOT_SUPPORTED, counted once for the process lifetime.
        self._unsupported: set[tuple[str, int]] = set()
        self._unsupported_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------

    def open(self) -> DriverInfo:
        with self._lock:
            if self._gpus is not None:
                return self._driver
            self._preload()
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as err:
                # pynvml raises inside its `except OSError`: the loader's error is the context.
                cause = err.__context__
                load_error = " ".join(str(cause).split()) if isinstance(cause, OSError) else None
                message = init_failure_message(err.value, self._library_path, load_error)
                raise BackendUnavailable(message) from err
            try:
                driver = self._read_driver()
                gpus = self._enumerate()
            except BaseException:
                _shutdown_quietly()
                raise
            self._driver, self._gpus = driver, gpus
            self._closing.clear()
            log.info(
                "NVML opened",
                extra={
                    "driver_version": driver.driver_version,
                    "cuda_version": driver.cuda_version,
                    "gpus": len(gpus),
                },
            )
            return driver

    def close(self) -> None:
        """Release NVML; a later :meth:`open` initialises it again. Waits for a running
        :meth:`wait_xids` call to return (at most its timeout), so that no thread is left
        inside NVML when it shuts down."""
        with self._lock:
            if self._gpus is None:
                return
            gpus, self._gpus = self._gpus, None
            self._closing.set()
            for gpu in gpus.values():
                _free_gpm(gpu)
            with self._xid_lock:
                if self._event_set is not None:
                    with contextlib.suppress(pynvml.NVMLError):  # NVML is going away either way
                        pynvml.nvmlEventSetFree(self._event_set)
                    self._event_set, self._xid_sources = None, {}
                _shutdown_quietly()

    def _preload(self) -> None:
        if self._library_path is None or self._library is not None:
            return
        if not self._library_path.is_file():
            raise BackendUnavailable(f"NVML unavailable: library {self._library_path} does not exist")
        try:
            self._library = ctypes.CDLL(str(self._library_path), mode=ctypes.RTLD_GLOBAL)
        except OSError as err:
            raise BackendUnavailable(f"NVML unavailable: cannot load {self._library_path}: {err}") from err

    def _read_driver(self) -> DriverInfo:
        driver = self._read(None, "driver_version", lambda: text(pynvml.nvmlSystemGetDriverVersion()))
        cuda = self._versions(
            None,
            "cuda_version",
            (pynvml.nvmlSystemGetCudaDriverVersion_v2, pynvml.nvmlSystemGetCudaDriverVersion),
            {},
        )
        nvml = self._read(None, "nvml_version", lambda: text(pynvml.nvmlSystemGetNVMLVersion()))
        return DriverInfo(driver or "", "" if cuda is None else cuda_version(cuda), nvml or "")

    def _enumerate(self) -> dict[int, _Gpu]:
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as err:
            raise BackendUnavailable(
                f"NVML unavailable: cannot count GPUs ({error_kind(err.value)})"
            ) from err
        found: list[GpuIdentity | int] = []
        handles: dict[int, Any] = {}
        problems: dict[int, str] = {}
        for i in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                found.append(self._identity(i, handle))
                handles[i] = handle
            except GpuLostError:
                found.append(i)
                problems[i] = error_kind(pynvml.NVML_ERROR_GPU_IS_LOST)
            except pynvml.NVMLError as err:
                outcome = read_failure(i, "identity", err.value)
                if isinstance(outcome, BackendUnavailable):
                    raise outcome from err
                if isinstance(outcome, tuple):
                    self._errors(*outcome)
                found.append(i)
                problems[i] = error_kind(err.value)
        merged = merge_enumeration(self._known, found)
        self._known = tuple(g for g, _ in merged if g.pci_bus_id)
        gpus: dict[int, _Gpu] = {}
        for identity, nvml_index in merged:
            handle = None if nvml_index is None else handles.get(nvml_index)
            problem = None
            if handle is None:
                problem = "gpu_is_lost" if nvml_index is None else problems.get(nvml_index, "gpu_is_lost")
            lost = problem == "gpu_is_lost"
            gpus[identity.index] = _Gpu(identity, handle, lost=lost, unreadable=None if lost else problem)
        return gpus

    def _identity(self, index: int, handle: Any) -> GpuIdentity:
        serial = self._read(index, "serial", lambda: text(pynvml.nvmlDeviceGetSerial(handle)))
        mig = self._read(index, "mig", lambda: pynvml.nvmlDeviceGetMigMode(handle)[0])
        return GpuIdentity(
            index=index,
            uuid=text(pynvml.nvmlDeviceGetUUID(handle)),
            model=text(pynvml.nvmlDeviceGetName(handle)),
            pci_bus_id=canonical_bus_id(text(pynvml.nvmlDeviceGetPciInfo_v3(handle).busId)),
            serial=serial or None,
            mig_mode=None if mig is None else mig == pynvml.NVML_DEVICE_MIG_ENABLE,
        )

    # -- DeviceBackend ----------------------------------------------------------------------

    def devices(self) -> tuple[GpuIdentity, ...]:
        gpus = self._open_gpus()
        return tuple(gpus[i].identity for i in sorted(gpus))

    def read_fast(self, index: int) -> FastFields:
        with self._reading(index) as gpu:
            h = gpu.handle
            memory = self._versions(
                gpu.index,
                "memory",
                (
                    lambda: memory_info(pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)),
                    lambda: memory_info(pynvml.nvmlDeviceGetMemoryInfo(h)),
                ),
                gpu.variant,
            )
            rates = self._read(gpu.index, "utilization", lambda: pynvml.nvmlDeviceGetUtilizationRates(h))
            temperature = self._versions(
                gpu.index,
                "temperature",
                (
                    lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                    lambda: pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU),
                ),
                gpu.variant,
            )
            power = self._read(gpu.index, "power", lambda: pynvml.nvmlDeviceGetPowerUsage(h))
            limit = self._read(gpu.index, "power_limit", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h))
            energy = self._read(gpu.index, "energy", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h))
            sm_clock = self._read(
                gpu.index, "sm_clock", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
            )
            mem_clock = self._read(
                gpu.index, "memory_clock", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
            )
            reasons = self._versions(
                gpu.index,
                "throttle_reasons",
                (
                    lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
                    lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h),
                ),
                gpu.variant,
            )
            return FastFields(
                memory=memory,
                utilization_ratio=None if rates is None else ratio(rates.gpu),
                memory_utilization_ratio=None if rates is None else ratio(rates.memory),
                temperature_gpu_celsius=_maybe(float, temperature),
                temperature_memory_celsius=self._memory_temperature(gpu),
                power_watts=_maybe(watts, power),
                power_limit_watts=_maybe(watts, limit),
                energy_joules=_maybe(joules, energy),
                sm_clock_hertz=_maybe(hertz, sm_clock),
                memory_clock_hertz=_maybe(hertz, mem_clock),
                throttle_reasons=_maybe(throttle_reasons, reasons),
                processes=self._processes(gpu),
            )

    def read_slow(self, index: int) -> SlowFields:
        with self._reading(index) as gpu:
            h = gpu.handle
            replays = self._read(gpu.index, "pcie_replays", lambda: pynvml.nvmlDeviceGetPcieReplayCounter(h))
            ecc_total = functools.partial(pynvml.nvmlDeviceGetTotalEccErrors, h)
            volatile = pynvml.NVML_VOLATILE_ECC
            corrected = self._read(
                gpu.index,
                "ecc",
                functools.partial(ecc_total, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, volatile),
            )
            uncorrected = self._read(
                gpu.index,
                "ecc",
                functools.partial(ecc_total, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, volatile),
            )
            rows = self._read(gpu.index, "remapped_rows", lambda: pynvml.nvmlDeviceGetRemappedRows(h))
            migs = self._mig_instances(gpu)
            correctable, uncorrectable, pending, failure = (None,) * 4 if rows is None else rows
            encoder = self._read(
                gpu.index, "encoder_utilization", lambda: pynvml.nvmlDeviceGetEncoderUtilization(h)
            )
            decoder = self._read(
                gpu.index, "decoder_utilization", lambda: pynvml.nvmlDeviceGetDecoderUtilization(h)
            )
            fan = self._read(gpu.index, "fan_speed", lambda: pynvml.nvmlDeviceGetFanSpeed(h))
            pstate = self._read(
                gpu.index, "performance_state", lambda: pynvml.nvmlDeviceGetPerformanceState(h)
            )
            return SlowFields(
                pcie_replays=replays,
                ecc_corrected=corrected,
                ecc_uncorrected=uncorrected,
                remapped_rows_correctable=correctable,
                remapped_rows_uncorrectable=uncorrectable,
                row_remap_pending=_maybe(bool, pending),
                row_remap_failure=_maybe(bool, failure),
                mig_instances=migs,
                profiling=self._profiling(gpu),
                mig_profiling=self._mig_profiling(gpu, migs),
                # Both answer [utilization %, sampling period in us].
                encoder_utilization_ratio=None if encoder is None else ratio(encoder[0]),
                decoder_utilization_ratio=None if decoder is None else ratio(decoder[0]),
                fan_speed_ratio=_maybe(ratio, fan),
                performance_state=None if pstate is None else performance_state(pstate),
                violation_seconds=self._violations(gpu),
                vgpu_licensed=self._vgpu_licensed(gpu),
                recovery_action=self._recovery_action(gpu),
                **self._nvlink(gpu),
            )

    def read_recovery_action(self, index: int) -> RecoveryAction | None:
        with self._reading(index) as gpu:
            return self._recovery_action(gpu)

    def wait_xids(self, timeout_seconds: float) -> list[XidEvent]:
        with self._xid_lock:
            gpus = self._open_gpus()
            if self._event_set is None:
                self._event_set, self._xid_sources = self._create_event_set(gpus)
            if not self._xid_sources:
                self._closing.wait(timeout_seconds)  # nothing to wait on: keep the caller's pace
                return []
            try:
                data = pynvml.nvmlEventSetWait_v2(self._event_set, max(0, int(timeout_seconds * 1000)))
            except pynvml.NVMLError as err:
                return self._wait_failed(err.value, timeout_seconds)
            events = [data]
            # Whatever else is already queued comes out now, not one wait later.
            for _ in range(_XID_DRAIN):
                try:
                    events.append(pynvml.nvmlEventSetWait_v2(self._event_set, 0))
                except pynvml.NVMLError:
                    break
            now = self._clock()
            out = []
            for e in events:
                uuid, index = self._event_source(e.device, gpus)
                xid = xid_event(e.eventType, e.eventData, uuid, index, now)
                if xid is not None:
                    out.append(xid)
            return out

    # -- helpers ------------------------------------------------------------------------------

    def _open_gpus(self) -> dict[int, _Gpu]:
        gpus = self._gpus
        if gpus is None:
            raise BackendUnavailable("NVML is not open")
        return gpus

    @contextlib.contextmanager
    def _reading(self, index: int) -> Iterator[_Gpu]:
        """The GPU to read; a GPU found lost stays lost (and is not called again) until the
        next :meth:`open`."""
        gpu = self._open_gpus().get(index)
        if gpu is None:
            raise DeviceCallError(index, "not_found", "no such GPU")
        if gpu.lost:
            raise GpuLostError(index)
        if gpu.handle is None:
            raise DeviceCallError(
                index, gpu.unreadable or "unknown", "GPU could not be addressed when NVML opened"
            )
        try:
            yield gpu
        except GpuLostError:
            gpu.lost = True
            raise

    def _failed(self, index: int | None, source: str, code: int) -> None:
        outcome = read_failure(index, source, code)
        if isinstance(outcome, BackendError):
            raise outcome
        if outcome is not None:
            self._errors(*outcome)
        elif index is not None:
            self._not_supported(index, source)

    def _not_supported(self, index: int, source: str) -> None:
        """A field this GPU lacks: counted once per field and GPU for the process lifetime (a
        re-open asks again, and is answered the same), never logged, never exported as 0."""
        with self._unsupported_lock:
            if (source, index) in self._unsupported:
                return
            self._unsupported.add((source, index))
        self._errors(f"nvml.{source}", "not_supported")

    def _read(self, index: int | None, source: str, call: Callable[[], T]) -> T | None:
        """One field of GPU ``index`` (None: of the system); None when it cannot be read."""
        try:
            return call()
        except pynvml.NVMLError as err:
            self._failed(index, source, err.value)
            return None

    def _versions(
        self, index: int | None, source: str, calls: Sequence[Callable[[], T]], variant: dict[str, int]
    ) -> T | None:
        """The first of a field's calls (newest version first) that is answered, remembered in
        ``variant`` so that later reads go straight to it."""
        for i in range(variant.get(source, 0), len(calls)):
            try:
                value = calls[i]()
            except pynvml.NVMLError as err:
                if err.value in _TRY_OLDER_CODES and i + 1 < len(calls):
                    continue
                self._failed(index, source, err.value)
                return None
            variant[source] = i
            return value
        return None

    def _memory_temperature(self, gpu: _Gpu) -> float | None:
        values = self._read(
            gpu.index,
            "memory_temperature",
            lambda: pynvml.nvmlDeviceGetFieldValues(gpu.handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP]),
        )
        if values is None:
            return None
        if values[0].nvmlReturn != pynvml.NVML_SUCCESS:
            self._failed(gpu.index, "memory_temperature", values[0].nvmlReturn)
            return None
        return field_value(values[0])

    def _recovery_action(self, gpu: _Gpu) -> RecoveryAction | None:
        values = self._field_values(gpu, "recovery_action", [FI_GPU_RECOVERY_ACTION])
        if values is None:
            return None
        action = recovery_action(values[0])
        if action is None:
            self._errors("nvml.recovery_action", "unknown_value")
        return action

    def _violations(self, gpu: _Gpu) -> dict[str, float]:
        out = {}
        for policy, value in VIOLATION_POLICIES.items():
            got = self._read(
                gpu.index,
                f"violation.{policy}",
                functools.partial(pynvml.nvmlDeviceGetViolationStatus, gpu.handle, value),
            )
            if got is not None:
                out[policy] = seconds(got.violationTime)
        return out

    def _nvlink(self, gpu: _Gpu) -> dict[str, Any]:
        """The NVLink counters of every link, in one nvmlDeviceGetFieldValues call."""
        if gpu.nvlink_links is None:
            links = self._field_values(gpu, "nvlink", [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
            if links is None:
                return {}
            gpu.nvlink_links = int(links[0])
            if not gpu.nvlink_links:
                self._not_supported(gpu.index, "nvlink")
        if not gpu.nvlink_links:
            return {}
        requests = nvlink_requests(gpu.nvlink_links)
        values = self._read(
            gpu.index, "nvlink", functools.partial(pynvml.nvmlDeviceGetFieldValues, gpu.handle, requests)
        )
        if values is None:
            gpu.nvlink_last = None
            return {}
        got = nvlink_counters(
            (f, link, values[i].nvmlReturn, field_value(values[i])) for i, (f, link) in enumerate(requests)
        )
        for source, code in got.failed.items():
            self._failed(gpu.index, source, code)
        rate = None
        if len(got.data_bytes) == len(NVLINK_DATA_FIELDS):
            now, total = time.monotonic(), sum(got.data_bytes.values())
            rate = nvlink_rate(gpu.nvlink_last, now, total)
            gpu.nvlink_last = (now, total)
        else:
            gpu.nvlink_last = None
        return {
            "nvlink_data_bytes": got.data_bytes,
            "nvlink_data_bytes_per_second": rate,
            "nvlink_errors": got.errors,
        }

    def _field_values(self, gpu: _Gpu, source: str, fields: Sequence[int]) -> list[float] | None:
        """Device-wide fields (scopeId 0) in one call; None when any is not answered."""
        values = self._read(
            gpu.index, source, functools.partial(pynvml.nvmlDeviceGetFieldValues, gpu.handle, list(fields))
        )
        if values is None:
            return None
        out = []
        for v in values:
            number = field_value(v)
            if v.nvmlReturn != pynvml.NVML_SUCCESS or number is None:
                self._failed(gpu.index, source, v.nvmlReturn)
                return None
            out.append(number)
        return out

    def _profiling(self, gpu: _Gpu) -> Profiling | None:
        """GPM over the interval since the previous slow tick: one sample now, held for the
        next tick, and the metrics between it and the one held from the last. No sleeping
        between two samples, so the NVML pool's thread is free at once; the first tick after
        open has no interval yet."""
        h = gpu.handle
        if gpu.gpm_supported is None:
            try:
                gpu.gpm_supported = bool(pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
            except pynvml.NVMLError as err:
                self._failed(gpu.index, "gpm", err.value)
                if classify_error(err.value) is not ErrorClass.UNSUPPORTED:
                    return None  # ask again next tick
                gpu.gpm_supported = False
            else:
                if not gpu.gpm_supported:
                    self._not_supported(gpu.index, "gpm")
        if not gpu.gpm_supported:
            return None
        if gpu.gpm is None:
            gpu.gpm = self._gpm_alloc(gpu, "gpm")
            if gpu.gpm is None:
                return None
        return self._gpm_tick(gpu, "gpm", gpu.gpm, functools.partial(pynvml.nvmlGpmSampleGet, h), GPM_METRICS)

    def _mig_profiling(self, gpu: _Gpu, migs: Sequence[MigInstance]) -> tuple[MigProfiling, ...]:
        """GPM per MIG GPU instance (``nvmlGpmMigSampleGet``), held between ticks like the
        whole GPU's. A GPU instance that went away has its buffers freed; a driver answering
        the call unsupported is counted once (``nvml.gpm_mig``) and not asked again."""
        profiles = gpu_instance_profiles(migs) if gpu.gpm_supported and not gpu.gpm_mig_unsupported else {}
        for gone in gpu.gpm_mig.keys() - profiles.keys():
            _free_gpm_interval(gpu.gpm_mig.pop(gone))
        out = []
        for gi, profile in sorted(profiles.items()):
            interval = gpu.gpm_mig.get(gi) or self._gpm_alloc(gpu, "gpm_mig")
            if interval is None:
                continue
            gpu.gpm_mig[gi] = interval
            take = functools.partial(self._gpm_mig_sample, gpu, gi)
            result = self._gpm_tick(gpu, "gpm_mig", interval, take, GPM_MIG_METRICS)
            if gpu.gpm_mig_unsupported:
                for unused in gpu.gpm_mig.values():
                    _free_gpm_interval(unused)
                gpu.gpm_mig = {}
                return ()
            if result is not None:
                out.append(MigProfiling(gi, profile, result))
        return tuple(out)

    @staticmethod
    def _gpm_mig_sample(gpu: _Gpu, gpu_instance: int, sample: Any) -> Any:
        try:
            return pynvml.nvmlGpmMigSampleGet(gpu.handle, gpu_instance, sample)
        except pynvml.NVMLError as err:
            gpu.gpm_mig_unsupported = classify_error(err.value) is ErrorClass.UNSUPPORTED
            raise

    def _gpm_alloc(self, gpu: _Gpu, source: str) -> _GpmInterval | None:
        first = self._read(gpu.index, source, pynvml.nvmlGpmSampleAlloc)
        second = None if first is None else self._read(gpu.index, source, pynvml.nvmlGpmSampleAlloc)
        if first is None or second is None:
            if first is not None:
                self._read(gpu.index, source, functools.partial(pynvml.nvmlGpmSampleFree, first))
            return None
        return _GpmInterval((first, second))

    def _gpm_tick(
        self,
        gpu: _Gpu,
        source: str,
        interval: _GpmInterval,
        take: Callable[[Any], Any],
        metrics: Mapping[str, int],
    ) -> Profiling | None:
        """Sample into the free buffer with ``take``; the metrics over the interval since the
        held one, if one is held. A failed sample breaks the interval: it starts again."""
        older, newer = interval.samples[interval.older], interval.samples[1 - interval.older]
        if self._read(gpu.index, source, functools.partial(take, newer)) is None:
            interval.held = False
            return None
        held, interval.held, interval.older = interval.held, True, 1 - interval.older
        if not held:
            return None
        request = _gpm_request(older, newer, metrics)
        if self._read(gpu.index, source, functools.partial(pynvml.nvmlGpmMetricsGet, request)) is None:
            return None
        names = list(metrics)
        result, failed = profiling(
            (names[i], request.metrics[i].nvmlReturn, request.metrics[i].value) for i in range(len(names))
        )
        for name, code in failed.items():
            self._failed(gpu.index, f"{source}.{name}", code)
        return result

    def _vgpu_licensed(self, gpu: _Gpu) -> bool | None:
        """Only a vGPU guest's device (virtualization mode VGPU) has a vGPU licence to hold; on
        bare metal, passthrough and hypervisor hosts the field is absent and nothing is asked.
        The mode cannot change while the driver is loaded: it is read once per open."""
        h = gpu.handle
        if gpu.virtualization_mode is None:
            gpu.virtualization_mode = self._read(
                gpu.index, "virtualization_mode", functools.partial(pynvml.nvmlDeviceGetVirtualizationMode, h)
            )
        if gpu.virtualization_mode != pynvml.NVML_GPU_VIRTUALIZATION_MODE_VGPU:
            return None
        features = self._read(
            gpu.index, "vgpu_license", functools.partial(pynvml.nvmlDeviceGetGridLicensableFeatures_v4, h)
        )
        return None if features is None else vgpu_licensed(features)

    def _processes(self, gpu: _Gpu) -> tuple[ProcessSample, ...]:
        compute = self._read(
            gpu.index,
            "processes",
            lambda: _running_processes(gpu.handle, "nvmlDeviceGetComputeRunningProcesses_v3"),
        )
        graphics = self._read(
            gpu.index,
            "processes",
            lambda: _running_processes(gpu.handle, "nvmlDeviceGetGraphicsRunningProcesses_v3"),
        )
        if not compute and not graphics:
            return ()
        return process_samples(
            compute or (), graphics or (), self._utilization_by_pid(gpu), mig=gpu.identity.mig_mode is True
        )

    def _utilization_by_pid(self, gpu: _Gpu) -> dict[int, tuple[float, float]] | None:
        try:
            samples = _process_utilization(gpu.handle, gpu.last_seen_us)
        except pynvml.NVMLError as err:
            if err.value == pynvml.NVML_ERROR_NOT_FOUND:
                return {}  # no sample newer than the last one seen: every process was idle
            self._failed(gpu.index, "process_utilization", err.value)
            return None
        by_pid, gpu.last_seen_us = fold_process_utilization(samples, gpu.last_seen_us)
        return by_pid

    def _mig_instances(self, gpu: _Gpu) -> tuple[MigInstance, ...]:
        h = gpu.handle
        mode = self._read(gpu.index, "mig", lambda: pynvml.nvmlDeviceGetMigMode(h)[0])
        if mode != pynvml.NVML_DEVICE_MIG_ENABLE:
            return ()
        count = self._read(gpu.index, "mig", lambda: pynvml.nvmlDeviceGetMaxMigDeviceCount(h)) or 0
        total = self._read(gpu.index, "mig", lambda: pynvml.nvmlDeviceGetMemoryInfo(h).total)
        instances = []
        for i in range(count):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except pynvml.NVMLError as err:
                if err.value != pynvml.NVML_ERROR_NOT_FOUND:  # NOT_FOUND: no instance in this slot
                    self._failed(gpu.index, "mig", err.value)
                continue
            instance = self._read(gpu.index, "mig", functools.partial(_mig_instance, mig, total))
            if instance is not None:
                instances.append(instance)
        return tuple(instances)

    def _create_event_set(self, gpus: Mapping[int, _Gpu]) -> tuple[Any, dict[int, GpuIdentity]]:
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as err:
            self._failed(None, "xid", err.value)
            return None, {}
        sources: dict[int, GpuIdentity] = {}
        for gpu in gpus.values():
            if gpu.handle is None or gpu.lost:
                continue
            try:
                pynvml.nvmlDeviceRegisterEvents(gpu.handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
            except pynvml.NVMLError as err:
                if err.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                    gpu.lost = True
                else:
                    self._failed(None, "xid", err.value)
                continue
            sources[_address(gpu.handle)] = gpu.identity
        return event_set, sources

    def _wait_failed(self, code: int, timeout_seconds: float) -> list[XidEvent]:
        if code == pynvml.NVML_ERROR_TIMEOUT:
            return []
        if classify_error(code) is ErrorClass.UNAVAILABLE:
            raise BackendUnavailable(f"NVML became unusable: {error_kind(code)} waiting for Xid events")
        self._errors("nvml.xid", error_kind(code))
        if code == pynvml.NVML_ERROR_GPU_IS_LOST:
            # A lost GPU fails the whole set: build a new one without the GPUs known lost.
            with contextlib.suppress(pynvml.NVMLError):  # the set is being replaced either way
                pynvml.nvmlEventSetFree(self._event_set)
            self._event_set, self._xid_sources = None, {}
        # A failing wait returns at once; waiting out the timeout keeps the Xid thread from spinning.
        self._closing.wait(timeout_seconds)
        return []

    def _event_source(self, handle: Any, gpus: Mapping[int, _Gpu]) -> tuple[str, int | None]:
        """UUID and index of the GPU an event came from: by handle, or by UUID when NVML handed
        out another handle for the same card.

        Every handle of this open is matched, not only the registered ones: a GPU marked lost
        before the set was (re)built is not registered, and NVML cannot be asked for a lost
        GPU's UUID, yet its Xid (79, fallen off the bus) is the one that explains the loss."""
        address = _address(handle)
        known = self._xid_sources.get(address) or next(
            (g.identity for g in gpus.values() if g.handle is not None and _address(g.handle) == address),
            None,
        )
        if known is not None:
            return known.uuid, known.index
        try:
            uuid = text(pynvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError:
            return "", None
        index = next((g.identity.index for g in gpus.values() if uuid and g.identity.uuid == uuid), None)
        return uuid, index


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


def _gpm_request(older: Any, newer: Any, metrics: Mapping[str, int]) -> Any:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(metrics)
    request.sample1, request.sample2 = older, newer
    for i, metric in enumerate(metrics.values()):
        request.metrics[i].metricId = metric
    return request


def _free_gpm_interval(interval: _GpmInterval) -> None:
    for sample in interval.samples:
        with contextlib.suppress(pynvml.NVMLError):  # freed either way: NVML shuts down or the instance went
            pynvml.nvmlGpmSampleFree(sample)


def _free_gpm(gpu: _Gpu) -> None:
    for interval in (gpu.gpm, *gpu.gpm_mig.values()):
        if interval is not None:
            _free_gpm_interval(interval)
    gpu.gpm, gpu.gpm_mig = None, {}


def _maybe(convert: Callable[[Any], T], value: Any) -> T | None:
    return None if value is None else convert(value)


def _shutdown_quietly() -> None:
    with contextlib.suppress(pynvml.NVMLError):  # already gone: the driver vanished under us
        pynvml.nvmlShutdown()
