"""The native profile's catalog: gpumon's own metric contract, in base units, ``gpumon_`` names.

Each family gpumon exports under its own names: its type, help and unit, and the model field
that feeds each series; docs/metrics.md lists them for people. The families' form and how they are built
is :mod:`~gpumon.exporter.catalog`; the writer is :mod:`~gpumon.exporter.exposition`.
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from gpumon.exporter.catalog import (
    Chunks,
    Field,
    Getter,
    GpmField,
    Labels,
    MemoryGetter,
    SlowSamples,
    add_sample,
    emit,
    emit_mig_memory,
    emit_mig_profiling,
    from_fast,
    from_slow,
    gpm_fields,
    memory_fields,
    mig_profiling,
    migs,
    new_family,
    number,
    one,
    per_gpu,
    violation,
)
from gpumon.gpu.model import (
    CLOCK_EVENT_REASONS,
    VIOLATION_POLICIES,
    XID_OTHER,
    GpuSample,
    HealthState,
    MigInstance,
    RecoveryAction,
    Snapshot,
)


def _nvlink_data(direction: str) -> Getter:
    def get(g: GpuSample) -> float | None:
        return None if g.slow is None else number(g.slow.nvlink_data_bytes.get(direction))

    return get


def _recovery_action_is(action: RecoveryAction) -> Getter:
    """One series of the one-hot: absent where the driver does not report the action."""
    return from_slow(lambda s: None if s.recovery_action is None else s.recovery_action is action)


_NATIVE_MEMORY: tuple[tuple[str, str, MemoryGetter], ...] = (
    ("gpumon_gpu_memory_total_bytes", "Framebuffer memory in total.", lambda m: m.total_bytes),
    ("gpumon_gpu_memory_used_bytes", "Framebuffer memory in use.", lambda m: m.used_bytes),
    ("gpumon_gpu_memory_free_bytes", "Framebuffer memory free.", lambda m: m.free_bytes),
    (
        "gpumon_gpu_memory_reserved_bytes",
        "Framebuffer memory reserved by the driver.",
        lambda m: m.reserved_bytes,
    ),
)

_NATIVE_GPM: tuple[GpmField, ...] = (
    *(
        GpmField(name, doc, series, "ratio")
        for name, doc, series in (
            (
                "gpumon_gpu_graphics_engine_active_ratio",
                "Fraction of the interval the graphics or compute engine was active (GPM).",
                per_gpu(lambda p: p.graphics_active_ratio),
            ),
            (
                "gpumon_gpu_sm_active_ratio",
                "Fraction of the interval the SMs had at least one warp assigned (GPM).",
                per_gpu(lambda p: p.sm_active_ratio),
            ),
            (
                "gpumon_gpu_sm_occupancy_ratio",
                "Resident warps as a fraction of the SMs' maximum (GPM).",
                per_gpu(lambda p: p.sm_occupancy_ratio),
            ),
            (
                "gpumon_gpu_pipe_active_ratio",
                "Fraction of the interval a pipe was active, by pipe (GPM).",
                (
                    ({"pipe": "tensor"}, lambda p: p.tensor_active_ratio),
                    ({"pipe": "fp64"}, lambda p: p.fp64_active_ratio),
                    ({"pipe": "fp32"}, lambda p: p.fp32_active_ratio),
                    ({"pipe": "fp16"}, lambda p: p.fp16_active_ratio),
                ),
            ),
            (
                "gpumon_gpu_dram_active_ratio",
                "Device memory bandwidth used as a fraction of its maximum (GPM).",
                per_gpu(lambda p: p.dram_active_ratio),
            ),
        )
    ),
    *(
        GpmField(name, doc, (({"direction": "tx"}, tx), ({"direction": "rx"}, rx)), "bytes_per_second")
        for name, doc, tx, rx in (
            (
                "gpumon_gpu_pcie_bytes_per_second",
                "PCIe traffic, headers included, averaged over the interval, by direction (GPM).",
                lambda p: p.pcie_tx_bytes_per_second,
                lambda p: p.pcie_rx_bytes_per_second,
            ),
            (
                "gpumon_gpu_nvlink_bytes_per_second",
                "NVLink traffic over all links, averaged over the interval, by direction (GPM).",
                lambda p: p.nvlink_tx_bytes_per_second,
                lambda p: p.nvlink_rx_bytes_per_second,
            ),
        )
    ),
)

_NATIVE_FIELDS: tuple[Field, ...] = (
    *memory_fields(_NATIVE_MEMORY, "bytes"),
    Field(
        "gpumon_gpu_utilization_ratio",
        "gauge",
        "Fraction of the sample period the SMs were busy.",
        one(from_fast(lambda f: f.utilization_ratio)),
        "ratio",
    ),
    Field(
        "gpumon_gpu_memory_utilization_ratio",
        "gauge",
        "Fraction of the sample period the memory controller was busy.",
        one(from_fast(lambda f: f.memory_utilization_ratio)),
        "ratio",
    ),
    Field(
        "gpumon_gpu_temperature_celsius",
        "gauge",
        "Temperature by sensor.",
        (
            ({"sensor": "gpu"}, from_fast(lambda f: f.temperature_gpu_celsius)),
            ({"sensor": "memory"}, from_fast(lambda f: f.temperature_memory_celsius)),
        ),
        "celsius",
    ),
    Field("gpumon_gpu_power_watts", "gauge", "Power draw.", one(from_fast(lambda f: f.power_watts)), "watts"),
    Field(
        "gpumon_gpu_power_limit_watts",
        "gauge",
        "Power management limit.",
        one(from_fast(lambda f: f.power_limit_watts)),
        "watts",
    ),
    Field(
        "gpumon_gpu_energy_joules_total",
        "counter",
        "Energy consumed since the driver was loaded.",
        one(from_fast(lambda f: f.energy_joules)),
        "joules",
    ),
    Field(
        "gpumon_gpu_clock_hertz",
        "gauge",
        "Current clock frequency by clock domain.",
        (
            ({"clock": "sm"}, from_fast(lambda f: f.sm_clock_hertz)),
            ({"clock": "memory"}, from_fast(lambda f: f.memory_clock_hertz)),
        ),
        "hertz",
    ),
    Field(
        "gpumon_gpu_pcie_replays_total",
        "counter",
        "PCIe replays (retries).",
        one(from_slow(lambda s: s.pcie_replays)),
        slow=True,
    ),
    Field(
        "gpumon_gpu_ecc_errors_total",
        "counter",
        "ECC errors since the last driver load (volatile).",
        (
            ({"type": "corrected"}, from_slow(lambda s: s.ecc_corrected)),
            ({"type": "uncorrected"}, from_slow(lambda s: s.ecc_uncorrected)),
        ),
        slow=True,
    ),
    Field(
        "gpumon_gpu_remapped_rows",
        "gauge",
        "Memory rows remapped, by the error that caused it.",
        (
            ({"type": "correctable"}, from_slow(lambda s: s.remapped_rows_correctable)),
            ({"type": "uncorrectable"}, from_slow(lambda s: s.remapped_rows_uncorrectable)),
        ),
        slow=True,
    ),
    Field(
        "gpumon_gpu_row_remap_pending",
        "gauge",
        "1 when a row remap waits for a GPU reset.",
        one(from_slow(lambda s: s.row_remap_pending)),
        slow=True,
    ),
    Field(
        "gpumon_gpu_row_remap_failure",
        "gauge",
        "1 when a row remap has failed.",
        one(from_slow(lambda s: s.row_remap_failure)),
        slow=True,
    ),
    Field(
        "gpumon_gpu_video_utilization_ratio",
        "gauge",
        "Fraction of the sample period the video engines were busy, by engine.",
        (
            ({"engine": "encoder"}, from_slow(lambda s: s.encoder_utilization_ratio)),
            ({"engine": "decoder"}, from_slow(lambda s: s.decoder_utilization_ratio)),
        ),
        "ratio",
        slow=True,
    ),
    Field(
        "gpumon_gpu_fan_speed_ratio",
        "gauge",
        "Fan speed as a fraction of its maximum.",
        one(from_slow(lambda s: s.fan_speed_ratio)),
        "ratio",
        slow=True,
    ),
    Field(
        "gpumon_gpu_performance_state",
        "gauge",
        "Performance state (P-state): 0 is the most performance, 15 the least.",
        one(from_slow(lambda s: s.performance_state)),
        slow=True,
    ),
    Field(
        "gpumon_gpu_clock_violation_seconds_total",
        "counter",
        "Time clocks were held below target by a policy, since the driver loaded.",
        tuple(({"policy": p}, violation(p)) for p in VIOLATION_POLICIES),
        "seconds",
        slow=True,
    ),
    Field(
        "gpumon_gpu_nvlink_data_bytes_total",
        "counter",
        "NVLink data (payload) bytes moved over all links since the driver loaded.",
        tuple(({"direction": d}, _nvlink_data(d)) for d in ("tx", "rx")),
        "bytes",
        slow=True,
    ),
    Field(
        "gpumon_gpu_vgpu_licensed",
        "gauge",
        "1 while the vGPU holds its licence, 0 while it does not (vGPU guests only).",
        one(from_slow(lambda s: s.vgpu_licensed)),
        slow=True,
    ),
    Field(
        "gpumon_gpu_recovery_action",
        "gauge",
        "What the driver says the GPU needs, one-hot over NVML's recovery actions.",
        tuple(({"action": a.label}, _recovery_action_is(a)) for a in RecoveryAction),
        slow=True,
    ),
    *gpm_fields(_NATIVE_GPM),
)

_POD_LABELS = ("node", "namespace", "pod", "container", "gpu", "uuid")


def native_families(snap: Snapshot, slow: SlowSamples) -> list[Metric]:
    """The native profile's families of ``snap``, in exposition order; the GPUs' slow samples
    come from ``slow``."""
    info = new_family("gpumon_gpu_info", "gauge", "GPU identity and driver versions (always 1).")
    health = new_family(
        "gpumon_gpu_health",
        "gauge",
        "The exporter's health judgement, one-hot over healthy/degraded/unhealthy/lost.",
    )
    health_info = new_family(
        "gpumon_gpu_health_info", "gauge", "Why a GPU is not healthy, one series per reason (always 1)."
    )
    throttled = new_family(
        "gpumon_gpu_throttled", "gauge", "1 while a clock event (throttle) reason is active."
    )
    xids = new_family("gpumon_gpu_xid_errors_total", "counter", "Xid errors seen since the exporter started.")
    driver = snap.driver.driver_version if snap.driver else ""
    cuda = snap.driver.cuda_version if snap.driver else ""

    present: list[tuple[GpuSample, Labels]] = []
    for g in snap.gpus:
        ident = g.identity
        base = {"node": snap.node, "gpu": str(ident.index), "uuid": ident.uuid}
        add_sample(
            info,
            {
                **base,
                "model": ident.model,
                "pci_bus_id": ident.pci_bus_id,
                "driver_version": driver,
                "cuda_version": cuda,
            },
            1,
        )
        for state in HealthState:
            add_sample(health, {**base, "state": state.value}, 1 if g.health.state is state else 0)
        for reason, detail in dict.fromkeys((r.code, r.detail) for r in g.health.reasons) or [("", "")]:
            add_sample(health_info, {**base, "reason": reason, "detail": detail}, 1)
        # Xids are events the exporter received, still true of a GPU that is lost since (79,
        # fallen off the bus, is the one that explains the loss).
        for code, count in sorted(g.xid_counts.items()):
            add_sample(xids, {**base, "xid": "other" if code == XID_OTHER else str(code)}, count)
        if g.lost:
            continue  # no reading a lost GPU gives can be trusted
        present.append((g, base))
        if g.fast is not None and g.fast.throttle_reasons is not None:
            active = g.fast.throttle_reasons
            for reason in (*CLOCK_EVENT_REASONS, *sorted(active - CLOCK_EVENT_REASONS.keys())):
                add_sample(throttled, {**base, "reason": reason}, 1 if reason in active else 0)

    per_gpu = emit(_NATIVE_FIELDS, present, slow, "native")
    nvlink_errors = new_family(
        _NVLINK_ERRORS,
        "counter",
        "NVLink data-link errors on one link since the driver loaded, by type (replay, recovery, crc).",
    )
    for g, base in present:
        if g.slow is not None:
            (chunk,) = slow.chunks("native_nvlink_errors", g, base, _nvlink_errors)
            nvlink_errors.samples.extend(chunk)
    emit_mig_memory(
        _NATIVE_MEMORY,
        per_gpu,
        ((mig, {**base, **_mig_labels(mig)}) for g, base in present for mig in migs(g)),
    )
    # A GPU instance's GPM covers all its compute instances: no compute_instance label.
    emit_mig_profiling(
        _NATIVE_GPM,
        per_gpu,
        (
            (m.profiling, {**base, "gpu_instance": str(m.gpu_instance), "mig_profile": m.profile})
            for g, base in present
            for m in mig_profiling(g)
        ),
    )
    return [info, *per_gpu, nvlink_errors, throttled, xids, health, health_info, *_native_pods(snap)]


_NVLINK_ERRORS = "gpumon_gpu_nvlink_errors_total"


def _nvlink_errors(g: GpuSample, base: Labels) -> Chunks:
    assert g.slow is not None
    return (
        tuple(
            Sample(_NVLINK_ERRORS, {**base, "link": str(link), "type": kind}, float(count))
            for (link, kind), count in sorted(g.slow.nvlink_errors.items())
        ),
    )


def _mig_labels(mig: MigInstance) -> Labels:
    return {
        "gpu_instance": str(mig.gpu_instance),
        "compute_instance": str(mig.compute_instance),
        "mig_profile": mig.profile,
    }


def _native_pods(snap: Snapshot) -> list[Metric]:
    used = new_family(
        "gpumon_pod_gpu_memory_used_bytes", "gauge", "GPU memory used by the container's processes.", "bytes"
    )
    util = new_family(
        "gpumon_pod_gpu_utilization_ratio",
        "gauge",
        "SM busy fraction of the container's processes, summed.",
        "ratio",
    )
    alloc_mem = new_family(
        "gpumon_pod_gpu_memory_allocated_bytes",
        "gauge",
        "GPU memory allocated to the container on a shared GPU.",
        "bytes",
    )
    alloc_core = new_family(
        "gpumon_pod_gpu_core_allocated_ratio",
        "gauge",
        "Share of GPU cores allocated to the container on a shared GPU.",
        "ratio",
    )
    allocated = new_family(
        "gpumon_pod_gpu_allocated",
        "gauge",
        "1 when the device is assigned whole to the container (kubelet pod-resources).",
    )
    unallocated = new_family(
        "gpumon_pod_gpu_unallocated_use",
        "gauge",
        "1 when the container's processes use a GPU no source allocated to its pod.",
    )
    claims = new_family(
        "gpumon_pod_dra_claim_info",
        "gauge",
        "The DRA ResourceClaim device that gives the container this GPU or MIG device (always 1).",
    )
    for p in snap.pods:
        labels = dict(
            zip(
                _POD_LABELS,
                (snap.node, p.ref.namespace, p.ref.pod, p.ref.container, str(p.gpu_index), p.device_uuid),
                strict=True,
            )
        )
        if p.mig is not None:
            labels |= _mig_labels(p.mig)
        for family, value in (
            (used, p.used_memory_bytes),
            (util, p.utilization_ratio),
            (alloc_mem, p.allocated_memory_bytes),
            (alloc_core, p.allocated_core_ratio),
        ):
            if value is not None:
                add_sample(family, labels, value)
        for resource in p.allocated_resources:
            add_sample(allocated, {**labels, "resource": resource}, 1)
        if p.unallocated:
            add_sample(unallocated, labels, 1)
        for c in p.claims:
            add_sample(
                claims,
                {
                    **labels,
                    "claim_namespace": c.claim.namespace,
                    "claim_name": c.claim.name,
                    "driver": c.device.driver,
                    "pool": c.device.pool,
                    "device": c.device.device,
                },
                1,
            )
    return [used, util, alloc_mem, alloc_core, allocated, unallocated, claims]


# ---------------------------------------------------------------------------------------------
# dcgm profile: dcgm-exporter's field names, units and help texts (etc/default-counters.csv).
# prometheus_client's text renderer always names a counter family "<name>_total" and OpenMetrics
