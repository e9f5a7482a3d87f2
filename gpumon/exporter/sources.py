"""What the sampler reads besides the devices: the narrow interface of pod attribution."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gpumon.gpu.model import GpuSample, PodGpuUsage


class PodAttributor(Protocol):
    async def refresh(self) -> None:
        """Re-read slow sources (kubelet pod-resources, pod annotations) on the slow cadence.

        Must not raise: failures are counted and the last good view is kept."""

    def attribute(self, gpus: Sequence[GpuSample]) -> tuple[PodGpuUsage, ...]:
        """Map this tick's GPUs and their processes to pods; cheap, called every fast tick."""
