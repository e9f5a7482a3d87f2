"""Xid events: the one NVML event set the GPUs' critical errors arrive on, and the one thread
waiting on it (the sampler's Xid thread). A lost GPU fails the whole set, which is then built
again without it; its Xid (79, fallen off the bus) is still matched to it."""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Mapping
from typing import Any

import pynvml

from gpumon.devices.backend import BackendUnavailable
from gpumon.devices.nvml.convert import text, xid_event
from gpumon.devices.nvml.errors import ErrorClass, classify_error, error_kind
from gpumon.devices.nvml.gpu import Gpu
from gpumon.devices.nvml.reads import FieldReader
from gpumon.gpu.model import GpuIdentity, XidEvent

_XID_DRAIN = 64


class XidEvents:
    """The event set of one NVML open. ``closing`` is set while NVML is closed: a wait that
    has nothing to wait on, or failed, sleeps on it so that a close ends it at once. ``clock``
    stamps the events (NVML's event data carries no time)."""

    def __init__(self, reader: FieldReader, clock: Callable[[], float], closing: threading.Event) -> None:
        self._reader = reader
        self._clock = clock
        self._closing = closing
        self._lock = threading.Lock()  # the event set and the one thread waiting on it
        self._event_set: Any = None
        self._sources: dict[int, GpuIdentity] = {}  # handle address -> GPU, for event data

    def wait(self, open_gpus: Callable[[], Mapping[int, Gpu]], timeout_seconds: float) -> list[XidEvent]:
        """The Xids that arrive within ``timeout_seconds`` on the GPUs ``open_gpus()`` gives (it
        raises while NVML is closed)."""
        with self._lock:
            gpus = open_gpus()
            if self._event_set is None:
                self._event_set, self._sources = self._create_event_set(gpus)
            if not self._sources:
                self._closing.wait(timeout_seconds)  # nothing to wait on: keep the caller's pace
                return []
            try:
                data = pynvml.nvmlEventSetWait_v2(self._event_set, max(0, int(timeout_seconds * 1000)))
            except pynvml.NVMLError as err:
                return self._wait_failed(err.value, timeout_seconds)
            events = [data]
            # Whatever else is already queued comes out now, not one wait later.
            for _ in range(_XID_DRAIN):
                try:
                    events.append(pynvml.nvmlEventSetWait_v2(self._event_set, 0))
                except pynvml.NVMLError:
                    break
            now = self._clock()
            out = []
            for e in events:
                uuid, index = self._event_source(e.device, gpus)
                xid = xid_event(e.eventType, e.eventData, uuid, index, now)
                if xid is not None:
                    out.append(xid)
            return out

    def close(self, shutdown: Callable[[], None]) -> None:
        """Free the event set, then ``shutdown`` NVML, once a running wait has returned (at most
        its timeout), so that no thread is left inside NVML when it shuts down."""
        with self._lock:
            if self._event_set is not None:
                with contextlib.suppress(pynvml.NVMLError):  # NVML is going away either way
                    pynvml.nvmlEventSetFree(self._event_set)
                self._event_set, self._sources = None, {}
            shutdown()

    def _create_event_set(self, gpus: Mapping[int, Gpu]) -> tuple[Any, dict[int, GpuIdentity]]:
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as err:
            self._reader.failed(None, "xid", err.value)
            return None, {}
        sources: dict[int, GpuIdentity] = {}
        for gpu in gpus.values():
            if gpu.handle is None or gpu.lost:
                continue
            try:
                pynvml.nvmlDeviceRegisterEvents(gpu.handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
            except pynvml.NVMLError as err:
                if err.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                    gpu.lost = True
                else:
                    self._reader.failed(None, "xid", err.value)
                continue
            sources[_address(gpu.handle)] = gpu.identity
        return event_set, sources

    def _wait_failed(self, code: int, timeout_seconds: float) -> list[XidEvent]:
        if code == pynvml.NVML_ERROR_TIMEOUT:
            return []
        if classify_error(code) is ErrorClass.UNAVAILABLE:
            raise BackendUnavailable(f"NVML became unusable: {error_kind(code)} waiting for Xid events")
        self._reader.errors("nvml.xid", error_kind(code))
        if code == pynvml.NVML_ERROR_GPU_IS_LOST:
            # A lost GPU fails the whole set: build a new one without the GPUs known lost.
            with contextlib.suppress(pynvml.NVMLError):  # the set is being replaced either way
                pynvml.nvmlEventSetFree(self._event_set)
            self._event_set, self._sources = None, {}
        # A failing wait returns at once; waiting out the timeout keeps the Xid thread from spinning.
        self._closing.wait(timeout_seconds)
        return []

    def _event_source(self, handle: Any, gpus: Mapping[int, Gpu]) -> tuple[str, int | None]:
        """UUID and index of the GPU an event came from: by handle, or by UUID when NVML handed
        out another handle for the same card.

        Every handle of this open is matched, not only the registered ones: a GPU marked lost
        before the set was (re)built is not registered, and NVML cannot be asked for a lost
        GPU's UUID, yet its Xid (79, fallen off the bus) is the one that explains the loss."""
        address = _address(handle)
        known = self._sources.get(address) or next(
            (g.identity for g in gpus.values() if g.handle is not None and _address(g.handle) == address),
            None,
        )
        if known is not None:
            return known.uuid, known.index
        try:
            uuid = text(pynvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError:
            return "", None
        index = next((g.identity.index for g in gpus.values() if uuid and g.identity.uuid == uuid), None)
        return uuid, index


def _address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0
