"""The dcgm profile's catalog: dcgm-exporter's field names, units and help texts
(etc/default-counters.csv), and its labels, so that dashboards and alerts written for it work
unchanged. docs/metrics.md lists every series and each deviation from dcgm-exporter.

prometheus_client's text renderer always names a counter family "<name>_total" and OpenMetrics
requires counter samples to end in "_total"; dcgm's counter fields do not, so they are typed
"unknown" (untyped in text) to keep dcgm's exact sample names, which is what queries use.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

from prometheus_client.metrics_core import Metric

from gpumon.exporter.catalog import (
    Field,
    GpmField,
    Labels,
    MemoryGetter,
    SlowSamples,
    emit,
    emit_mig_memory,
    emit_mig_profiling,
    field_samples,
    from_fast,
    from_slow,
    gpm_fields,
    memory_fields,
    mig_profiling,
    migs,
    one,
    per_gpu,
    violation,
)
from gpumon.gpu.model import (
    CLOCK_EVENT_REASONS,
    FastFields,
    GpuSample,
    MigInstance,
    PodGpuUsage,
    Profiling,
    Snapshot,
)

_MIB = 1024 * 1024


def _scaled(v: float | None, factor: float) -> float | None:
    # Rounded so that 0.29 becomes 29 %, not 28.999999999999996.
    return None if v is None else round(v * factor, 9)


def _mib(v: int | None) -> float | None:
    # dcgm reports whole MiB.
    return None if v is None else float(v // _MIB)


def _dcgm_nvlink_bandwidth(g: GpuSample) -> float | None:
    """DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL as DCGM computes it (DcgmCacheManager.cpp,
    ReadAndCacheNvLinkBandwidth): the change of the KiB counters, TX plus RX, over the interval,
    per second, divided by 1000 and truncated to a whole number."""
    rate = None if g.slow is None else g.slow.nvlink_data_bytes_per_second
    return None if rate is None else float(math.floor(rate / 1024 / 1000))


def _throttle_mask(f: FastFields) -> float | None:
    if f.throttle_reasons is None:
        return None
    return float(sum(CLOCK_EVENT_REASONS.get(r, 0) for r in f.throttle_reasons))


_DCGM_MEMORY: tuple[tuple[str, str, MemoryGetter], ...] = (
    ("DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB).", lambda m: _mib(m.total_bytes)),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", lambda m: _mib(m.free_bytes)),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda m: _mib(m.used_bytes)),
    ("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", lambda m: _mib(m.reserved_bytes)),
)

_DCGM_XID = Field(
    "DCGM_FI_DEV_XID_ERRORS",
    "gauge",
    "Value of the last XID error encountered.",
    one(lambda g: float(g.last_xid or 0)),
)

# dcgm-exporter's profiling fields: one series per GPU (and per MIG GPU instance where GPM
# measures it), in dcgm's units (ratios and bytes per second, as GPM gives them).
_DCGM_GPM: tuple[GpmField, ...] = tuple(
    GpmField(name, doc, per_gpu(get))
    for name, doc, get in (
        (
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "Ratio of time the graphics engine is active.",
            lambda p: p.graphics_active_ratio,
        ),
        (
            "DCGM_FI_PROF_SM_ACTIVE",
            "The ratio of cycles an SM has at least 1 warp assigned.",
            lambda p: p.sm_active_ratio,
        ),
        (
            "DCGM_FI_PROF_SM_OCCUPANCY",
            "The ratio of number of warps resident on an SM.",
            lambda p: p.sm_occupancy_ratio,
        ),
        (
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "Ratio of cycles the tensor (HMMA) pipe is active.",
            lambda p: p.tensor_active_ratio,
        ),
        (
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "Ratio of cycles the device memory interface is active sending or receiving data.",
            lambda p: p.dram_active_ratio,
        ),
        (
            "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
            "Ratio of cycles the fp64 pipes are active.",
            lambda p: p.fp64_active_ratio,
        ),
        (
            "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
            "Ratio of cycles the fp32 pipes are active.",
            lambda p: p.fp32_active_ratio,
        ),
        (
            "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
            "Ratio of cycles the fp16 pipes are active.",
            lambda p: p.fp16_active_ratio,
        ),
        (
            "DCGM_FI_PROF_PCIE_TX_BYTES",
            (
                "The rate of data transmitted over the PCIe bus - including both protocol headers and data"
                " payloads - in bytes per second."
            ),
            lambda p: p.pcie_tx_bytes_per_second,
        ),
        (
            "DCGM_FI_PROF_PCIE_RX_BYTES",
            (
                "The rate of data received over the PCIe bus - including both protocol headers and data"
                " payloads - in bytes per second."
            ),
            lambda p: p.pcie_rx_bytes_per_second,
        ),
        (
            "DCGM_FI_PROF_NVLINK_TX_BYTES",
            "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
            lambda p: p.nvlink_tx_bytes_per_second,
        ),
        (
            "DCGM_FI_PROF_NVLINK_RX_BYTES",
            "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
            lambda p: p.nvlink_rx_bytes_per_second,
        ),
    )
)

_DCGM_FIELDS: tuple[Field, ...] = (
    Field(
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "SM clock frequency (in MHz).",
        one(from_fast(lambda f: _scaled(f.sm_clock_hertz, 1e-6))),
    ),
    Field(
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "Memory clock frequency (in MHz).",
        one(from_fast(lambda f: _scaled(f.memory_clock_hertz, 1e-6))),
    ),
    Field(
        "DCGM_FI_DEV_MEMORY_TEMP",
        "gauge",
        "Memory temperature (in C).",
        one(from_fast(lambda f: f.temperature_memory_celsius)),
    ),
    Field(
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        "GPU temperature (in C).",
        one(from_fast(lambda f: f.temperature_gpu_celsius)),
    ),
    Field("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", one(from_fast(lambda f: f.power_watts))),
    Field(
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "gauge",
        "Power management limit (in W).",
        one(from_fast(lambda f: f.power_limit_watts)),
    ),
    Field(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "unknown",
        "Total energy consumption since boot (in mJ).",
        one(from_fast(lambda f: _scaled(f.energy_joules, 1e3))),
    ),
    Field(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "unknown",
        "Total number of PCIe retries.",
        one(from_slow(lambda s: s.pcie_replays)),
        slow=True,
    ),
    Field(
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "GPU utilization (in %).",
        one(from_fast(lambda f: _scaled(f.utilization_ratio, 100.0))),
    ),
    Field(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        one(from_fast(lambda f: _scaled(f.memory_utilization_ratio, 100.0))),
    ),
    Field(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "gauge",
        "Current clock event reasons (bitmask of nvmlClocksEventReason*).",
        one(from_fast(_throttle_mask)),
    ),
    *memory_fields(_DCGM_MEMORY),
    Field(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "unknown",
        "Total number of single-bit volatile ECC errors.",
        one(from_slow(lambda s: s.ecc_corrected)),
        slow=True,
    ),
    Field(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "unknown",
        "Total number of double-bit volatile ECC errors.",
        one(from_slow(lambda s: s.ecc_uncorrected)),
        slow=True,
    ),
    Field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "unknown",
        "Number of remapped rows for uncorrectable errors",
        one(from_slow(lambda s: s.remapped_rows_uncorrectable)),
        slow=True,
    ),
    Field(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "unknown",
        "Number of remapped rows for correctable errors",
        one(from_slow(lambda s: s.remapped_rows_correctable)),
        slow=True,
    ),
    Field(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "Whether remapping of rows has failed",
        one(from_slow(lambda s: s.row_remap_failure)),
        slow=True,
    ),
    Field(
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "gauge",
        "Whether remapping of rows is pending",
        one(from_slow(lambda s: s.row_remap_pending)),
        slow=True,
    ),
    _DCGM_XID,
    Field(
        "DCGM_FI_DEV_ENC_UTIL",
        "gauge",
        "Encoder utilization (in %).",
        one(from_slow(lambda s: _scaled(s.encoder_utilization_ratio, 100.0))),
        slow=True,
    ),
    Field(
        "DCGM_FI_DEV_DEC_UTIL",
        "gauge",
        "Decoder utilization (in %).",
        one(from_slow(lambda s: _scaled(s.decoder_utilization_ratio, 100.0))),
        slow=True,
    ),
    Field(
        "DCGM_FI_DEV_FAN_SPEED",
        "gauge",
        "Fan speed (in 0-100%).",
        one(from_slow(lambda s: _scaled(s.fan_speed_ratio, 100.0))),
        slow=True,
    ),
    Field(
        "DCGM_FI_DEV_PSTATE",
        "gauge",
        "Performance state (P-State) 0-15.",
        one(from_slow(lambda s: s.performance_state)),
        slow=True,
    ),
    *(
        Field(
            f"DCGM_FI_DEV_{name}_VIOLATION",
            "unknown",
            f"Throttling duration due to {why} (in ns).",
            one(violation(policy, nanoseconds=True)),
            slow=True,
        )
        for name, policy, why in (
            ("POWER", "power", "power constraints"),
            ("THERMAL", "thermal", "thermal constraints"),
            ("SYNC_BOOST", "sync_boost", "sync-boost constraints"),
            ("BOARD_LIMIT", "board_limit", "board limit constraints"),
            ("LOW_UTIL", "low_utilization", "low utilization"),
            ("RELIABILITY", "reliability", "reliability constraints"),
        )
    ),
    Field(
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        "gauge",
        "vGPU License status",
        one(from_slow(lambda s: s.vgpu_licensed)),
        slow=True,
    ),
    Field(
        "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
        "gauge",
        "GPU Recovery Action (see nvmlDeviceGpuRecoveryAction_t for return values)",
        one(from_slow(lambda s: s.recovery_action)),
        slow=True,
    ),
    Field(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "unknown",
        "Total number of NVLink bandwidth counters for all lanes.",
        one(_dcgm_nvlink_bandwidth),
        slow=True,
    ),
    *gpm_fields(_DCGM_GPM),
)


def dcgm_families(snap: Snapshot, slow: SlowSamples) -> list[Metric]:
    """The dcgm profile's families of ``snap``, in exposition order; the GPUs' slow samples
    come from ``slow``."""
    holders = _sole_holders(snap)
    host = {"Hostname": snap.node}
    if snap.driver is not None:
        host["DCGM_FI_DRIVER_VERSION"] = snap.driver.driver_version
    present: list[tuple[GpuSample, Labels]] = []
    lost: list[tuple[GpuSample, Labels]] = []
    mig_rows: list[tuple[MigInstance, Labels]] = []
    mig_gpm_rows: list[tuple[Profiling, Labels]] = []
    for g in snap.gpus:
        ident = g.identity
        device = {
            "gpu": str(ident.index),
            "UUID": ident.uuid,
            "pci_bus_id": ident.pci_bus_id,
            "device": f"nvidia{ident.index}",
            "modelName": ident.model,
        }
        row = (g, {**device, **host, **holders.get((ident.uuid, None), {})})
        if not g.lost:
            present.append(row)
            instance_labels = functools.partial(_dcgm_instance, device, host, holders, ident.uuid)
            mig_rows.extend((mig, instance_labels(mig.gpu_instance, mig.profile)) for mig in migs(g))
            mig_gpm_rows.extend(
                (m.profiling, instance_labels(m.gpu_instance, m.profile)) for m in mig_profiling(g)
            )
        elif g.last_xid is not None:
            # dcgm has no health family: the last Xid (79, fallen off the bus, typically) is what
            # dcgm users alert on, and it is event data, still true of a lost GPU.
            lost.append(row)
    families = emit(_DCGM_FIELDS, present, slow, "dcgm")
    emit_mig_memory(_DCGM_MEMORY, families, mig_rows)
    emit_mig_profiling(_DCGM_GPM, families, mig_gpm_rows)
    xid = families[_DCGM_FIELDS.index(_DCGM_XID)]
    for g, labels in lost:
        xid.samples.extend(field_samples(_DCGM_XID, g, labels))
    return families


def _dcgm_instance(
    device: Labels,
    host: Labels,
    holders: Mapping[tuple[str, int | None], Labels],
    uuid: str,
    gpu_instance: int,
    profile: str,
) -> Labels:
    """A MIG GPU instance's labels as dcgm-exporter writes them: the card's, the instance's
    profile and id, the host's, and the pod given that instance."""
    return {
        **device,
        "GPU_I_PROFILE": profile,
        "GPU_I_ID": str(gpu_instance),
        **host,
        **holders.get((uuid, gpu_instance), {}),
    }


