"""The boards a simulated node can have: public datasheet figures and typical NVML readings of
each GPU model, its MIG profiles, and the driver the node reports."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpumon.gpu.model import DriverInfo

MiB = 1 << 20


class SimulationError(ValueError):
    """A request the simulation cannot honour (unknown model, no such GPU, unsupported fault)."""


@dataclass(frozen=True, slots=True)
class GpuModelSpec:
    """Public datasheet figures and typical NVML readings of one board."""

    name: str
    memory_mib: int
    reserved_mib: int  # driver/firmware reservation shown by memory info v2
    power_limit_watts: float
    idle_power_watts: float
    sm_clock_max_mhz: float
    sm_clock_idle_mhz: float
    memory_clock_mhz: float
    temperature_idle_celsius: float
    temperature_load_celsius: float
    # HBM boards report a memory temperature; GDDR boards do not (NVML NOT_SUPPORTED).
    memory_temperature_offset_celsius: float | None
    row_remapping: bool  # Ampere and later
    # MIG profile -> (slices it occupies, memory MiB); empty when the board has no MIG.
    mig_profiles: Mapping[str, tuple[int, int]] = field(default_factory=dict)


_A100_MIG = {
    "1g.10gb": (1, 9856),
    "2g.20gb": (2, 19968),
    "3g.40gb": (3, 40192),
    "4g.40gb": (4, 40192),
    "7g.80gb": (7, 80896),
}
_H100_MIG = {
    "1g.10gb": (1, 9984),
    "1g.20gb": (1, 20096),
    "2g.20gb": (2, 20096),
    "3g.40gb": (3, 40320),
    "4g.40gb": (4, 40320),
    "7g.80gb": (7, 80640),
}

MODELS: Mapping[str, GpuModelSpec] = {
    spec.name: spec
    for spec in (
        GpuModelSpec(
            "A100-SXM4-80GB", 81920, 566, 400.0, 62.0, 1410, 210, 1593, 31.0, 68.0, 6.0, True, _A100_MIG
        ),
        GpuModelSpec(
            "H100-80GB-HBM3", 81559, 590, 700.0, 72.0, 1980, 345, 2619, 30.0, 71.0, 8.0, True, _H100_MIG
        ),
        GpuModelSpec("T4", 15360, 258, 70.0, 9.5, 1590, 300, 5001, 34.0, 76.0, None, False),
        GpuModelSpec("L40S", 46068, 494, 350.0, 36.0, 2520, 210, 9001, 29.0, 72.0, None, True),
    )
}

DRIVER = DriverInfo(driver_version="550.127.05", cuda_version="12.4", nvml_version="12.550.127.05")

# Bus numbers of an 8-GPU HGX baseboard, so simulated ids look like the real thing.
HGX_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)


def model_spec(name: str) -> GpuModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise SimulationError(f"unknown GPU model {name!r} (known: {', '.join(MODELS)})") from None
