"""One field's read: the NVML call, and what its failure means for the read (nothing, a lost GPU,
NVML gone, or an error to report), with the fields a GPU lacks counted once."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import pynvml

from gpumon.devices.backend import BackendError, ErrorSink
from gpumon.devices.nvml.errors import TRY_OLDER_CODES, read_failure

T = TypeVar("T")


class FieldReader:
    """Reads fields for one backend; errors other than "not supported" go to ``errors`` as
    ``("nvml.<field>", kind)``. Thread-safe: reads of different GPUs run in parallel."""

    def __init__(self, errors: ErrorSink) -> None:
        self.errors = errors
        # (field source, GPU index) found NOT_SUPPORTED, counted once for the process lifetime.
        self._unsupported: set[tuple[str, int]] = set()
        self._unsupported_lock = threading.Lock()

    def failed(self, index: int | None, source: str, code: int) -> None:
        outcome = read_failure(index, source, code)
        if isinstance(outcome, BackendError):
            raise outcome
        if outcome is not None:
            self.errors(*outcome)
        elif index is not None:
            self.not_supported(index, source)

    def not_supported(self, index: int, source: str) -> None:
        """A field this GPU lacks: counted once per field and GPU for the process lifetime (a
        re-open asks again, and is answered the same), never logged, never exported as 0."""
        with self._unsupported_lock:
            if (source, index) in self._unsupported:
                return
            self._unsupported.add((source, index))
        self.errors(f"nvml.{source}", "not_supported")

    def read(self, index: int | None, source: str, call: Callable[[], T]) -> T | None:
        """One field of GPU ``index`` (None: of the system); None when it cannot be read."""
        try:
            return call()
        except pynvml.NVMLError as err:
            self.failed(index, source, err.value)
            return None

    def versions(
        self, index: int | None, source: str, calls: Sequence[Callable[[], T]], variant: dict[str, int]
    ) -> T | None:
        """The first of a field's calls (newest version first) that is answered, remembered in
        ``variant`` so that later reads go straight to it."""
        for i in range(variant.get(source, 0), len(calls)):
            try:
                value = calls[i]()
            except pynvml.NVMLError as err:
                if err.value in TRY_OLDER_CODES and i + 1 < len(calls):
                    continue
                self.failed(index, source, err.value)
                return None
            variant[source] = i
            return value
        return None
