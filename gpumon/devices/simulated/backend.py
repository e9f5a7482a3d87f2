"""The simulated node: a :class:`~gpumon.devices.backend.DeviceBackend` of simulated boards.

Every measurement is a function of ``(seed, gpu index, clock())`` (the clock is injected; energy
is the one integral, accumulated between reads), so a test that controls the clock gets the same
numbers on every run. Faults are injected at run time from any thread (the exporter's fault
endpoint, a scenario file's timeline, a test) and take effect on the next read.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpumon.devices.backend import BackendUnavailable, GpuLostError
from gpumon.devices.simulated.boards import DRIVER, HGX_BUSES, MiB, SimulationError, model_spec
from gpumon.devices.simulated.faults import (
    ClearFault,
    EccFault,
    FaultSpec,
    FaultStatus,
    GpuFaults,
    InjectedFault,
    LostFault,
    OverheatFault,
    RecoveryActionFault,
    RemapFault,
    SlowFault,
    UnavailableFault,
    XidFault,
    XidStormFault,
    describe,
)
from gpumon.devices.simulated.load import Load, SimProcess, generated_load, stated_load
from gpumon.devices.simulated.noise import S_COUNTERS, S_IDENTITY, S_STORM, S_TEMP, bits, smooth_noise, unit
from gpumon.devices.simulated.scenario import FaultScenario
from gpumon.gpu.model import (
    DriverInfo,
    FastFields,
    GpuIdentity,
    MemoryInfo,
    MigInstance,
    RecoveryAction,
    SlowFields,
    XidEvent,
)

MHz = 1_000_000.0


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
        self._faults = [GpuFaults() for _ in range(gpus)]
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
        h = bits(self._seed, S_IDENTITY, index)
        hexs = f"{h:016x}{bits(self._seed, S_IDENTITY, index, 1):016x}"
        uuid = f"GPU-{hexs[0:8]}-{hexs[8:12]}-{hexs[12:16]}-{hexs[16:20]}-{hexs[20:32]}"
        bus = HGX_BUSES[index] if index < len(HGX_BUSES) else 0x10 + index
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
            active = {i: d for i, f in enumerate(self._faults) if (d := describe(f))}
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
            seed = bits(self._seed, S_STORM, len(self._injected))
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
                self._faults[spec.gpu] = GpuFaults()
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

    def _load(self, index: int, t: float) -> Load:
        stated = self._stated.get(index)
        if stated is not None:
            return stated_load(stated)
        return generated_load(self.spec, self._seed, index, t)

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
        temp += 2.0 * (smooth_noise(self._seed, S_TEMP * 100 + index, now, 11.0) - 0.5)
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
            self._energy[index] = (self.spec.idle_power_watts * 86400 * (1 + unit(self._seed, index)), now)
        joules, at = self._energy[index]
        joules += power * max(0.0, now - at)
        self._energy[index] = (joules, max(now, at))
        return round(joules, 3)

    def _slow_fields(self, index: int) -> SlowFields:
        spec, faults = self.spec, self._faults[index]
        corrected = bits(self._seed, S_COUNTERS, index) % 4
        remap = spec.row_remapping
        return SlowFields(
            pcie_replays=bits(self._seed, S_COUNTERS, index, 1) % 3,
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
