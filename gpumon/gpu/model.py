"""Frozen values describing GPUs, their processes, Xid events and health verdicts.

Purely data: no I/O, no clocks. Optional fields are ``None`` when the device does not support
the measurement (NVML ``NOT_SUPPORTED``); exposition leaves such series out rather than
inventing zeros.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpumon.k8s.dra import ClaimDevice


class HealthState(enum.StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"
    LOST = "lost"

    @property
    def rank(self) -> int:
        return _HEALTH_RANK[self]


_HEALTH_RANK = {
    HealthState.HEALTHY: 0,
    HealthState.DEGRADED: 1,
    HealthState.UNHEALTHY: 2,
    HealthState.LOST: 3,
}


class RecoveryAction(enum.IntEnum):
    """What the driver says a GPU needs to be whole again: NVML's nvmlDeviceGpuRecoveryAction_t
    (field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), with its numbers."""

    NONE = 0
    GPU_RESET = 1
    NODE_REBOOT = 2
    DRAIN_P2P = 3
    DRAIN_AND_RESET = 4
    RECOVER_IMEX_DOMAIN = 5
    BUS_RESET = 6
    SYSTEM_REBOOT = 7

    @property
    def label(self) -> str:
        """The name in metric labels and config: ``gpu_reset``."""
        return self.name.lower()

    @classmethod
    def from_label(cls, label: str) -> RecoveryAction:
        """The action a label names; ValueError for any other text."""
        action = cls.__members__.get(label.upper()) if label.islower() else None
        if action is None:
            raise ValueError(f"not a recovery action ({', '.join(a.label for a in cls)}): {label!r}")
        return action


@dataclass(frozen=True, slots=True)
class DriverInfo:
    driver_version: str
    cuda_version: str
    nvml_version: str = ""


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    index: int
    uuid: str
    model: str
    pci_bus_id: str
    serial: str | None = None
    mig_mode: bool | None = None


@dataclass(frozen=True, slots=True)
class MemoryInfo:
    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessSample:
    pid: int
    used_memory_bytes: int | None
    sm_utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    name: str | None = None
    # The MIG instance the process runs in (NVML's gpuInstanceId/computeInstanceId); None on a
    # GPU without MIG.
    gpu_instance: int | None = None
    compute_instance: int | None = None


@dataclass(frozen=True, slots=True)
class Profiling:
    """NVML GPM (GPU Performance Monitoring, Hopper and newer) over the interval between two
    samples: activity as 0-1 fractions of the interval, traffic as mean bytes per second. A
    metric the device does not offer is None."""

    graphics_active_ratio: float | None = None
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    fp64_active_ratio: float | None = None
    fp32_active_ratio: float | None = None
    fp16_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    nvlink_tx_bytes_per_second: float | None = None
    nvlink_rx_bytes_per_second: float | None = None


# NVML performance policies whose clock-limiting time nvmlDeviceGetViolationStatus reports,
# by short name, with their NVML_PERF_POLICY_* value.
VIOLATION_POLICIES: Mapping[str, int] = MappingProxyType(
    {
        "power": 0,
        "thermal": 1,
        "sync_boost": 2,
        "board_limit": 3,
        "low_utilization": 4,
        "reliability": 5,
    }
)


@dataclass(frozen=True, slots=True)
class MigInstance:
    gpu_instance: int
    compute_instance: int
    profile: str  # the compute instance's: "1c.3g.20gb" when it spans part of its GPU instance
    uuid: str
    memory: MemoryInfo | None = None
    # The GPU instance's own profile ("3g.20gb"), which its compute instances share; None when
    # the backend does not tell it apart (every compute instance spans its GPU instance).
    gpu_instance_profile: str | None = None


@dataclass(frozen=True, slots=True)
class MigProfiling:
    """GPM of one MIG GPU instance (nvmlGpmMigSampleGet): its compute instances together."""

    gpu_instance: int
    profile: str  # the GPU instance's profile, e.g. "3g.40gb"
    profiling: Profiling


# NVML clock event ("throttle") reasons by short name, with their nvmlClocksEventReason* bit.
CLOCK_EVENT_REASONS: Mapping[str, int] = MappingProxyType(
    {
        "gpu_idle": 0x1,
        "applications_clocks_setting": 0x2,
        "sw_power_cap": 0x4,
        "hw_slowdown": 0x8,
        "sync_boost": 0x10,
        "sw_thermal": 0x20,
        "hw_thermal": 0x40,
        "hw_power_brake": 0x80,
        "display_clock_setting": 0x100,
    }
)


@dataclass(frozen=True, slots=True)
class FastFields:
    """Cheap per-tick measurements (default cadence 1 s)."""

    memory: MemoryInfo | None = None
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    temperature_gpu_celsius: float | None = None
    temperature_memory_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    # Clock event reasons currently active, by short name (keys of CLOCK_EVENT_REASONS);
    # None when the device cannot report them.
    throttle_reasons: frozenset[str] | None = None
    processes: tuple[ProcessSample, ...] = ()


_EMPTY_VIOLATIONS: Mapping[str, float] = MappingProxyType({})

# NVLink data-link error counters, by gpumon's name: replays, recoveries, CRC errors.
NVLINK_ERROR_KINDS = ("replay", "recovery", "crc")


@dataclass(frozen=True, slots=True)
class SlowFields:
    """Expensive or slowly changing counters (default cadence 10 s)."""

    pcie_replays: int | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    mig_instances: tuple[MigInstance, ...] = ()
    # None until two GPM samples were taken, and on GPUs without GPM.
    profiling: Profiling | None = None
    # GPM per MIG GPU instance, once it has an interval; empty without MIG or per-instance GPM.
    mig_profiling: tuple[MigProfiling, ...] = ()
    encoder_utilization_ratio: float | None = None
    decoder_utilization_ratio: float | None = None
    fan_speed_ratio: float | None = None
    # NVML P-state, 0 (most performance) to 15; None when unknown.
    performance_state: int | None = None
    # Time clocks were held below their target, by policy (keys of VIOLATION_POLICIES), since
    # the driver loaded; a policy the device cannot report is left out.
    violation_seconds: Mapping[str, float] = field(default_factory=lambda: _EMPTY_VIOLATIONS)
    # NVLink data moved since the driver loaded, in bytes, by direction ("tx", "rx"), summed
    # over the GPU's links; empty on a GPU without NVLink.
    nvlink_data_bytes: Mapping[str, int] = field(default_factory=dict)
    # Both directions' NVLink data over the interval since the previous slow read, in bytes per
    # second; None on the first read and without NVLink.
    nvlink_data_bytes_per_second: float | None = None
    # NVLink data-link error counters by (link, kind in NVLINK_ERROR_KINDS), since the driver
    # loaded; a counter the device does not report is left out.
    nvlink_errors: Mapping[tuple[int, str], int] = field(default_factory=dict)
    # Whether a vGPU guest's vGPU licence is held (DCGM's DCGM_FI_DEV_VGPU_LICENSE_STATUS);
    # None on a GPU that is not a vGPU, and when the driver cannot tell.
    vgpu_licensed: bool | None = None
    # What the driver says the GPU needs (read again at once after every Xid); None where the
    # driver does not report it (before the field existed) or reports a value gpumon does not know.
    recovery_action: RecoveryAction | None = None


# Xid codes NVIDIA documents: its Xid catalog
# (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) numbers them from 1, and
# its newest (Hopper and Blackwell: 154, the GPU recovery action, and those beside it) stay in
# the low hundreds. 255 leaves room for codes a newer driver adds. Anything else a backend
# reports (a broken driver, a fuzzer, 999 codes from a simulator) is not a code to label series
# with: it is counted under XID_OTHER, so the number of Xid series per GPU stays bounded.
MAX_DOCUMENTED_XID = 255
# The xid_counts key for codes outside 1..MAX_DOCUMENTED_XID, and for documented codes beyond the
# per-GPU limit of distinct codes; rendered as xid="other".
XID_OTHER = 0


def documented_xid(code: int) -> bool:
    return 1 <= code <= MAX_DOCUMENTED_XID


@dataclass(frozen=True, slots=True)
class XidEvent:
    uuid: str
    xid: int
    # Unix time the backend saw the event (its wall clock), kept from the event thread to the wire.
    timestamp: float
    index: int | None = None


@dataclass(frozen=True, slots=True)
class HealthReason:
    """Why a GPU is not healthy: a stable code (``XidFatal``, ``EccUncorrectable``,
    ``RowRemapFailure``, ``RowRemapPending``, ``GpuLost``, ``Thermal``, ...) and a human detail."""

    code: str
    detail: str
    state: HealthState


@dataclass(frozen=True, slots=True)
class HealthVerdict:
    state: HealthState
    reasons: tuple[HealthReason, ...] = ()

    @property
    def reason(self) -> str:
        return self.reasons[0].code if self.reasons else ""

    @property
    def detail(self) -> str:
        return "; ".join(r.detail for r in self.reasons)


HEALTHY = HealthVerdict(HealthState.HEALTHY)

_EMPTY_COUNTS: Mapping[int, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class GpuSample:
    """Everything known about one GPU at one moment: the latest fast and slow fields merged."""

    identity: GpuIdentity
    fast: FastFields | None
    slow: SlowFields | None
    health: HealthVerdict
    sampled_at: float
    # Every Xid seen since the exporter started, by code: counters, never only the last one.
    # Undocumented codes, and codes past the per-GPU limit, are counted under XID_OTHER.
    xid_counts: Mapping[int, int] = field(default_factory=lambda: _EMPTY_COUNTS)
    lost: bool = False
    # The most recent Xid code, what dcgm-exporter's DCGM_FI_DEV_XID_ERRORS reports.
    last_xid: int | None = None
    # The latest event of every Xid code seen (informational ones too), with the backend's
    # timestamp, sorted by code. Readers judge recency with their own window.
    xids: tuple[XidEvent, ...] = ()


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    pod: str
    container: str
    uid: str = ""


@dataclass(frozen=True, slots=True)
class PodGpuUsage:
    """One container's use of one GPU, as attributed by the exporter."""

    ref: PodRef
    gpu_index: int
    gpu_uuid: str  # the card's, also for a MIG device: the card is what fails and is drained
    used_memory_bytes: int | None = None
    utilization_ratio: float | None = None
    allocated_memory_bytes: int | None = None
    allocated_core_ratio: float | None = None
    # Whole-device assignments seen in kubelet pod-resources, by resource name.
    allocated_resources: tuple[str, ...] = ()
    # True when the container's processes use this GPU although no source allocated it to the
    # pod (only set when the allocation view is authoritative for the pod).
    unallocated: bool = False
    # The MIG device on the card, when the use or allocation is of one (identity only: memory None).
    mig: MigInstance | None = None
    # The DRA claim devices that give the container this GPU or MIG device (pod-resources).
    claims: tuple[ClaimDevice, ...] = ()

    @property
    def device_uuid(self) -> str:
        """The UUID of what the container holds: the MIG device's, else the card's."""
        return self.mig.uuid if self.mig is not None else self.gpu_uuid


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An immutable picture of a node's GPUs, built once per sampling tick."""

    node: str
    driver: DriverInfo | None
    gpus: tuple[GpuSample, ...]
    pods: tuple[PodGpuUsage, ...]
    taken_at: float
    backend_up: bool
    complete: bool

    def gpu(self, index: int) -> GpuSample | None:
        for g in self.gpus:
            if g.identity.index == index:
                return g
        return None
