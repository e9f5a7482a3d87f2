"""Threads named at the OS level, so that their CPU can be read per thread.

Python 3.11 keeps a thread's ``name`` to itself: every thread of the process shows the
interpreter's name in ``/proc/PID/task/*/comm`` (and in ``top -H``), so a thread that costs
cannot be told from the others. :func:`name_os_thread` gives the calling thread its Python name
in the kernel as well (``prctl(PR_SET_NAME)``, 15 bytes at most); use it as a thread's first
call or as a ``ThreadPoolExecutor``'s ``initializer``. Elsewhere than Linux it does nothing.

A thread started from a named thread inherits its name (the kernel copies it): threads a
native library starts while called from one of ours carry our name too.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable

_PR_SET_NAME = 15
_COMM_BYTES = 15  # TASK_COMM_LEN 16, with the terminating NUL


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None).prctl
        return prctl
    except (OSError, AttributeError):  # a libc without prctl: names are a nicety
        return None


_PRCTL = _prctl()


def name_os_thread(name: str | None = None) -> None:
    """Give the calling thread ``name`` (default: its Python name) at the OS level."""
    if _PRCTL is None:
        return
    raw = (name or threading.current_thread().name).encode("ascii", "replace")[:_COMM_BYTES]
    _PRCTL(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0)
