"""Simulated GPUs: realistic specs, deterministic time-varying load, processes, faults at run time.

Every measurement is a function of ``(seed, gpu index, clock())`` (the clock is injected; energy
is the one integral, accumulated between reads), so a test that controls the clock gets the same
numbers on every run. Faults are injected at run time from any thread (the exporter's fault
endpoint, a scenario file's timeline, a test) and take effect on the next read.

A scenario file lists timed faults and, optionally, which processes run on which GPU and which
GPUs run MIG instances::

    faults:
      - {at: 5, gpu: 1, fault: xid, code: 79}
      - {at: 10, gpu: 2, fault: overheat, celsius: 98}
      - {at: 30, gpu: 2, fault: clear}
    processes:
      - {gpu: 0, pid: 4242, name: python, used_memory_mib: 20480, sm_share: 0.6}
      - {gpu: 3, pid: 4343, used_memory_mib: 8192, sm_share: 0.2, gpu_instance: 2}
    mig:
      - {gpu: 3, profiles: [3g.40gb, 3g.40gb]}
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from gpumon.config import ConfigError, format_validation_error
from gpumon.configfile import read_yaml_mapping
from gpumon.configtypes import Float, Int
from gpumon.devices.backend import BackendUnavailable, GpuLostError
from gpumon.devices.model import (
    DriverInfo,
    FastFields,
    GpuIdentity,
    MemoryInfo,
    MigInstance,
    ProcessSample,
    RecoveryAction,
    SlowFields,
    XidEvent,
)

MiB = 1 << 20
MHz = 1_000_000.0


class SimulationError(ValueError):
    """A request the simulation cannot honour (unknown model, no such GPU, unsupported fault)."""


# ---------------------------------------------------------------------------------------------
# GPU models


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
_HGX_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)


def model_spec(name: str) -> GpuModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise SimulationError(f"unknown GPU model {name!r} (known: {', '.join(MODELS)})") from None


# ---------------------------------------------------------------------------------------------
# Deterministic noise: a 64-bit mix of (seed, stream, integers) -> [0, 1)


def _mix(x: int) -> int:
    # splitmix64 finaliser: cheap, stateless, and stable across Python versions (unlike hash()).
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def _bits(*parts: int) -> int:
    h = 0
    for p in parts:
        h = _mix(h ^ (p & 0xFFFFFFFFFFFFFFFF))
    return h


def _unit(*parts: int) -> float:
    return (_bits(*parts) >> 11) / float(1 << 53)


def _smooth_noise(seed: int, stream: int, t: float, step: float) -> float:
    """Value noise in [0, 1): random at multiples of ``step``, cosine-interpolated between."""
    k = math.floor(t / step)
    frac = t / step - k
    a, b = _unit(seed, stream, k), _unit(seed, stream, k + 1)
    w = (1 - math.cos(math.pi * frac)) / 2
    return a + (b - a) * w


# Streams keep the random draws of different quantities independent.
_S_IDENTITY, _S_JOB, _S_PROC, _S_UTIL, _S_TEMP, _S_COUNTERS, _S_STORM = range(1, 8)
_PROCESS_NAMES = ("python", "python3", "torchrun", "tritonserver", "vllm", "deepspeed")


# ---------------------------------------------------------------------------------------------
# Processes and the load they put on a GPU


@dataclass(frozen=True, slots=True)
class SimProcess:
    """A process stated to run on a simulated GPU (instead of the generated workload)."""

    pid: int
    used_memory_bytes: int
    sm_share: float  # fraction of the SM it keeps busy, 0..1
    name: str = "python"
    gpu_instance: int | None = None  # the MIG GPU instance it runs in (compute instance 0)


@dataclass(frozen=True, slots=True)
class _Load:
    utilization: float
    memory_activity: float
    processes: tuple[ProcessSample, ...]
    used_memory_bytes: int


_JOB_EPOCH_SECONDS = 600.0


def _generated_load(spec: GpuModelSpec, seed: int, index: int, t: float) -> _Load:
    """Jobs come and go in epochs of ten minutes; within a job the load drifts and breathes."""
    offset = _unit(seed, _S_JOB, index, -1) * _JOB_EPOCH_SECONDS  # GPUs change jobs at different times
    epoch = math.floor((t + offset) / _JOB_EPOCH_SECONDS)
    if _unit(seed, _S_JOB, index, epoch) < 0.2:  # a fifth of the time a GPU sits idle
        return _Load(0.0, 0.0, (), 0)
    intensity = 0.35 + 0.6 * _unit(seed, _S_JOB, index, epoch, 1)
    period = 20.0 + 40.0 * _unit(seed, _S_JOB, index, epoch, 2)  # training-step rhythm
    wave = 0.08 * math.sin(2 * math.pi * t / period + index)
    noise = 0.15 * (_smooth_noise(seed, _S_UTIL * 100 + index, t, 5.0) - 0.5)
    util = min(1.0, max(0.0, intensity + wave + noise))
    # Whole MiB, as NVML reports process memory.
    job_mib = int((spec.memory_mib - spec.reserved_mib) * (0.2 + 0.7 * _unit(seed, _S_JOB, index, epoch, 3)))
    count = 1 if _unit(seed, _S_PROC, index, epoch) < 0.7 else 2
    shares = (1.0,) if count == 1 else (0.7, 0.3)
    procs = tuple(
        ProcessSample(
            pid=1000 + _bits(seed, _S_PROC, index, epoch, n) % 4_000_000,
            used_memory_bytes=int(job_mib * share) * MiB,
            sm_utilization_ratio=round(util * share, 4),
            memory_utilization_ratio=round(util * 0.6 * share, 4),
            name=_PROCESS_NAMES[_bits(seed, _S_PROC, index, epoch, n, 1) % len(_PROCESS_NAMES)],
        )
        for n, share in enumerate(shares)
    )
    used = sum(p.used_memory_bytes or 0 for p in procs)
    return _Load(util, util * (0.5 + 0.2 * _smooth_noise(seed, _S_UTIL, t, 7.0)), procs, used)


def _stated_load(processes: Sequence[SimProcess]) -> _Load:
    samples = tuple(
        ProcessSample(
            pid=p.pid,
            used_memory_bytes=p.used_memory_bytes,
            sm_utilization_ratio=p.sm_share,
            memory_utilization_ratio=round(p.sm_share * 0.6, 4),
            name=p.name,
            gpu_instance=p.gpu_instance,
            compute_instance=None if p.gpu_instance is None else 0,
        )
        for p in processes
    )
    util = min(1.0, sum(p.sm_share for p in processes))
    return _Load(util, util * 0.6, samples, sum(p.used_memory_bytes for p in processes))


# ---------------------------------------------------------------------------------------------
# Faults: the validated shape of a request (scenario file, HTTP body, CLI)


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: Int = Field(ge=0)


class XidFault(_Fault):
    """Deliver one Xid event."""

    fault: Literal["xid"]
    code: Int = Field(ge=1, le=999)


class EccFault(_Fault):
    """Uncorrectable (double-bit) ECC errors, delivered with Xid 48 as the driver does."""

    fault: Literal["ecc"]
    count: Int = Field(1, ge=1)


class RemapFault(_Fault):
    """Row remapping failed (no spare rows left), delivered with Xid 64."""

    fault: Literal["remap"]


class LostFault(_Fault):
    """The GPU fell off the bus: every read raises GPU_IS_LOST; Xid 79 is delivered."""

    fault: Literal["lost"]


class OverheatFault(_Fault):
    """Temperature held at ``celsius`` with thermal slowdown active and clocks halved."""

    fault: Literal["overheat"]
    celsius: Float = Field(97.0, gt=0, lt=200)


class SlowFault(_Fault):
    """Every read of this GPU blocks ``seconds`` (a hung driver call); cleared reads return at once."""

    fault: Literal["slow"]
    seconds: Float = Field(5.0, gt=0, le=3600)


def _action(value: Any) -> Any:
    return RecoveryAction.from_label(value) if isinstance(value, str) else value


class RecoveryActionFault(_Fault):
    """The driver asks for ``action`` (NVML's GPU recovery action, by name: ``gpu_reset``,
    ``node_reboot``, ...) until a reset (``clear``) or another of these sets it."""

    fault: Literal["recovery_action"]
    action: Annotated[RecoveryAction, BeforeValidator(_action)]


class ClearFault(_Fault):
    """A GPU reset: faults removed, volatile ECC counters and remap state cleared."""

    fault: Literal["clear"]


class UnavailableFault(BaseModel):
    """The driver goes away for the whole node: every call raises BackendUnavailable until cleared."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fault: Literal["unavailable"]


