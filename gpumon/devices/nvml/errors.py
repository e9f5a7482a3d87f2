"""What an NVML return code means: a field this GPU lacks, a GPU lost, NVML unusable as a whole, or
one failed read to report, and the words people get for each. Pure.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from pathlib import Path

import pynvml

from gpumon.devices.backend import BackendError, BackendUnavailable, GpuLostError


class ErrorClass(enum.Enum):
    UNSUPPORTED = "unsupported"  # the field is absent on this GPU or driver: say nothing
    LOST = "lost"  # this GPU is gone; the others are not
    UNAVAILABLE = "unavailable"  # the library or driver as a whole is unusable
    FAILED = "failed"  # this read failed this time: reported, the field is left out


_UNSUPPORTED_CODES = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
_UNAVAILABLE_CODES = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    }
)
# A versioned call answering one of these means "try the older version".
TRY_OLDER_CODES = _UNSUPPORTED_CODES | {pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH}

_ERROR_NAMES: Mapping[int, str] = {
    value: name.removeprefix("NVML_ERROR_").lower()
    for name, value in vars(pynvml).items()
    if name.startswith("NVML_ERROR_") and isinstance(value, int)
}


def classify_error(code: int) -> ErrorClass:
    if code == pynvml.NVML_ERROR_GPU_IS_LOST:
        return ErrorClass.LOST
    if code in _UNSUPPORTED_CODES:
        return ErrorClass.UNSUPPORTED
    if code in _UNAVAILABLE_CODES:
        return ErrorClass.UNAVAILABLE
    return ErrorClass.FAILED


def error_kind(code: int) -> str:
    """The ``kind`` label of an NVML error: its ``NVML_ERROR_*`` name in lower case
    (``timeout``, ``unknown``, ``no_permission``, ``gpu_is_lost``, ...)."""
    return _ERROR_NAMES.get(code, f"nvml_error_{code}")


def read_failure(index: int | None, source: str, code: int) -> BackendError | tuple[str, str] | None:
    """What one failed read of ``source`` means: nothing (the field is simply absent), an
    ``(error source, kind)`` pair to report, or the exception that fails the whole read."""
    match classify_error(code):
        case ErrorClass.UNSUPPORTED:
            return None
        case ErrorClass.LOST if index is not None:
            return GpuLostError(index, f"NVML_ERROR_GPU_IS_LOST reading {source}")
        case ErrorClass.UNAVAILABLE:
            return BackendUnavailable(f"NVML became unusable: {error_kind(code)} reading {source}")
    return f"nvml.{source}", error_kind(code)


_NOT_ON_LOADER_PATH = "libnvidia-ml.so.1: cannot open shared object file"


def init_failure_message(code: int, library_path: Path | None, load_error: str | None = None) -> str:
    """One line for people when ``nvmlInit`` fails. ``load_error`` is the loader's own word
    (``dlerror``) when the library could not be loaded."""
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        if library_path is not None:
            return (
                f"NVML unavailable: loaded {library_path}, but libnvidia-ml.so.1 still cannot be "
                "opened (the file's SONAME must be libnvidia-ml.so.1)"
            )
        # pynvml says "not found" for any load failure; a file that is there but refused (not
        # an ELF, wrong architecture, a dependency missing) needs another fix than no driver.
        if load_error and not load_error.startswith(_NOT_ON_LOADER_PATH):
            return f"NVML unavailable: libnvidia-ml.so.1 is there but cannot be loaded: {load_error}"
        return (
            "NVML unavailable: libnvidia-ml.so.1 not found (no NVIDIA driver on this machine, or its "
            "library is not on the loader path: set nvml_library or LD_LIBRARY_PATH)"
        )
    reasons = {
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
        pynvml.NVML_ERROR_NO_PERMISSION: "no permission to open the GPU device files (/dev/nvidia*)",
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
            "libnvidia-ml and the kernel driver are different versions (driver upgraded, node not rebooted?)"
        ),
    }
    return f"NVML unavailable: {reasons.get(code, f'nvmlInit failed ({error_kind(code)})')}"
