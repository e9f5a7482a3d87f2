"""The NVML device backend: :class:`NvmlBackend` opens NVML, enumerates the GPUs and reads their
fields. Every call is synchronous and may block: the sampler runs them in its own pool with a
timeout per call and runs :meth:`NvmlBackend.wait_xids` in one dedicated thread. What NVML's
answers mean is :mod:`~gpumon.devices.nvml.convert` and :mod:`~gpumon.devices.nvml.errors`;
processes and MIG devices, GPM and Xid events are read by the modules named for them.
docs/nvml.md lists what is read with which call.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from gpumon.devices.backend import BackendUnavailable, DeviceCallError, ErrorSink, GpuLostError
from gpumon.devices.nvml.convert import (
    FI_GPU_RECOVERY_ACTION,
    NVLINK_DATA_FIELDS,
    canonical_bus_id,
    cuda_version,
    field_value,
    hertz,
    joules,
    memory_info,
    merge_enumeration,
    nvlink_counters,
    nvlink_rate,
    nvlink_requests,
    performance_state,
    ratio,
    recovery_action,
    seconds,
    text,
    throttle_reasons,
    vgpu_licensed,
    watts,
)
from gpumon.devices.nvml.errors import error_kind, init_failure_message, read_failure
from gpumon.devices.nvml.gpm import free_samples, read_mig_profiling, read_profiling
from gpumon.devices.nvml.gpu import Gpu
from gpumon.devices.nvml.processes import read_mig_instances, read_processes
from gpumon.devices.nvml.reads import FieldReader
from gpumon.devices.nvml.xid import XidEvents
from gpumon.gpu.model import (
    VIOLATION_POLICIES,
    DriverInfo,
    FastFields,
    GpuIdentity,
    RecoveryAction,
    SlowFields,
    XidEvent,
)

# The package's name: one logger for the whole NVML backend, whichever module logs.
log = logging.getLogger("gpumon.devices.nvml")

T = TypeVar("T")


def _ignore(source: str, kind: str) -> None:
    """The error sink of a backend nobody asked to report to."""


class NvmlBackend:
    """:class:`~gpumon.devices.backend.DeviceBackend` over NVML.

    ``library_path`` loads that ``libnvidia-ml.so.1`` before ``nvmlInit`` (pynvml opens the
    library by its soname, which then resolves to the one already loaded). Field errors other
    than "not supported" go to ``errors`` as ``("nvml.<field>", kind)``. ``clock`` stamps Xid
    events (NVML's event data carries no time)."""

    name = "nvml"

    def __init__(
        self,
        library_path: Path | None = None,
        errors: ErrorSink | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._library_path = library_path
        self._reader = FieldReader(errors or _ignore)
        self._lock = threading.Lock()  # open/close
        self._gpus: dict[int, Gpu] | None = None  # None while closed
        self._driver = DriverInfo("", "")
        self._known: tuple[GpuIdentity, ...] = ()  # every card seen by this process, by bus id
        self._closing = threading.Event()
        self._xids = XidEvents(self._reader, clock, self._closing)
        self._library: ctypes.CDLL | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def open(self) -> DriverInfo:
        with self._lock:
            if self._gpus is not None:
                return self._driver
            self._preload()
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as err:
                # pynvml raises inside its `except OSError`: the loader's error is the context.
                cause = err.__context__
                load_error = " ".join(str(cause).split()) if isinstance(cause, OSError) else None
                message = init_failure_message(err.value, self._library_path, load_error)
                raise BackendUnavailable(message) from err
            try:
                driver = self._read_driver()
                gpus = self._enumerate()
            except BaseException:
                _shutdown_quietly()
                raise
            self._driver, self._gpus = driver, gpus
            self._closing.clear()
            log.info(
                "NVML opened",
                extra={
                    "driver_version": driver.driver_version,
                    "cuda_version": driver.cuda_version,
                    "gpus": len(gpus),
                },
            )
            return driver

    def close(self) -> None:
        """Release NVML; a later :meth:`open` initialises it again. Waits for a running
        :meth:`wait_xids` call to return (at most its timeout), so that no thread is left
        inside NVML when it shuts down."""
        with self._lock:
            if self._gpus is None:
                return
            gpus, self._gpus = self._gpus, None
            self._closing.set()
            for gpu in gpus.values():
                free_samples(gpu)
            self._xids.close(_shutdown_quietly)

    def _preload(self) -> None:
        if self._library_path is None or self._library is not None:
            return
        if not self._library_path.is_file():
            raise BackendUnavailable(f"NVML unavailable: library {self._library_path} does not exist")
        try:
            self._library = ctypes.CDLL(str(self._library_path), mode=ctypes.RTLD_GLOBAL)
        except OSError as err:
            raise BackendUnavailable(f"NVML unavailable: cannot load {self._library_path}: {err}") from err

    def _read_driver(self) -> DriverInfo:
        driver = self._reader.read(None, "driver_version", lambda: text(pynvml.nvmlSystemGetDriverVersion()))
        cuda = self._reader.versions(
            None,
            "cuda_version",
            (pynvml.nvmlSystemGetCudaDriverVersion_v2, pynvml.nvmlSystemGetCudaDriverVersion),
            {},
        )
        nvml = self._reader.read(None, "nvml_version", lambda: text(pynvml.nvmlSystemGetNVMLVersion()))
        return DriverInfo(driver or "", "" if cuda is None else cuda_version(cuda), nvml or "")

    def _enumerate(self) -> dict[int, Gpu]:
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as err:
            raise BackendUnavailable(
                f"NVML unavailable: cannot count GPUs ({error_kind(err.value)})"
            ) from err
        found: list[GpuIdentity | int] = []
        handles: dict[int, Any] = {}
        problems: dict[int, str] = {}
        for i in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                found.append(self._identity(i, handle))
                handles[i] = handle
            except GpuLostError:
                found.append(i)
                problems[i] = error_kind(pynvml.NVML_ERROR_GPU_IS_LOST)
            except pynvml.NVMLError as err:
                outcome = read_failure(i, "identity", err.value)
                if isinstance(outcome, BackendUnavailable):
                    raise outcome from err
                if isinstance(outcome, tuple):
                    self._reader.errors(*outcome)
                found.append(i)
                problems[i] = error_kind(err.value)
        merged = merge_enumeration(self._known, found)
        self._known = tuple(g for g, _ in merged if g.pci_bus_id)
        gpus: dict[int, Gpu] = {}
        for identity, nvml_index in merged:
            handle = None if nvml_index is None else handles.get(nvml_index)
            problem = None
            if handle is None:
                problem = "gpu_is_lost" if nvml_index is None else problems.get(nvml_index, "gpu_is_lost")
            lost = problem == "gpu_is_lost"
            gpus[identity.index] = Gpu(identity, handle, lost=lost, unreadable=None if lost else problem)
        return gpus

    def _identity(self, index: int, handle: Any) -> GpuIdentity:
        serial = self._reader.read(index, "serial", lambda: text(pynvml.nvmlDeviceGetSerial(handle)))
        mig = self._reader.read(index, "mig", lambda: pynvml.nvmlDeviceGetMigMode(handle)[0])
        return GpuIdentity(
            index=index,
            uuid=text(pynvml.nvmlDeviceGetUUID(handle)),
            model=text(pynvml.nvmlDeviceGetName(handle)),
            pci_bus_id=canonical_bus_id(text(pynvml.nvmlDeviceGetPciInfo_v3(handle).busId)),
            serial=serial or None,
            mig_mode=None if mig is None else mig == pynvml.NVML_DEVICE_MIG_ENABLE,
        )

    # -- DeviceBackend ----------------------------------------------------------------------

    def devices(self) -> tuple[GpuIdentity, ...]:
        gpus = self._open_gpus()
        return tuple(gpus[i].identity for i in sorted(gpus))

    def read_fast(self, index: int) -> FastFields:
        with self._reading(index) as gpu:
            h = gpu.handle
            memory = self._reader.versions(
                gpu.index,
                "memory",
                (
                    lambda: memory_info(pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)),
                    lambda: memory_info(pynvml.nvmlDeviceGetMemoryInfo(h)),
                ),
                gpu.variant,
            )
            rates = self._reader.read(
                gpu.index, "utilization", lambda: pynvml.nvmlDeviceGetUtilizationRates(h)
            )
            temperature = self._reader.versions(
                gpu.index,
                "temperature",
                (
                    lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                    lambda: pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU),
                ),
                gpu.variant,
            )
            power = self._reader.read(gpu.index, "power", lambda: pynvml.nvmlDeviceGetPowerUsage(h))
            limit = self._reader.read(
                gpu.index, "power_limit", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h)
            )
            energy = self._reader.read(
                gpu.index, "energy", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
            )
            sm_clock = self._reader.read(
                gpu.index, "sm_clock", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
            )
            mem_clock = self._reader.read(
                gpu.index, "memory_clock", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
            )
            reasons = self._reader.versions(
                gpu.index,
                "throttle_reasons",
                (
                    lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
                    lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h),
                ),
                gpu.variant,
            )
            return FastFields(
                memory=memory,
                utilization_ratio=None if rates is None else ratio(rates.gpu),
                memory_utilization_ratio=None if rates is None else ratio(rates.memory),
                temperature_gpu_celsius=_maybe(float, temperature),
                temperature_memory_celsius=self._memory_temperature(gpu),
                power_watts=_maybe(watts, power),
                power_limit_watts=_maybe(watts, limit),
                energy_joules=_maybe(joules, energy),
                sm_clock_hertz=_maybe(hertz, sm_clock),
                memory_clock_hertz=_maybe(hertz, mem_clock),
                throttle_reasons=_maybe(throttle_reasons, reasons),
                processes=read_processes(self._reader, gpu),
            )

    def read_slow(self, index: int) -> SlowFields:
        with self._reading(index) as gpu:
            h = gpu.handle
            replays = self._reader.read(
                gpu.index, "pcie_replays", lambda: pynvml.nvmlDeviceGetPcieReplayCounter(h)
            )
            ecc_total = functools.partial(pynvml.nvmlDeviceGetTotalEccErrors, h)
            volatile = pynvml.NVML_VOLATILE_ECC
            corrected = self._reader.read(
                gpu.index,
                "ecc",
                functools.partial(ecc_total, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, volatile),
            )
            uncorrected = self._reader.read(
                gpu.index,
                "ecc",
                functools.partial(ecc_total, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, volatile),
            )
            rows = self._reader.read(gpu.index, "remapped_rows", lambda: pynvml.nvmlDeviceGetRemappedRows(h))
            migs = read_mig_instances(self._reader, gpu)
            correctable, uncorrectable, pending, failure = (None,) * 4 if rows is None else rows
            encoder = self._reader.read(
                gpu.index, "encoder_utilization", lambda: pynvml.nvmlDeviceGetEncoderUtilization(h)
            )
            decoder = self._reader.read(
                gpu.index, "decoder_utilization", lambda: pynvml.nvmlDeviceGetDecoderUtilization(h)
            )
            fan = self._reader.read(gpu.index, "fan_speed", lambda: pynvml.nvmlDeviceGetFanSpeed(h))
            pstate = self._reader.read(
                gpu.index, "performance_state", lambda: pynvml.nvmlDeviceGetPerformanceState(h)
            )
            return SlowFields(
                pcie_replays=replays,
                ecc_corrected=corrected,
                ecc_uncorrected=uncorrected,
                remapped_rows_correctable=correctable,
                remapped_rows_uncorrectable=uncorrectable,
                row_remap_pending=_maybe(bool, pending),
                row_remap_failure=_maybe(bool, failure),
                mig_instances=migs,
                profiling=read_profiling(self._reader, gpu),
                mig_profiling=read_mig_profiling(self._reader, gpu, migs),
                # Both answer [utilization %, sampling period in us].
                encoder_utilization_ratio=None if encoder is None else ratio(encoder[0]),
                decoder_utilization_ratio=None if decoder is None else ratio(decoder[0]),
                fan_speed_ratio=_maybe(ratio, fan),
                performance_state=None if pstate is None else performance_state(pstate),
                violation_seconds=self._violations(gpu),
                vgpu_licensed=self._vgpu_licensed(gpu),
                recovery_action=self._recovery_action(gpu),
                **self._nvlink(gpu),
            )

    def read_recovery_action(self, index: int) -> RecoveryAction | None:
        with self._reading(index) as gpu:
            return self._recovery_action(gpu)

    def wait_xids(self, timeout_seconds: float) -> list[XidEvent]:
        return self._xids.wait(self._open_gpus, timeout_seconds)

    # -- helpers ------------------------------------------------------------------------------

    def _open_gpus(self) -> dict[int, Gpu]:
        gpus = self._gpus
        if gpus is None:
            raise BackendUnavailable("NVML is not open")
        return gpus

    @contextlib.contextmanager
    def _reading(self, index: int) -> Iterator[Gpu]:
        """The GPU to read; a GPU found lost stays lost (and is not called again) until the
        next :meth:`open`."""
        gpu = self._open_gpus().get(index)
        if gpu is None:
            raise DeviceCallError(index, "not_found", "no such GPU")
        if gpu.lost:
            raise GpuLostError(index)
        if gpu.handle is None:
            raise DeviceCallError(
                index, gpu.unreadable or "unknown", "GPU could not be addressed when NVML opened"
            )
        try:
            yield gpu
        except GpuLostError:
            gpu.lost = True
            raise

    def _memory_temperature(self, gpu: Gpu) -> float | None:
        values = self._reader.read(
            gpu.index,
            "memory_temperature",
            lambda: pynvml.nvmlDeviceGetFieldValues(gpu.handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP]),
        )
        if values is None:
            return None
        if values[0].nvmlReturn != pynvml.NVML_SUCCESS:
            self._reader.failed(gpu.index, "memory_temperature", values[0].nvmlReturn)
            return None
        return field_value(values[0])

    def _violations(self, gpu: Gpu) -> dict[str, float]:
        out = {}
        for policy, value in VIOLATION_POLICIES.items():
            got = self._reader.read(
                gpu.index,
                f"violation.{policy}",
                functools.partial(pynvml.nvmlDeviceGetViolationStatus, gpu.handle, value),
            )
            if got is not None:
                out[policy] = seconds(got.violationTime)
        return out

    def _nvlink(self, gpu: Gpu) -> dict[str, Any]:
        """The NVLink counters of every link, in one nvmlDeviceGetFieldValues call."""
        if gpu.nvlink_links is None:
            links = self._field_values(gpu, "nvlink", [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
            if links is None:
                return {}
            gpu.nvlink_links = int(links[0])
            if not gpu.nvlink_links:
                self._reader.not_supported(gpu.index, "nvlink")
        if not gpu.nvlink_links:
            return {}
        requests = nvlink_requests(gpu.nvlink_links)
        values = self._reader.read(
            gpu.index, "nvlink", functools.partial(pynvml.nvmlDeviceGetFieldValues, gpu.handle, requests)
        )
        if values is None:
            gpu.nvlink_last = None
            return {}
        got = nvlink_counters(
            (f, link, values[i].nvmlReturn, field_value(values[i])) for i, (f, link) in enumerate(requests)
        )
        for source, code in got.failed.items():
            self._reader.failed(gpu.index, source, code)
        rate = None
        if len(got.data_bytes) == len(NVLINK_DATA_FIELDS):
            now, total = time.monotonic(), sum(got.data_bytes.values())
            rate = nvlink_rate(gpu.nvlink_last, now, total)
            gpu.nvlink_last = (now, total)
        else:
            gpu.nvlink_last = None
        return {
            "nvlink_data_bytes": got.data_bytes,
            "nvlink_data_bytes_per_second": rate,
            "nvlink_errors": got.errors,
        }

    def _field_values(self, gpu: Gpu, source: str, fields: Sequence[int]) -> list[float] | None:
        """Device-wide fields (scopeId 0) in one call; None when any is not answered."""
        values = self._reader.read(
            gpu.index, source, functools.partial(pynvml.nvmlDeviceGetFieldValues, gpu.handle, list(fields))
        )
        if values is None:
            return None
        out = []
        for v in values:
            number = field_value(v)
            if v.nvmlReturn != pynvml.NVML_SUCCESS or number is None:
                self._reader.failed(gpu.index, source, v.nvmlReturn)
                return None
            out.append(number)
        return out

    def _recovery_action(self, gpu: Gpu) -> RecoveryAction | None:
        values = self._field_values(gpu, "recovery_action", [FI_GPU_RECOVERY_ACTION])
        if values is None:
            return None
        action = recovery_action(values[0])
        if action is None:
            self._reader.errors("nvml.recovery_action", "unknown_value")
        return action

    def _vgpu_licensed(self, gpu: Gpu) -> bool | None:
        """Only a vGPU guest's device (virtualization mode VGPU) has a vGPU licence to hold; on
        bare metal, passthrough and hypervisor hosts the field is absent and nothing is asked.
        The mode cannot change while the driver is loaded: it is read once per open."""
        h = gpu.handle
        if gpu.virtualization_mode is None:
            gpu.virtualization_mode = self._reader.read(
                gpu.index, "virtualization_mode", functools.partial(pynvml.nvmlDeviceGetVirtualizationMode, h)
            )
        if gpu.virtualization_mode != pynvml.NVML_GPU_VIRTUALIZATION_MODE_VGPU:
            return None
        features = self._reader.read(
            gpu.index, "vgpu_license", functools.partial(pynvml.nvmlDeviceGetGridLicensableFeatures_v4, h)
        )
        return None if features is None else vgpu_licensed(features)


def _maybe(convert: Callable[[Any], T], value: Any) -> T | None:
    return None if value is None else convert(value)


def _shutdown_quietly() -> None:
    with contextlib.suppress(pynvml.NVMLError):  # already gone: the driver vanished under us
        pynvml.nvmlShutdown()
