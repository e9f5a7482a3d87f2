"""Step 2: every family gpumon can export for a GPU is either in the scrape, or explained by a
field NVML answered ``not_supported`` for (``gpumon_exporter_errors_total{kind="not_supported"}``,
docs/nvml.md "Errors"), or only exists in a situation this node is not in (a vGPU guest, an Xid
seen, a shared GPU). Anything else is missing, and a failure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpumon.exporter.exposition import family_names

# The NVML sources (docs/nvml.md, "Errors") whose not_supported leaves a family empty. A source
# ending in "." stands for all of its sub-sources (violation.power, nvlink.crc...).
_GPM = {
    "graphics_engine_active": ("graphics_active_ratio",),
    "sm_active": ("sm_active_ratio",),
    "sm_occupancy": ("sm_occupancy_ratio",),
    "pipe_active": ("tensor_active_ratio", "fp64_active_ratio", "fp32_active_ratio", "fp16_active_ratio"),
    "pipe_tensor": ("tensor_active_ratio",),
    "pipe_fp64": ("fp64_active_ratio",),
    "pipe_fp32": ("fp32_active_ratio",),
    "pipe_fp16": ("fp16_active_ratio",),
    "dram_active": ("dram_active_ratio",),
    "pcie": ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"),
    "pcie_tx": ("pcie_tx_bytes_per_second",),
    "pcie_rx": ("pcie_rx_bytes_per_second",),
    "nvlink": ("nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second"),
    "nvlink_tx": ("nvlink_tx_bytes_per_second",),
    "nvlink_rx": ("nvlink_rx_bytes_per_second",),
}


def _gpm(kind: str) -> tuple[str, ...]:
    return ("gpm", *(f"gpm.{m}" for m in _GPM[kind]))


SOURCES: Mapping[str, tuple[str, ...]] = {
    "gpumon_gpu_info": (),
    "gpumon_gpu_health": (),
    "gpumon_gpu_health_info": (),
    "DCGM_FI_DEV_XID_ERRORS": (),
    **dict.fromkeys(
        (
            "gpumon_gpu_memory_total_bytes",
            "gpumon_gpu_memory_used_bytes",
            "gpumon_gpu_memory_free_bytes",
            "gpumon_gpu_memory_reserved_bytes",
            "DCGM_FI_DEV_FB_TOTAL",
            "DCGM_FI_DEV_FB_FREE",
            "DCGM_FI_DEV_FB_USED",
            "DCGM_FI_DEV_FB_RESERVED",
        ),
        ("memory",),
    ),
    **dict.fromkeys(
        (
            "gpumon_gpu_utilization_ratio",
            "gpumon_gpu_memory_utilization_ratio",
            "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_DEV_MEM_COPY_UTIL",
        ),
        ("utilization",),
    ),
    "gpumon_gpu_temperature_celsius": ("temperature", "memory_temperature"),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature",),
    "DCGM_FI_DEV_MEMORY_TEMP": ("memory_temperature",),
    "gpumon_gpu_power_watts": ("power",),
    "DCGM_FI_DEV_POWER_USAGE": ("power",),
    "gpumon_gpu_power_limit_watts": ("power_limit",),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("power_limit",),
    "gpumon_gpu_energy_joules": ("energy",),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy",),
    "gpumon_gpu_clock_hertz": ("sm_clock", "memory_clock"),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock",),
    "DCGM_FI_DEV_MEM_CLOCK": ("memory_clock",),
    "gpumon_gpu_throttled": ("throttle_reasons",),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("throttle_reasons",),
    "gpumon_gpu_pcie_replays": ("pcie_replays",),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("pcie_replays",),
    "gpumon_gpu_ecc_errors": ("ecc",),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc",),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc",),
    **dict.fromkeys(
        (
            "gpumon_gpu_remapped_rows",
            "gpumon_gpu_row_remap_pending",
            "gpumon_gpu_row_remap_failure",
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            "DCGM_FI_DEV_ROW_REMAP_PENDING",
        ),
        ("remapped_rows",),
    ),
    "gpumon_gpu_video_utilization_ratio": ("encoder_utilization", "decoder_utilization"),
    "DCGM_FI_DEV_ENC_UTIL": ("encoder_utilization",),
    "DCGM_FI_DEV_DEC_UTIL": ("decoder_utilization",),
    "gpumon_gpu_fan_speed_ratio": ("fan_speed",),
    "DCGM_FI_DEV_FAN_SPEED": ("fan_speed",),
    "gpumon_gpu_performance_state": ("performance_state",),
    "DCGM_FI_DEV_PSTATE": ("performance_state",),
    # The driver's recovery action: absent (not_supported) on drivers before the field existed.
    "gpumon_gpu_recovery_action": ("recovery_action",),
    "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": ("recovery_action",),
    "gpumon_gpu_clock_violation_seconds": ("violation.",),
    **{
        f"DCGM_FI_DEV_{name}_VIOLATION": (f"violation.{policy}",)
        for name, policy in (
            ("POWER", "power"),
            ("THERMAL", "thermal"),
            ("SYNC_BOOST", "sync_boost"),
            ("BOARD_LIMIT", "board_limit"),
            ("LOW_UTIL", "low_utilization"),
            ("RELIABILITY", "reliability"),
        )
    },
    **dict.fromkeys(
        ("gpumon_gpu_nvlink_data_bytes", "gpumon_gpu_nvlink_errors", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"),
        ("nvlink", "nvlink."),
    ),
    "gpumon_gpu_graphics_engine_active_ratio": _gpm("graphics_engine_active"),
    "gpumon_gpu_sm_active_ratio": _gpm("sm_active"),
    "gpumon_gpu_sm_occupancy_ratio": _gpm("sm_occupancy"),
    "gpumon_gpu_pipe_active_ratio": _gpm("pipe_active"),
    "gpumon_gpu_dram_active_ratio": _gpm("dram_active"),
    "gpumon_gpu_pcie_bytes_per_second": _gpm("pcie"),
    "gpumon_gpu_nvlink_bytes_per_second": _gpm("nvlink"),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": _gpm("graphics_engine_active"),
    "DCGM_FI_PROF_SM_ACTIVE": _gpm("sm_active"),
    "DCGM_FI_PROF_SM_OCCUPANCY": _gpm("sm_occupancy"),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": _gpm("pipe_tensor"),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": _gpm("pipe_fp64"),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": _gpm("pipe_fp32"),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": _gpm("pipe_fp16"),
    "DCGM_FI_PROF_DRAM_ACTIVE": _gpm("dram_active"),
    "DCGM_FI_PROF_PCIE_TX_BYTES": _gpm("pcie_tx"),
    "DCGM_FI_PROF_PCIE_RX_BYTES": _gpm("pcie_rx"),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": _gpm("nvlink_tx"),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": _gpm("nvlink_rx"),
    # The loop's pod is attributed (step 4's node): its usage and its whole-GPU allocation.
    "gpumon_pod_gpu_memory_used_bytes": ("processes",),
    "gpumon_pod_gpu_utilization_ratio": ("process_utilization",),
    "gpumon_pod_gpu_allocated": (),
}

# Families that exist only in a situation the check's node is not in.
ONLY_WHEN: Mapping[str, str] = {
    "gpumon_gpu_xid_errors": "an Xid was received",
    "gpumon_gpu_vgpu_licensed": "the GPU is a vGPU guest's",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "the GPU is a vGPU guest's",
    "gpumon_pod_gpu_memory_allocated_bytes": "a pod holds a share of a shared GPU",
    "gpumon_pod_gpu_core_allocated_ratio": "a pod holds a share of a shared GPU",
    "gpumon_pod_gpu_unallocated_use": "a process uses a GPU its pod was not allocated",
    "gpumon_pod_dra_claim_info": "a pod holds its GPU through a DRA claim",
}


def _explains(error: str, sources: Iterable[str]) -> bool:
    return any(error.startswith(s) if s.endswith(".") else error == s for s in sources)


# The pod's own families, when no process of the check's runs on the GPU (no torch or cupy).
WITH_A_POD: Mapping[str, str] = dict.fromkeys(
    ("gpumon_pod_gpu_memory_used_bytes", "gpumon_pod_gpu_utilization_ratio", "gpumon_pod_gpu_allocated"),
    "a pod's process runs on the GPU (the load loop did not run)",
)


def classify(present: set[str], not_supported: set[str], *, pod: bool = True) -> dict[str, tuple[str, str]]:
    """family -> (state, why): ``present``, ``not_supported`` (naming the NVML sources),
    ``not_applicable`` (naming the situation) or ``missing``. ``not_supported``: the NVML
    sources (``fan_speed``, ``gpm.fp64_active_ratio``, without ``nvml.``) counted so; ``pod``:
    whether the node has a pod whose process runs on the GPU."""
    only_when = {**ONLY_WHEN, **({} if pod else WITH_A_POD)}
    out = {}
    for name in family_names("both"):
        if name in present:
            out[name] = ("present", "")
        elif name in only_when:
            out[name] = ("not_applicable", f"only when {only_when[name]}")
        elif because := sorted(e for e in not_supported if _explains(e, SOURCES[name])):
            out[name] = ("not_supported", ", ".join(because))
        else:
            out[name] = ("missing", "")
    return out