class XidStormFault(BaseModel):
    """A driver gone wrong: ``rate`` Xid events a second for ``seconds``, each on a GPU and with a
    code (``min_code`` to ``max_code``) drawn at random, delivered as they fall due. One entry
    stands for thousands, so a storm needs neither a scenario line nor a request per Xid."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fault: Literal["xid_storm"]
    rate: Float = Field(gt=0, le=100_000)
    seconds: Float = Field(gt=0, le=3600)
    min_code: Int = Field(1, ge=0, le=99_999)
    max_code: Int = Field(999, ge=0, le=99_999)

    @model_validator(mode="after")
    def _codes_ordered(self) -> XidStormFault:
        if self.min_code > self.max_code:
            raise ValueError("min_code must not be above max_code")
        return self


FaultSpec = Annotated[
    XidFault
    | EccFault
    | RemapFault
    | LostFault
    | OverheatFault
    | SlowFault
    | RecoveryActionFault
    | ClearFault
    | UnavailableFault
    | XidStormFault,
    Field(discriminator="fault"),
]
FAULT_KINDS: tuple[str, ...] = (
    "xid",
    "ecc",
    "remap",
    "lost",
    "overheat",
    "slow",
    "recovery_action",
    "clear",
    "unavailable",
    "xid_storm",
)
fault_adapter: TypeAdapter[FaultSpec] = TypeAdapter(FaultSpec)


def parse_fault(data: Any) -> FaultSpec:
    """Validate one fault request; :class:`SimulationError` with a readable message otherwise."""
    try:
        return fault_adapter.validate_python(data)
    except ValidationError as e:
        entries = format_validation_error(e).removeprefix("invalid configuration:\n")
        raise SimulationError(f"invalid fault:\n{entries}") from None


# ---------------------------------------------------------------------------------------------
# Scenario file


class TimedFault(BaseModel):
    """A scenario entry: a fault and when it happens, written flat (``{at: 5, gpu: 1, fault: lost}``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: Float = Field(ge=0, description="seconds after the backend opened")
    spec: FaultSpec

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        if isinstance(data, dict) and "spec" not in data:
            rest = {k: v for k, v in data.items() if k != "at"}
            return {"at": data["at"], "spec": rest} if "at" in data else {"spec": rest}
        return data


class ScenarioProcess(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: Int = Field(ge=0)
    pid: Int = Field(gt=0)
    name: str = "python"
    used_memory_mib: Int = Field(ge=0)
    sm_share: Float = Field(ge=0, le=1)
    # The MIG GPU instance it runs in (its compute instance is 0), on a GPU listed under `mig`.
    gpu_instance: Int | None = Field(default=None, ge=0)


class ScenarioMig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: Int = Field(ge=0)
    profiles: tuple[str, ...] = Field(min_length=1)


class FaultScenario(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    faults: tuple[TimedFault, ...] = ()
    processes: tuple[ScenarioProcess, ...] = ()
    mig: tuple[ScenarioMig, ...] = ()

    def stated_processes(self) -> dict[int, tuple[SimProcess, ...]]:
        out: dict[int, list[SimProcess]] = {}
        for p in self.processes:
            out.setdefault(p.gpu, []).append(
                SimProcess(p.pid, p.used_memory_mib * MiB, p.sm_share, p.name, p.gpu_instance)
            )
        return {gpu: tuple(procs) for gpu, procs in out.items()}


def load_scenario(path: Path) -> FaultScenario:
    """Read and validate a scenario file; :class:`ConfigError` naming the bad entry otherwise."""
    data = read_yaml_mapping(path, "scenario file", field="simulation.scenario")
    try:
        return FaultScenario.model_validate(data)
    except ValidationError as e:
        entries = format_validation_error(e).removeprefix("invalid configuration:\n")
        raise ConfigError(
            f"invalid configuration:\n  simulation.scenario: {path} is not a valid scenario:\n{entries}"
        ) from None


# ---------------------------------------------------------------------------------------------
# The backend


@dataclass(slots=True)
class _GpuFaults:
    lost: bool = False
    overheat_celsius: float | None = None
    slow_seconds: float | None = None
    # Set by clear/close so a read blocked by a slow fault returns at once.
    release: threading.Event = field(default_factory=threading.Event)
    ecc_uncorrected: int = 0
    remap_failures: int = 0
    recovery_action: RecoveryAction = RecoveryAction.NONE


@dataclass(frozen=True, slots=True)
class InjectedFault:
    """One entry of the injection log shown by ``GET /api/v1/faults``."""

    at: float
    spec: FaultSpec


@dataclass(frozen=True, slots=True)
class FaultStatus:
    """What is wrong with the simulated node right now."""

    unavailable: bool
    active: Mapping[int, tuple[str, ...]]  # gpu index -> active fault descriptions
    injected: tuple[InjectedFault, ...]


class SimulatedBackend:
    """A :class:`~gpumon.devices.backend.DeviceBackend` of ``gpus`` simulated boards."""

    name = "simulated"

    def __init__(
        self,
        gpus: int = 8,
        model: str = "A100-SXM4-80GB",
        *,
        seed: int = 0,
        clock: Callable[[], float] = time.time,
        scenario: FaultScenario | None = None,
        processes: Mapping[int, Sequence[SimProcess]] | None = None,
    ) -> None:
        if gpus < 1:
            raise SimulationError("a simulated node needs at least one GPU")
        self.spec = model_spec(model)
        self._seed = seed
        self._clock = clock
        self._identities = tuple(self._identity(i) for i in range(gpus))
        self._scenario = scenario or FaultScenario()
        self._cond = threading.Condition()
        self._faults = [_GpuFaults() for _ in range(gpus)]
        self._stated: dict[int, tuple[SimProcess, ...]] = {}
        self._mig: dict[int, tuple[MigInstance, ...]] = {}
        self._pending_xids: list[XidEvent] = []
        self._storm: _Storm | None = None
        self._unavailable = False
        self._closed = False
        self._injected: deque[InjectedFault] = deque(maxlen=100)
        self._energy: dict[int, tuple[float, float]] = {}  # gpu -> (joules, at)
        self._opened_at: float | None = None
        self._due = 0  # index of the next scenario fault
        self._timeline = sorted(self._scenario.faults, key=lambda f: f.at)
        for f in self._timeline:
            if not isinstance(f.spec, UnavailableFault | XidStormFault):
                self._check_gpu(f.spec.gpu)
        for gpu, procs in {**self._scenario.stated_processes(), **(processes or {})}.items():
            self.set_processes(gpu, procs)
        for m in self._scenario.mig:
            self._mig[self._check_gpu(m.gpu)] = self._mig_instances(m.gpu, m.profiles)
        for gpu, procs in self._stated.items():
            instances = {m.gpu_instance for m in self._mig.get(gpu, ())}
            for p in procs:
                if p.gpu_instance is not None and p.gpu_instance not in instances:
                    raise SimulationError(
                        f"process {p.pid} runs in MIG instance {p.gpu_instance}, not on gpu {gpu}"
                    )

    # -- identity and configuration ----------------------------------------------------------

    def _identity(self, index: int) -> GpuIdentity:
        h = _bits(self._seed, _S_IDENTITY, index)
        hexs = f"{h:016x}{_bits(self._seed, _S_IDENTITY, index, 1):016x}"
        uuid = f"GPU-{hexs[0:8]}-{hexs[8:12]}-{hexs[12:16]}-{hexs[16:20]}-{hexs[20:32]}"
        bus = _HGX_BUSES[index] if index < len(_HGX_BUSES) else 0x10 + index
        return GpuIdentity(
            index=index,
            uuid=uuid,
            model=f"NVIDIA {self.spec.name}",
            pci_bus_id=f"00000000:{bus:02X}:00.0",
            serial=f"{1320000000000 + h % 10_000_000_000:013d}",
            mig_mode=False if self.spec.mig_profiles else None,
        )

    @property
    def gpu_count(self) -> int:
        return len(self._identities)

    def _check_gpu(self, index: int) -> int:
        if not 0 <= index < len(self._identities):
            raise SimulationError(f"gpu {index} does not exist (this node has {len(self._identities)} GPUs)")
        return index

    def _mig_instances(self, index: int, profiles: Sequence[str]) -> tuple[MigInstance, ...]:
        known = self.spec.mig_profiles
        if not known:
            raise SimulationError(f"{self.spec.name} does not support MIG")
        unknown = [p for p in profiles if p not in known]
        if unknown:
            raise SimulationError(
                f"unknown MIG profile(s) {unknown} for {self.spec.name} (known: {', '.join(known)})"
            )
        if sum(known[p][0] for p in profiles) > 7:
            raise SimulationError(f"MIG profiles {list(profiles)} need more than the 7 slices of gpu {index}")
        uuid = self._identities[index].uuid
        return tuple(
            MigInstance(
                gpu_instance=gi + 1,
                compute_instance=0,
                profile=p,
                uuid=f"MIG-{uuid[4:-4]}{gi:04x}",
                memory=MemoryInfo(known[p][1] * MiB, 0, known[p][1] * MiB),
            )
            for gi, p in enumerate(profiles)
        )

    def set_processes(self, index: int, processes: Sequence[SimProcess] | None) -> None:
        """State which processes run on GPU ``index`` (``None``: back to the generated workload)."""
        self._check_gpu(index)
        total = sum(p.used_memory_bytes for p in processes or ())
        if total > (self.spec.memory_mib - self.spec.reserved_mib) * MiB:
            raise SimulationError(f"processes on gpu {index} use more memory than a {self.spec.name} has")
        with self._cond:
            if processes is None:
                self._stated.pop(index, None)
            else:
                self._stated[index] = tuple(processes)

    # -- DeviceBackend -----------------------------------------------------------------------

    def open(self) -> DriverInfo:
        with self._cond:
            if self._opened_at is None:
                self._opened_at = self._clock()
            self._closed = False
            self._apply_due()
            self._raise_if_unavailable()
        return DRIVER

    def close(self) -> None:
        with self._cond:
            self._closed = True  # wakes a thread blocked in wait_xids
            for f in self._faults:
                f.release.set()
            self._cond.notify_all()

    def devices(self) -> tuple[GpuIdentity, ...]:
        with self._cond:
            self._apply_due()
            self._raise_if_unavailable()
            return tuple(
                replace(ident, mig_mode=True) if ident.index in self._mig else ident
                for ident in self._identities
            )

    def read_fast(self, index: int) -> FastFields:
        self._block_if_slow(index)
        with self._cond:
            self._enter_read(index)
            now = self._clock()
            return self._fast_fields(index, now)

    def read_slow(self, index: int) -> SlowFields:
        self._block_if_slow(index)
        with self._cond:
            self._enter_read(index)
            return self._slow_fields(index)

    def read_recovery_action(self, index: int) -> RecoveryAction | None:
        self._block_if_slow(index)
        with self._cond:
            self._enter_read(index)
            return self._faults[index].recovery_action

    def wait_xids(self, timeout_seconds: float) -> list[XidEvent]:
        with self._cond:
            self._apply_due()
            self._raise_if_unavailable()
            self._storm_due()
            if not self._pending_xids:
                wait = timeout_seconds
                if self._opened_at is not None and self._due < len(self._timeline):
                    until_next = self._opened_at + self._timeline[self._due].at - self._clock()
                    wait = min(wait, max(0.0, until_next))
                if self._storm is not None:
                    wait = min(wait, _STORM_POLL_SECONDS)
                self._cond.wait_for(lambda: bool(self._pending_xids) or self._closed, wait)
                self._apply_due()
                self._raise_if_unavailable()
                self._storm_due()
            events, self._pending_xids = self._pending_xids, []
            return events

    # -- faults ------------------------------------------------------------------------------

    def inject(self, spec: FaultSpec) -> None:
        """Apply one fault now (thread-safe); :class:`SimulationError` if it cannot apply."""
        with self._cond:
            self._apply(spec)

    def clear_all(self) -> None:
        """Reset every GPU, end a storm and bring the driver back."""
        with self._cond:
            self._unavailable = False
            self._storm = None
            for i in range(len(self._faults)):
                self._apply(ClearFault(gpu=i, fault="clear"))

    def status(self) -> FaultStatus:
        with self._cond:
            self._apply_due()
            active = {i: d for i, f in enumerate(self._faults) if (d := _describe(f))}
            return FaultStatus(self._unavailable, active, tuple(self._injected))

    def _apply(self, spec: FaultSpec) -> None:
        # One reading of the clock: the fault's record and its Xid event carry the same time.
        now = self._clock()
        if isinstance(spec, UnavailableFault):
            self._unavailable = True
            self._injected.append(InjectedFault(now, spec))
            self._cond.notify_all()
            return
        if isinstance(spec, XidStormFault):
            seed = _bits(self._seed, _S_STORM, len(self._injected))
            self._storm = _Storm(spec, now, random.Random(seed))
            self._injected.append(InjectedFault(now, spec))
            self._cond.notify_all()
            return
        f = self._faults[self._check_gpu(spec.gpu)]
        match spec:
            case XidFault(code=code):
                self._queue_xid(spec.gpu, code, now)
            case EccFault(count=count):
                f.ecc_uncorrected += count
                self._queue_xid(spec.gpu, 48, now)
            case RemapFault():
                if not self.spec.row_remapping:
                    raise SimulationError(f"{self.spec.name} has no row remapping (Ampere and later only)")
                f.remap_failures += 1
                self._queue_xid(spec.gpu, 64, now)
            case LostFault():
                f.lost = True
                self._queue_xid(spec.gpu, 79, now)
            case OverheatFault(celsius=celsius):
                f.overheat_celsius = celsius
            case SlowFault(seconds=seconds):
                f.slow_seconds = seconds
                f.release = threading.Event()
            case RecoveryActionFault(action=action):
                f.recovery_action = action
            case ClearFault():
                f.release.set()
                self._faults[spec.gpu] = _GpuFaults()
        self._injected.append(InjectedFault(now, spec))

    def _storm_due(self) -> None:
        """Queue the storm's events that have fallen due (lock held)."""
        storm = self._storm
        if storm is None:
            return
        now = self._clock()
        spec = storm.spec
        elapsed = min(now - storm.started, spec.seconds)
        due = int(elapsed * spec.rate) - storm.delivered
        for _ in range(due):
            index = storm.rng.randrange(len(self._identities))
            self._queue_xid(index, storm.rng.randint(spec.min_code, spec.max_code), now)
        storm.delivered += due
        if elapsed >= spec.seconds:
            self._storm = None

    def _queue_xid(self, index: int, code: int, now: float) -> None:
        self._pending_xids.append(XidEvent(self._identities[index].uuid, code, now, index))
        self._cond.notify_all()

    def _apply_due(self) -> None:
        """Apply the scenario faults whose time has come (lock held)."""
        if self._opened_at is None:
            return
        elapsed = self._clock() - self._opened_at
        while self._due < len(self._timeline) and self._timeline[self._due].at <= elapsed:
            self._apply(self._timeline[self._due].spec)
            self._due += 1

    def _raise_if_unavailable(self) -> None:
        if self._unavailable:
            raise BackendUnavailable("simulated driver unavailable (fault injected)")
        if self._closed:
            raise BackendUnavailable("simulated backend closed")

    def _enter_read(self, index: int) -> None:
        self._check_gpu(index)
        self._apply_due()
        self._raise_if_unavailable()
        if self._faults[index].lost:
            raise GpuLostError(index, "simulated")

    def _block_if_slow(self, index: int) -> None:
        with self._cond:
            self._check_gpu(index)
            f = self._faults[index]
            seconds, release = f.slow_seconds, f.release
        if seconds is not None:
            # Outside the lock: a hung GPU must not stall reads of the others or fault injection.
            release.wait(seconds)

    # -- measurements ------------------------------------------------------------------------

    def _load(self, index: int, t: float) -> _Load:
        stated = self._stated.get(index)
        if stated is not None:
            return _stated_load(stated)
        return _generated_load(self.spec, self._seed, index, t)

    def _fast_fields(self, index: int, now: float) -> FastFields:
        spec, faults = self.spec, self._faults[index]
        load = self._load(index, now)
        util = load.utilization
        # Temperature follows load with lag: blend the load now and half a minute ago.
        lagged = 0.6 * util + 0.4 * self._load(index, now - 30.0).utilization
        temp = (
            spec.temperature_idle_celsius
            + (spec.temperature_load_celsius - spec.temperature_idle_celsius) * lagged
        )
        temp += 2.0 * (_smooth_noise(self._seed, _S_TEMP * 100 + index, now, 11.0) - 0.5)
        power = spec.idle_power_watts + (spec.power_limit_watts - spec.idle_power_watts) * util**0.9
        power = min(power, spec.power_limit_watts)
        sm_clock = spec.sm_clock_idle_mhz + (spec.sm_clock_max_mhz - spec.sm_clock_idle_mhz) * min(
            1.0, util * 3
        )
        reasons: set[str] = set()
        if util < 0.02:
            reasons.add("gpu_idle")
        if power >= 0.97 * spec.power_limit_watts:
            reasons.add("sw_power_cap")
            sm_clock *= 0.93
        if faults.overheat_celsius is not None:
            temp = faults.overheat_celsius
            reasons.update({"sw_thermal", "hw_thermal"})
            sm_clock *= 0.5
            power *= 0.7
        total = spec.memory_mib * MiB
        reserved = spec.reserved_mib * MiB
        used = load.used_memory_bytes
        mem_temp = spec.memory_temperature_offset_celsius
        return FastFields(
            memory=MemoryInfo(total, used, total - reserved - used, reserved),
            utilization_ratio=round(util, 4),
            memory_utilization_ratio=round(load.memory_activity, 4),
            temperature_gpu_celsius=round(temp),
            temperature_memory_celsius=None if mem_temp is None else round(temp + mem_temp),
            power_watts=round(power, 3),
            power_limit_watts=spec.power_limit_watts,
            energy_joules=self._energy_at(index, now, power),
            sm_clock_hertz=round(sm_clock) * MHz,
            memory_clock_hertz=spec.memory_clock_mhz * MHz,
            throttle_reasons=frozenset(reasons),
            processes=load.processes,
        )

    def _energy_at(self, index: int, now: float, power: float) -> float:
        # Energy since driver load: a seeded starting figure (the node has been up a while),
        # then the integral of the power read each time; never decreases.
        if index not in self._energy:
            self._energy[index] = (self.spec.idle_power_watts * 86400 * (1 + _unit(self._seed, index)), now)
        joules, at = self._energy[index]
        joules += power * max(0.0, now - at)
        self._energy[index] = (joules, max(now, at))
        return round(joules, 3)

    def _slow_fields(self, index: int) -> SlowFields:
        spec, faults = self.spec, self._faults[index]
        corrected = _bits(self._seed, _S_COUNTERS, index) % 4
        remap = spec.row_remapping
        return SlowFields(
            pcie_replays=_bits(self._seed, _S_COUNTERS, index, 1) % 3,
            ecc_corrected=corrected,
            ecc_uncorrected=faults.ecc_uncorrected,
            remapped_rows_correctable=corrected // 2 if remap else None,
            remapped_rows_uncorrectable=faults.remap_failures if remap else None,
            row_remap_pending=False if remap else None,
            row_remap_failure=faults.remap_failures > 0 if remap else None,
            mig_instances=self._mig.get(index, ()),
            recovery_action=faults.recovery_action,
        )


# A storm's events are due continuously; the Xid thread looks for them this often, as a driver
# hands them over in batches.
_STORM_POLL_SECONDS = 0.01


@dataclass(slots=True)
class _Storm:
    spec: XidStormFault
    started: float
    rng: random.Random
    delivered: int = 0


def _describe(f: _GpuFaults) -> tuple[str, ...]:
    out: list[str] = []
    if f.lost:
        out.append("lost")
    if f.overheat_celsius is not None:
        out.append(f"overheat {f.overheat_celsius:g} C")
    if f.slow_seconds is not None:
        out.append(f"slow {f.slow_seconds:g} s")
    if f.ecc_uncorrected:
        out.append(f"ecc {f.ecc_uncorrected} uncorrected")
    if f.remap_failures:
        out.append("remap failure")
    if f.recovery_action is not RecoveryAction.NONE:
        out.append(f"recovery action {f.recovery_action.label}")
    return tuple(out)
