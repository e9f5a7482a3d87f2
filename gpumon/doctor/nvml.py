"""NVML loads and initialises; driver and CUDA versions; each GPU's identity, persistence and MIG
mode; lost GPUs; Xid event registration; process listing.

Reads go through :class:`~gpumon.devices.nvml.NvmlBackend`, as the exporter's do. Persistence
mode and per-GPU event registration are doctor's own questions, asked through nvidia-ml-py
directly while the backend holds NVML open.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from gpumon.devices.backend import BackendUnavailable, DeviceCallError, GpuLostError
from gpumon.devices.nvml import NvmlBackend
from gpumon.devices.nvml.errors import error_kind
from gpumon.doctor.result import CheckResult, Status
from gpumon.gpu.model import DriverInfo, GpuIdentity

FAMILY = "nvml"

_INIT_FIXES = {
    "library_not_found": (
        "install the NVIDIA driver on the node and run the pod with the NVIDIA container runtime "
        "(it mounts libnvidia-ml.so.1), or point --nvml-library at the library"
    ),
    "driver_not_loaded": (
        "load the kernel driver on the node (modprobe nvidia; dmesg says why it did not load)"
    ),
    "no_permission": "give the container the GPU device files (see the devices check), or run it as root",
    "lib_rm_version_mismatch": "reboot the node (or reload the nvidia module) after the driver upgrade",
    "library_path": "point --nvml-library (nvml_library) at an existing libnvidia-ml.so.1, or unset it",
}
_DEFAULT_INIT_FIX = "run nvidia-smi on the node and read dmesg for NVRM errors"
LOST_FIX = (
    "the GPU fell off the bus: drain the node, then reset the GPU (nvidia-smi -r) or reboot it "
    "(docs/runbooks.md, Xid 79)"
)


@dataclass(frozen=True, slots=True)
class GpuFacts:
    identity: GpuIdentity
    persistence: bool | None = None  # None: not reported (Windows, or the read failed)
    xid_error: str | None = None  # why Xid events cannot be registered; None when they can
    lost: bool = False
    read_error: str | None = None  # kind of a failed read other than "lost"
    pids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class NvmlFacts:
    used: bool  # False when the exporter is configured for simulated GPUs
    error: str | None = None  # why NVML cannot be used, for people
    error_kind: str | None = None  # NVML's error name (library_not_found, ...) or library_path
    driver: DriverInfo | None = None
    gpus: tuple[GpuFacts, ...] = ()
    errors: tuple[tuple[str, str], ...] = ()  # field reads that failed: (source, kind)

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(sorted({p for g in self.gpus for p in g.pids}))


def gather(library: Path | None, *, used: bool = True) -> NvmlFacts:
    if not used:
        return NvmlFacts(used=False)
    errors: list[tuple[str, str]] = []
    backend = NvmlBackend(library, errors=lambda source, kind: errors.append((source, kind)))
    try:
        driver = backend.open()
    except BackendUnavailable as e:
        cause = e.__cause__
        kind = error_kind(cause.value) if isinstance(cause, pynvml.NVMLError) else "library_path"
        return NvmlFacts(True, str(e), kind, errors=tuple(errors))
    try:
        identities = backend.devices()
        handles = {g.uuid: _handle(g.uuid) for g in identities if g.uuid}
        with _event_set() as register:
            gpus = tuple(_gpu(backend, g, handles.get(g.uuid), register) for g in identities)
    finally:
        backend.close()
    return NvmlFacts(True, driver=driver, gpus=gpus, errors=tuple(errors))


def _handle(uuid: str) -> Any:
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except pynvml.NVMLError:
        return None


@contextmanager
def _event_set() -> Iterator[Callable[[Any], str | None]]:
    """``register(handle)`` -> None when the GPU's Xid events can be waited on, else the error."""
    try:
        event_set = pynvml.nvmlEventSetCreate()
    except pynvml.NVMLError as e:
        failed = error_kind(e.value)
        yield lambda handle: failed
        return

    def register(handle: Any) -> str | None:
        try:
            pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
        except pynvml.NVMLError as e:
            return error_kind(e.value)
        return None

    try:
        yield register
    finally:
        with contextlib.suppress(pynvml.NVMLError):  # NVML is closed right after either way
            pynvml.nvmlEventSetFree(event_set)


def _gpu(
    backend: NvmlBackend, identity: GpuIdentity, handle: Any, register: Callable[[Any], str | None]
) -> GpuFacts:
    try:
        pids = tuple(p.pid for p in backend.read_fast(identity.index).processes)
    except GpuLostError:
        return GpuFacts(identity, lost=True)
    except DeviceCallError as e:
        return GpuFacts(identity, read_error=e.kind)
    persistence = None
    if handle is not None:
        try:
            persistence = pynvml.nvmlDeviceGetPersistenceMode(handle) == pynvml.NVML_FEATURE_ENABLED
        except pynvml.NVMLError:
            persistence = None
    xid_error = register(handle) if handle is not None else "no_handle"
    return GpuFacts(identity, persistence, xid_error, pids=pids)


# ---------------------------------------------------------------------------------------------
# Judgement (pure)


