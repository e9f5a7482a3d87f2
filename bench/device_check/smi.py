"""nvidia-smi, asked only to report: the check's one view of the GPU that is not gpumon's.

The two command lines below are the only ones the check ever runs (a unit test holds them to
query flags: nothing here resets a GPU, changes MIG, clocks, persistence or power limits).
:func:`readings` turns ``nvidia-smi -q -x`` into the values gpumon also exports, in gpumon's
units, by GPU bus id; a field nvidia-smi leaves out or reports as N/A is absent.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

QUERY = ("nvidia-smi", "-q", "-x")
VERSION = ("nvidia-smi", "--version")
MiB = 2**20


def available() -> bool:
    return shutil.which(QUERY[0]) is not None


def run(argv: tuple[str, ...], timeout: float = 60.0) -> str:
    if argv not in (QUERY, VERSION):
        raise ValueError(f"the device check does not run {' '.join(argv)}")
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True).stdout


def save_query(path: Path) -> str:
    xml = run(QUERY)
    path.write_text(xml)
    return xml


_NUMBER = re.compile(r"^\s*(-?[0-9]+(?:\.[0-9]+)?)\s*(\S*)\s*$")
_SCALE = {"MiB": MiB, "W": 1.0, "C": 1.0, "MHz": 1e6, "%": 0.01, "": 1.0}


def _number(node: ET.Element | None, path: str) -> float | None:
    """The number at ``path`` in gpumon's unit (MiB -> bytes, MHz -> Hz, % -> ratio), or None
    when nvidia-smi has no such element or no number there (N/A, [Not Supported], Unknown)."""
    found = None if node is None else node.find(path)
    if found is None or found.text is None:
        return None
    m = _NUMBER.match(found.text)
    if m is None or m.group(2) not in _SCALE:
        return None
    return float(m.group(1)) * _SCALE[m.group(2)]


def _yes(node: ET.Element, path: str) -> float | None:
    found = node.find(path)
    text = None if found is None or found.text is None else found.text.strip()
    return {"Yes": 1.0, "No": 0.0, "Active": 1.0, "Not Active": 0.0}.get(text or "")


def _first(gpu: ET.Element, *paths: str) -> float | None:
    for p in paths:
        v = _number(gpu, p)
        if v is not None:
            return v
    return None


def _sum(gpu: ET.Element, *paths: str) -> float | None:
    parts = [v for v in (_number(gpu, p) for p in paths) if v is not None]
    return sum(parts) if parts else None


# nvidia-smi's reason names (R535 and later say clocks_event_reason_*, older clocks_throttle_reason_*)
# under gpumon's (model.CLOCK_EVENT_REASONS).
_REASONS = {
    "gpu_idle": "gpu_idle",
    "applications_clocks_setting": "applications_clocks_setting",
    "sw_power_cap": "sw_power_cap",
    "hw_slowdown": "hw_slowdown",
    "hw_thermal_slowdown": "hw_thermal",
    "hw_power_brake_slowdown": "hw_power_brake",
    "sync_boost": "sync_boost",
    "sw_thermal_slowdown": "sw_thermal",
    "display_clocks_setting": "display_clock_setting",
}


def readings(xml: str) -> dict[str, dict[str, float | str | None]]:
    """Per GPU (by bus id as NVML spells it), the values both nvidia-smi and gpumon report."""
    root = ET.fromstring(xml)
    out: dict[str, dict[str, float | str | None]] = {}
    for gpu in root.findall("gpu"):
        bus = (gpu.findtext("pci/pci_bus_id") or gpu.get("id") or "").strip()
        pstate = (gpu.findtext("performance_state") or "").strip()
        values: dict[str, float | str | None] = {
            "uuid": (gpu.findtext("uuid") or "").strip() or None,
            "model": (gpu.findtext("product_name") or "").strip() or None,
            "memory_total_bytes": _number(gpu, "fb_memory_usage/total"),
            "memory_used_bytes": _number(gpu, "fb_memory_usage/used"),
            "memory_free_bytes": _number(gpu, "fb_memory_usage/free"),
            "memory_reserved_bytes": _number(gpu, "fb_memory_usage/reserved"),
            "utilization_ratio": _number(gpu, "utilization/gpu_util"),
            "memory_utilization_ratio": _number(gpu, "utilization/memory_util"),
            "encoder_utilization_ratio": _number(gpu, "utilization/encoder_util"),
            "decoder_utilization_ratio": _number(gpu, "utilization/decoder_util"),
            "temperature_gpu_celsius": _number(gpu, "temperature/gpu_temp"),
            "temperature_memory_celsius": _number(gpu, "temperature/memory_temp"),
            # R565 and later split power_draw into an instant and a one-second average reading.
            "power_watts": _first(
                gpu,
                "gpu_power_readings/power_draw",
                "gpu_power_readings/average_power_draw",
                "gpu_power_readings/instant_power_draw",
                "power_readings/power_draw",
            ),
            "power_limit_watts": _first(
                gpu,
                "gpu_power_readings/enforced_power_limit",
                "gpu_power_readings/current_power_limit",
                "power_readings/enforced_power_limit",
            ),
            "sm_clock_hertz": _number(gpu, "clocks/sm_clock"),
            "memory_clock_hertz": _number(gpu, "clocks/mem_clock"),
            "pcie_replays": _number(gpu, "pci/replay_counter"),
            "performance_state": float(pstate[1:]) if re.fullmatch(r"P[0-9]+", pstate) else None,
            # Hopper and later count SRAM and DRAM apart; older boards single and double bit.
            "ecc_corrected": _first(gpu, "ecc_errors/volatile/single_bit/total")
            if gpu.find("ecc_errors/volatile/single_bit") is not None
            else _sum(gpu, "ecc_errors/volatile/sram_correctable", "ecc_errors/volatile/dram_correctable"),
            "ecc_uncorrected": _first(gpu, "ecc_errors/volatile/double_bit/total")
            if gpu.find("ecc_errors/volatile/double_bit") is not None
            else _sum(
                gpu,
                "ecc_errors/volatile/sram_uncorrectable_parity",
                "ecc_errors/volatile/sram_uncorrectable_secded",
                "ecc_errors/volatile/dram_uncorrectable",
            ),
            "remapped_rows_correctable": _number(gpu, "remapped_rows/remapped_row_corr"),
            "remapped_rows_uncorrectable": _number(gpu, "remapped_rows/remapped_row_unc"),
            "row_remap_pending": _yes(gpu, "remapped_rows/remapped_row_pending"),
            "row_remap_failure": _yes(gpu, "remapped_rows/remapped_row_failure"),
        }
        reasons = gpu.find("clocks_event_reasons")
        prefix = "clocks_event_reason_"
        if reasons is None:
            reasons, prefix = gpu.find("clocks_throttle_reasons"), "clocks_throttle_reason_"
        for smi_name, name in _REASONS.items():
            values[f"throttled.{name}"] = None if reasons is None else _yes(reasons, prefix + smi_name)
        out[_nvml_bus_id(bus)] = values
    return out


def versions(xml: str) -> dict[str, str]:
    root = ET.fromstring(xml)
    return {
        "driver_version": (root.findtext("driver_version") or "").strip(),
        "cuda_version": (root.findtext("cuda_version") or "").strip(),
    }


def processes(xml: str) -> dict[int, float | None]:
    """pid -> used memory in bytes, over every GPU, as nvidia-smi lists them."""
    root = ET.fromstring(xml)
    return {
        int(p.findtext("pid") or -1): _number(p, "used_memory")
        for p in root.iter("process_info")
        if (p.findtext("pid") or "").strip().isdigit()
    }


def _nvml_bus_id(bus: str) -> str:
    """nvidia-smi and NVML both write ``00000000:18:00.0``; their hex digits' case may differ."""
    return bus.lower()
