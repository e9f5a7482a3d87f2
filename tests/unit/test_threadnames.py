"""Threads named at the OS level (gpumon/runtime/threadnames.py), so per-thread CPU can be read from
/proc/PID/task/*/stat: the exporter's threads are told apart there by name."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from gpumon.runtime.threadnames import name_os_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc names are Linux's")


def os_name(native_id: int) -> str:
    return Path(f"/proc/self/task/{native_id}/comm").read_text().rstrip("\n")


def test_a_thread_gets_its_python_name_in_proc_cut_to_fifteen_bytes() -> None:
    seen: dict[str, str] = {}

    def named(key: str, name: str | None) -> None:
        name_os_thread(name)
        seen[key] = os_name(threading.get_native_id())

    threads = [
        threading.Thread(target=named, args=("own", None), name="gpumon-render_0"),
        threading.Thread(target=named, args=("given", "gpumon-a-very-long-name"), name="other"),
    ]
    for t in threads:
        t.start()
        t.join(10)
    assert seen == {"own": "gpumon-render_0", "given": "gpumon-a-very-l"}
