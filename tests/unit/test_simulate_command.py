"""`gpumon simulate` against a real exporter app on simulated GPUs (and against nothing)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from aiohttp.web import RouteDef

from gpumon.cli import main
from gpumon.config import ExporterConfig
from gpumon.devices.backend import DeviceBackend
from gpumon.devices.nvml import NvmlBackend
from gpumon.devices.simulated import SimulatedBackend
from gpumon.devices.simulated_http import fault_routes
from gpumon.exporter.server import make_app
from gpumon.gpu.model import RecoveryAction

MakeClient = Callable[..., Awaitable[TestClient[Any, Any]]]


async def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    # The CLI blocks on HTTP: run it in a thread so this loop keeps serving the app.
    code = await asyncio.to_thread(main, ["simulate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


async def _exporter(aiohttp_client: MakeClient, backend: DeviceBackend, routes: list[RouteDef]) -> str:
    client = await aiohttp_client(make_app(ExporterConfig(node_name="n"), backend, routes=routes))
    return str(client.make_url("")).rstrip("/")


async def test_fault_then_list(aiohttp_client: MakeClient, capsys: pytest.CaptureFixture[str]) -> None:
    backend = SimulatedBackend(2)
    url = await _exporter(aiohttp_client, backend, fault_routes(backend))
    code, out, _ = await _cli(capsys, "fault", "--exporter", url, "--gpu", "1", "--xid", "79")
    assert code == 0 and '"code": 79' in out
    code, out, _ = await _cli(
        capsys, "fault", "--exporter", url, "--gpu", "0", "--mode", "overheat", "--celsius", "99"
    )
    assert code == 0
    assert backend.read_fast(0).temperature_gpu_celsius == 99
    args = ("--gpu", "1", "--mode", "recovery_action", "--recovery-action", "gpu_reset")
    code, _, _ = await _cli(capsys, "fault", "--exporter", url, *args)
    assert code == 0 and backend.read_recovery_action(1) is RecoveryAction.GPU_RESET
    code, out, _ = await _cli(capsys, "faults", "--exporter", url)
    assert code == 0
    assert (
        "gpu 0: overheat 99 C" in out
        and "gpu 1: recovery action gpu_reset" in out
        and "xid gpu=1 code=79" in out
    )
    code, out, _ = await _cli(capsys, "fault", "--exporter", url, "--mode", "clear")
    assert code == 0 and backend.status().active == {}


async def test_refusals_are_readable(aiohttp_client: MakeClient, capsys: pytest.CaptureFixture[str]) -> None:
    backend = SimulatedBackend(2)
    url = await _exporter(aiohttp_client, backend, fault_routes(backend))
    code, _, err = await _cli(capsys, "fault", "--exporter", url, "--gpu", "7", "--mode", "lost")
    assert code == 2 and "gpu 7 does not exist" in err
    code, _, err = await _cli(capsys, "fault", "--exporter", url, "--mode", "lost")
    assert code == 2 and "--gpu is required" in err


async def test_an_exporter_without_simulated_gpus(
    aiohttp_client: MakeClient, capsys: pytest.CaptureFixture[str]
) -> None:
    url = await _exporter(aiohttp_client, NvmlBackend(Path("/nonexistent/libnvidia-ml.so.1")), [])
    code, _, err = await _cli(capsys, "faults", "--exporter", url)
    assert code == 1 and "does not simulate GPUs" in err


async def test_nothing_listening(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = await _cli(capsys, "faults", "--exporter", f"http://127.0.0.1:{port}")
    assert code == 1 and "cannot reach" in err and "Traceback" not in err
