"""The NVML backend on this machine as it is: the real nvidia-ml-py, no NVIDIA driver.

What the exporter relies on: every entry point fails with :class:`BackendUnavailable` (never a
pynvml exception or an AttributeError), with one readable line, and the backend can be opened
again after ``close()`` once the driver turns up.
"""

from __future__ import annotations

import _ctypes
import re
from pathlib import Path

import pynvml
import pytest

from gpumon.devices.backend import BackendUnavailable
from gpumon.devices.nvml import NvmlBackend


def _driver_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


pytestmark = pytest.mark.skipif(_driver_present(), reason="an NVIDIA driver is installed on this machine")


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, source: str, kind: str) -> None:
        self.calls.append((source, kind))


def test_open_without_a_driver_says_what_is_missing() -> None:
    errors = Recorder()
    backend = NvmlBackend(errors=errors)
    with pytest.raises(BackendUnavailable) as caught:
        backend.open()
    message = str(caught.value)
    assert "libnvidia-ml.so.1 not found" in message
    assert "\n" not in message
    assert isinstance(caught.value.__cause__, pynvml.NVMLError_LibraryNotFound)
    assert errors.calls == []  # an unusable library is not a field error


def test_close_then_open_again_tries_again() -> None:
    backend = NvmlBackend()
    for _ in range(3):
        with pytest.raises(BackendUnavailable, match=r"libnvidia-ml\.so\.1 not found"):
            backend.open()
        backend.close()
    backend.close()  # closing a closed backend is fine


def test_every_entry_point_reports_unavailable_while_closed() -> None:
    backend = NvmlBackend()
    with pytest.raises(BackendUnavailable):
        backend.open()
    calls = (
        backend.devices,
        lambda: backend.read_fast(0),
        lambda: backend.read_slow(0),
        lambda: backend.wait_xids(5.0),
    )
    for call in calls:
        # Raised at once: the Xid thread backs off by itself instead of waiting here.
        with pytest.raises(BackendUnavailable, match="not open"):
            call()


def test_library_path_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "libnvidia-ml.so.1"
    with pytest.raises(BackendUnavailable, match=re.escape(f"library {missing} does not exist")):
        NvmlBackend(library_path=missing).open()


def test_library_path_that_is_not_nvml() -> None:
    # A real shared object that loads fine but is not libnvidia-ml.so.1.
    not_nvml = Path(_ctypes.__file__)
    backend = NvmlBackend(library_path=not_nvml)
    with pytest.raises(BackendUnavailable) as caught:
        backend.open()
    assert str(not_nvml) in str(caught.value) and "SONAME" in str(caught.value)
    backend.close()


def test_a_failed_library_path_does_not_poison_the_process() -> None:
    with pytest.raises(BackendUnavailable):
        NvmlBackend(library_path=Path(_ctypes.__file__)).open()
    # pynvml keeps its library handle in a module global: the next backend must still see
    # "library not found", not a stale handle to the wrong library.
    with pytest.raises(BackendUnavailable, match=r"libnvidia-ml\.so\.1 not found"):
        NvmlBackend().open()
    assert pynvml.nvmlLib is None
