"""The one narrow interface every source of GPUs implements (NVML, simulated).

Methods are synchronous and may block: the sampler calls them from its own thread pool with a
timeout per call, and calls :meth:`DeviceBackend.wait_xids` from one dedicated thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gpumon.gpu.model import DriverInfo, FastFields, GpuIdentity, RecoveryAction, SlowFields, XidEvent

ErrorSink = Callable[[str, str], None]
"""Called as ``sink(source, kind)`` for a failed field read that did not fail the whole read
(``source`` e.g. ``"nvml.temperature"``, ``kind`` e.g. ``"timeout"``, ``"unknown"``)."""


class BackendError(Exception):
    """Base of every error a backend raises."""


class BackendUnavailable(BackendError):
    """The library or driver cannot be used at all (not loaded, not initialised, gone).

    The sampler reports the backend down, keeps serving the last data marked stale, and
    re-opens the backend with backoff."""


class GpuLostError(BackendError):
    """This GPU is lost (``NVML_ERROR_GPU_IS_LOST``); the others are unaffected."""

    def __init__(self, index: int, detail: str = "") -> None:
        super().__init__(f"GPU {index} is lost{': ' + detail if detail else ''}")
        self.index = index


class DeviceCallError(BackendError):
    """One read of one GPU failed as a whole; ``kind`` is a short label for metrics."""

    def __init__(self, index: int, kind: str, detail: str = "") -> None:
        super().__init__(f"GPU {index}: {kind}{': ' + detail if detail else ''}")
        self.index = index
        self.kind = kind


class DeviceBackend(Protocol):
    name: str

    def open(self) -> DriverInfo:
        """Initialise (idempotent); raise :class:`BackendUnavailable` when impossible."""

    def close(self) -> None: ...

    def devices(self) -> tuple[GpuIdentity, ...]:
        """The GPUs present, in index order."""

    def read_fast(self, index: int) -> FastFields:
        """Memory, utilization, temperatures, power, energy, clocks, throttle reasons, processes."""

    def read_slow(self, index: int) -> SlowFields:
        """ECC counters, remapped rows, PCIe replays, MIG instances, the recovery action."""

    def read_recovery_action(self, index: int) -> RecoveryAction | None:
        """The driver's recovery action alone (also part of :meth:`read_slow`): asked again at
        once after an Xid, which is when it changes. None where the driver does not report it."""

    def wait_xids(self, timeout_seconds: float) -> list[XidEvent]:
        """Block up to ``timeout_seconds`` for Xid events; return those that arrived."""
