"""An exporter's /metrics read into plain values: per sample, per GPU in nvidia-smi's terms
(:mod:`bench.device_check.smi`), the NVML sources counted ``not_supported``, the non-empty families."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

from gpumon.gpu.model import CLOCK_EVENT_REASONS

Labels = frozenset[tuple[str, str]]
Series = dict[tuple[str, Labels], float]


def parse(text: str) -> Series:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def families(text: str) -> set[str]:
    """Names of the families with at least one sample (a counter's without ``_total``)."""
    return {f.name for f in text_string_to_metric_families(text) if f.samples}


def select(series: Series, name: str, **labels: str) -> dict[Labels, float]:
    want = set(labels.items())
    return {k: v for (n, k), v in series.items() if n == name and want <= k}


def value(series: Series, name: str, **labels: str) -> float | None:
    found = select(series, name, **labels)
    return next(iter(found.values())) if len(found) == 1 else None


def not_supported(series: Series) -> set[str]:
    """The NVML sources (``fan_speed``, ``gpm.fp64_active_ratio``) counted ``not_supported``."""
    return {
        dict(k)["source"].removeprefix("nvml.")
        for k, v in select(series, "gpumon_exporter_errors_total", kind="not_supported").items()
        if v > 0
    }


# nvidia-smi's reading (smi.readings' keys) -> gpumon's series: sample name and labels.
GPU_SERIES: Mapping[str, tuple[str, Mapping[str, str]]] = {
    "memory_total_bytes": ("gpumon_gpu_memory_total_bytes", {}),
    "memory_used_bytes": ("gpumon_gpu_memory_used_bytes", {}),
    "memory_free_bytes": ("gpumon_gpu_memory_free_bytes", {}),
    "memory_reserved_bytes": ("gpumon_gpu_memory_reserved_bytes", {}),
    "utilization_ratio": ("gpumon_gpu_utilization_ratio", {}),
    "memory_utilization_ratio": ("gpumon_gpu_memory_utilization_ratio", {}),
    "encoder_utilization_ratio": ("gpumon_gpu_video_utilization_ratio", {"engine": "encoder"}),
    "decoder_utilization_ratio": ("gpumon_gpu_video_utilization_ratio", {"engine": "decoder"}),
    "temperature_gpu_celsius": ("gpumon_gpu_temperature_celsius", {"sensor": "gpu"}),
    "temperature_memory_celsius": ("gpumon_gpu_temperature_celsius", {"sensor": "memory"}),
    "power_watts": ("gpumon_gpu_power_watts", {}),
    "power_limit_watts": ("gpumon_gpu_power_limit_watts", {}),
    "sm_clock_hertz": ("gpumon_gpu_clock_hertz", {"clock": "sm"}),
    "memory_clock_hertz": ("gpumon_gpu_clock_hertz", {"clock": "memory"}),
    "pcie_replays": ("gpumon_gpu_pcie_replays_total", {}),
    "performance_state": ("gpumon_gpu_performance_state", {}),
    "ecc_corrected": ("gpumon_gpu_ecc_errors_total", {"type": "corrected"}),
    "ecc_uncorrected": ("gpumon_gpu_ecc_errors_total", {"type": "uncorrected"}),
    "remapped_rows_correctable": ("gpumon_gpu_remapped_rows", {"type": "correctable"}),
    "remapped_rows_uncorrectable": ("gpumon_gpu_remapped_rows", {"type": "uncorrectable"}),
    "row_remap_pending": ("gpumon_gpu_row_remap_pending", {}),
    "row_remap_failure": ("gpumon_gpu_row_remap_failure", {}),
    **{f"throttled.{r}": ("gpumon_gpu_throttled", {"reason": r}) for r in CLOCK_EVENT_REASONS},
}


def gpus(series: Series) -> dict[str, dict[str, str]]:
    """gpumon_gpu_info's labels per GPU, by bus id in lower case (nvidia-smi's key)."""
    return {dict(k)["pci_bus_id"].lower(): dict(k) for k in select(series, "gpumon_gpu_info")}


def gpu_values(series: Series, gpu: str) -> dict[str, float]:
    """GPU ``gpu``'s (index) readings under nvidia-smi's names; MIG instances' series left out."""
    out = {}
    for field, (name, labels) in GPU_SERIES.items():
        found = [
            v for k, v in select(series, name, gpu=gpu, **labels).items() if "gpu_instance" not in dict(k)
        ]
        if len(found) == 1:
            out[field] = found[0]
    return out
