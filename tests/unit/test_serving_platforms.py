"""The serving shell on Windows, faked on Linux: asyncio's Windows loops have no
``add_signal_handler`` (it raises NotImplementedError there), and ``sys.platform`` is ``win32``.

The stop must still come from a real signal, the handlers a command replaced must be back when
it ends, and the whole exporter must start, serve and stop that way."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from metrics_text import free_port

from gpumon import cli
from gpumon.runtime.serving import STOP_SIGNALS, bind, stop_on_signals


def _no_loop_signals(*_args: Any) -> None:
    raise NotImplementedError  # what asyncio's ProactorEventLoop and SelectorEventLoop do on Windows


@pytest.fixture
def windows(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(asyncio.SelectorEventLoop, "add_signal_handler", _no_loop_signals)
    yield
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == previous, "a handler was left behind"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_stops_without_loop_signal_handlers(windows: None, sig: signal.Signals) -> None:
    with stop_on_signals() as stop:
        assert signal.getsignal(sig) not in (signal.SIG_DFL, signal.default_int_handler)
        os.kill(os.getpid(), sig)
        async with asyncio.timeout(10):
            await stop.wait()


async def test_loop_signal_handlers_are_removed_afterwards() -> None:
    loop = asyncio.get_running_loop()
    with stop_on_signals():
        assert all(loop._signal_handlers.get(sig) for sig in STOP_SIGNALS)  # type: ignore[attr-defined]
    assert not any(loop._signal_handlers.get(sig) for sig in STOP_SIGNALS)  # type: ignore[attr-defined]


def test_windows_binds_without_reuse_address(windows: None) -> None:
    """On Windows SO_REUSEADDR would let a second exporter take a port in use."""
    (sock,) = bind("127.0.0.1", 0)
    with sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 0


def test_unix_binds_with_reuse_address() -> None:
    (sock,) = bind("127.0.0.1", 0)
    with sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) != 0


def test_exporter_starts_serves_and_stops_on_windows(
    windows: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """``gpumon exporter`` as the Windows DaemonSet runs it (its defaults, attribution on, no
    /proc, no kubelet socket, no API), in this process's main thread as on Windows; a second
    thread scrapes it and then sends the stop."""
    for key in [k for k in os.environ if k.startswith("GPUMON_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    port = free_port()
    scraped: list[str] = []

    def scrape_then_stop() -> None:
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            for _ in range(600):  # 60 s for the exporter to start on a loaded machine
                try:
                    with urllib.request.urlopen(url, timeout=5) as r:
                        text = r.read().decode()
                except OSError:
                    threading.Event().wait(0.1)
                    continue
                if "gpumon_gpu_utilization_ratio{" in text:
                    scraped.append(text)
                    break
                threading.Event().wait(0.1)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    scraper = threading.Thread(target=scrape_then_stop)
    scraper.start()
    try:
        code = cli.main(
            [
                "exporter",
                "--backend=simulated",
                "--simulate-gpus=2",
                f"--port={port}",
                "--listen-address=127.0.0.1",
                f"--host-proc={tmp_path / 'proc'}",
                "--fast-interval=0.2",
            ]
        )
    finally:
        scraper.join(timeout=90)
    assert code == 0
    assert scraped, "the exporter never served GPU series"
    assert 'gpumon_exporter_pod_source_state{source="proc",state="unsupported"} 1.0' in scraped[0]