def _sole_holders(snap: Snapshot) -> dict[tuple[str, int | None], Labels]:
    """pod/namespace/container labels for each device one container uses: a card (its UUID,
    None) or a MIG instance on it (the card's UUID and its GPU instance id, which is how
    dcgm-exporter tells MIG series apart: ``UUID`` stays the card's, ``GPU_I_ID`` names the
    instance).

    dcgm-exporter puts the pod assigned a device on every series of that device. A device several
    containers share keeps no pod labels, so sums over devices stay right; per-container shares are
    in the native profile's gpumon_pod_* families. A device the container holds through one DRA
    claim device also gets dcgm-exporter's ``dra_*`` labels (:func:`_dra_labels`)."""
    users: dict[tuple[str, int | None], list[PodGpuUsage]] = {}
    for p in snap.pods:
        device = (p.gpu_uuid, None if p.mig is None else p.mig.gpu_instance)
        users.setdefault(device, []).append(p)
    holders: dict[tuple[str, int | None], Labels] = {}
    for device, ps in users.items():
        if len({p.ref for p in ps}) != 1:
            continue
        p = ps[0]
        holders[device] = {
            "pod": p.ref.pod,
            "namespace": p.ref.namespace,
            "container": p.ref.container,
            **_dra_labels(p),
        }
    return holders


def _dra_labels(p: PodGpuUsage) -> Labels:
    """dcgm-exporter's labels for a device held through DRA (internal/pkg/transformation,
    kubernetes.go and const.go): the claim and the (driver, pool, device) of its allocation, and
    for a MIG device its profile and UUID. None when several claim devices give the container
    this device: one series cannot name them all."""
    if len(p.claims) != 1:
        return {}
    c = p.claims[0]
    labels = {
        "dra_claim_name": c.claim.name,
        "dra_claim_namespace": c.claim.namespace,
        "dra_driver_name": c.device.driver,
        "dra_pool_name": c.device.pool,
        "dra_device_name": c.device.device,
    }
    if p.mig is not None:
        labels |= {"dra_mig_profile": p.mig.profile, "dra_mig_device_uuid": p.mig.uuid}
    return labels
