"""A GPU as the NVML backend holds it from one open to the next: its handle, whether it is lost,
and what it has shown it answers (which versioned call, GPM, NVLink links, virtualization), so
that each read asks only what can be answered."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpumon.gpu.model import GpuIdentity


@dataclass(slots=True)
class GpmInterval:
    """Two GPM sample buffers: the older one holds the previous tick's sample while ``held``,
    so that each slow tick measures the interval since the last."""

    samples: tuple[Any, Any]
    older: int = 0
    held: bool = False


@dataclass(slots=True)
class Gpu:
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
    gpm: GpmInterval | None = None
    gpm_mig_unsupported: bool = False
    gpm_mig: dict[int, GpmInterval] = field(default_factory=dict)
    # NVLink: the link count, once known (0: no NVLink); the last (time, bytes both ways).
    nvlink_links: int | None = None
    nvlink_last: tuple[float, int] | None = None
    # NVML_GPU_VIRTUALIZATION_MODE_*, once read.
    virtualization_mode: int | None = None

    @property
    def index(self) -> int:
        return self.identity.index
