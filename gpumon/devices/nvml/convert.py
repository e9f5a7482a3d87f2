"""What NVML's values mean in gpumon's model: units, structs, clock event reasons, GPM and NVLink
answers, per-process utilization bookkeeping, MIG profile names, Xid events, and cards kept apart
across re-initialisations. Pure functions over nvidia-ml-py's constants and ctypes structs: the
backend (:mod:`~gpumon.devices.nvml.backend`) calls NVML and hands the answers here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pynvml

from gpumon.gpu.model import (
    CLOCK_EVENT_REASONS,
    NVLINK_ERROR_KINDS,
    GpuIdentity,
    MemoryInfo,
    MigInstance,
    ProcessSample,
    Profiling,
    RecoveryAction,
    XidEvent,
)

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
            # A GPM answer is a double computed from two samples; NaN or infinity is no reading
            # (and strict JSON cannot carry it, so the snapshot would fail whole).
            if math.isfinite(value):
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