def judge(facts: NvmlFacts) -> list[CheckResult]:
    if not facts.used:
        return [CheckResult(FAMILY, "NVML", Status.OK, "not used: the exporter runs simulated GPUs")]
    if facts.error is not None or facts.driver is None:
        fix = _INIT_FIXES.get(facts.error_kind or "", _DEFAULT_INIT_FIX)
        return [CheckResult(FAMILY, "NVML", Status.FAIL, facts.error or "NVML did not open", fix)]
    d = facts.driver
    versions = f"driver {d.driver_version or '?'}, CUDA {d.cuda_version or '?'}"
    if d.nvml_version:
        versions += f", NVML {d.nvml_version}"
    out = [CheckResult(FAMILY, "NVML", Status.OK, f"initialised: {versions}; {len(facts.gpus)} GPU(s)")]
    out.append(_gpus(facts.gpus))
    if facts.gpus:
        out += [_persistence(facts.gpus), _xids(facts.gpus), _processes(facts)]
    return out


def _gpu_line(g: GpuFacts) -> str:
    i = g.identity
    if g.lost:
        return f"GPU {i.index} {i.uuid or '?'}: LOST"
    if g.read_error is not None:
        return f"GPU {i.index} {i.uuid or '?'}: cannot be read ({g.read_error})"
    persistence = {True: "on", False: "off", None: "n/a"}[g.persistence]
    mig = {True: "on", False: "off", None: "n/a"}[i.mig_mode]
    return f"GPU {i.index} {i.uuid} {i.model} {i.pci_bus_id}: persistence {persistence}, MIG {mig}"


def _named(gpus: list[GpuFacts]) -> str:
    return ", ".join(
        f"GPU {g.identity.index}" + (f" ({g.identity.uuid})" if g.identity.uuid else "") for g in gpus
    )


def _gpus(gpus: tuple[GpuFacts, ...]) -> CheckResult:
    details = tuple(_gpu_line(g) for g in gpus)
    if not gpus:
        return CheckResult(
            FAMILY,
            "GPUs",
            Status.FAIL,
            "NVML sees no GPU",
            "run nvidia-smi on the node; in a container NVIDIA_VISIBLE_DEVICES decides which GPUs it sees",
        )
    lost = [g for g in gpus if g.lost]
    if lost:
        return CheckResult(FAMILY, "GPUs", Status.FAIL, f"lost: {_named(lost)}", LOST_FIX, details)
    unreadable = [g for g in gpus if g.read_error is not None]
    if unreadable:
        kinds = ", ".join(sorted({g.read_error or "" for g in unreadable}))
        return CheckResult(
            FAMILY,
            "GPUs",
            Status.WARN,
            f"cannot be read: {_named(unreadable)} ({kinds})",
            "read dmesg for NVRM/Xid messages about these GPUs; nvidia-smi -q -i <index> shows NVML's view",
            details,
        )
    models = Counter(g.identity.model for g in gpus)
    found = ", ".join(f"{n} × {m}" for m, n in models.items())
    return CheckResult(FAMILY, "GPUs", Status.OK, found, details=details)


def _persistence(gpus: tuple[GpuFacts, ...]) -> CheckResult:
    off = [g for g in gpus if g.persistence is False]
    if off:
        return CheckResult(
            FAMILY,
            "persistence mode",
            Status.WARN,
            f"off on {_named(off)}: the driver tears down between clients, so every NVML call is slow",
            "run nvidia-persistenced on the node (or nvidia-smi -pm 1)",
        )
    if all(g.persistence is None for g in gpus):
        found = "not reported by this driver (normal on Windows)"
        return CheckResult(FAMILY, "persistence mode", Status.OK, found)
    return CheckResult(FAMILY, "persistence mode", Status.OK, "on")


def _xids(gpus: tuple[GpuFacts, ...]) -> CheckResult:
    failed = [g for g in gpus if not g.lost and g.read_error is None and g.xid_error is not None]
    if failed:
        kinds = ", ".join(sorted({g.xid_error or "" for g in failed}))
        return CheckResult(
            FAMILY,
            "Xid events",
            Status.WARN,
            f"cannot be registered on {_named(failed)} ({kinds})",
            "Xid errors on these GPUs are not seen as they happen (ECC, remapping and loss still are); "
            "vGPU guests and some drivers do not deliver them",
        )
    registered = sum(1 for g in gpus if g.xid_error is None and not g.lost and g.read_error is None)
    return CheckResult(FAMILY, "Xid events", Status.OK, f"registered on {registered} GPU(s)")


def _processes(facts: NvmlFacts) -> CheckResult:
    # A driver without the process calls (NOT_SUPPORTED, counted as such) is no permission problem.
    kinds = sorted(
        {kind for source, kind in facts.errors if source == "nvml.processes" and kind != "not_supported"}
    )
    if kinds:
        return CheckResult(
            FAMILY,
            "process listing",
            Status.WARN,
            f"NVML cannot list GPU processes ({', '.join(kinds)})",
            "run the exporter as root in the host PID namespace (hostPID: true); per-pod memory needs it",
        )
    gpus = sum(1 for g in facts.gpus if g.pids)
    found = f"{len(facts.pids)} process(es) on {gpus} GPU(s)"
    return CheckResult(FAMILY, "process listing", Status.OK, found)
