"""Doctor's exporter-endpoint family against the real exporter app on simulated GPUs."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gpumon.config import AuthConfig, ExporterConfig, SamplingConfig
from gpumon.devices.simulated import SimulatedBackend
from gpumon.doctor import endpoint
from gpumon.doctor.endpoint import EndpointFacts, Reply
from gpumon.doctor.result import CheckResult, Status
from gpumon.exporter.server import make_app
from gpumon.gpu.model import Snapshot
from gpumon.wire import v1 as wire

FAST = 0.1


def exporter_config(**kw: Any) -> ExporterConfig:
    return ExporterConfig(
        node_name="node-1",
        backend="simulated",
        listen_address="127.0.0.1",
        sampling=SamplingConfig(fast_interval_seconds=FAST, slow_interval_seconds=0.5),
        **kw,
    )


async def serving(aiohttp_client: Any, **kw: Any) -> TestClient:
    client: TestClient = await aiohttp_client(make_app(exporter_config(**kw), SimulatedBackend(2, seed=1)))
    async with asyncio.timeout(30):
        while (await client.get("/readyz")).status != 200:  # noqa: ASYNC110 - its sampler's own cadence
            await asyncio.sleep(0.02)
    return client


async def doctor(client: TestClient, *, clock: float | None = None, **kw: Any) -> list[CheckResult]:
    """The check as doctor runs it: blocking, so from a thread while this loop serves."""
    config = exporter_config(port=client.port, **kw)
    wall = time.time if clock is None else (lambda: clock)
    facts = await asyncio.to_thread(endpoint.gather, config, timeout_seconds=5, wall_clock=wall)
    return endpoint.judge(facts, FAST)


async def test_a_running_exporter(aiohttp_client: Any) -> None:
    client = await serving(aiohttp_client)
    ready, sample = await doctor(client)
    assert (ready.status, ready.found) == (Status.OK, f"http://127.0.0.1:{client.port} answers and is ready")
    assert sample.status is Status.OK and sample.found.endswith("s ago")


async def test_a_sample_older_than_three_intervals_is_a_stuck_sampler(aiohttp_client: Any) -> None:
    client = await serving(aiohttp_client)
    _, sample = await doctor(client, clock=time.time() + 120)
    assert sample.status is Status.WARN and "the sampler is stuck" in sample.found
    assert 'kind="timeout"' in sample.fix


async def test_doctor_uses_the_exporters_credentials(aiohttp_client: Any, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    client = await serving(aiohttp_client, auth=AuthConfig(bearer_token_file=token))
    _, sample = await doctor(client, auth=AuthConfig(bearer_token_file=token))
    assert sample.status is Status.OK
    _, refused = await doctor(client)
    assert refused.status is Status.WARN and "refused the credentials (401)" in refused.found


def test_nothing_listening() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        (r,) = endpoint.judge(endpoint.gather(exporter_config(port=port), timeout_seconds=5), FAST)
    assert r.status is Status.FAIL and f"nothing answers at http://127.0.0.1:{port}" in r.found


@pytest.mark.parametrize(
    ("listen", "tls", "url"),
    [
        ("0.0.0.0", False, "http://127.0.0.1:9842"),
        ("::", True, "https://[::1]:9842"),
        ("10.1.2.3", False, "http://10.1.2.3:9842"),
    ],
)
def test_where_doctor_looks(listen: str, tls: bool, url: str, tmp_path: Path) -> None:
    from gpumon.config import TlsConfig

    t = TlsConfig(cert_file=tmp_path / "c", key_file=tmp_path / "k") if tls else TlsConfig()
    assert endpoint.base_url(ExporterConfig(node_name="n", listen_address=listen, tls=t)) == url


def test_not_ready_and_backend_down() -> None:
    snap = wire.encode(wire.snapshot_document(Snapshot("n", None, (), (), 1000.0, False, False)))
    facts = EndpointFacts(
        "http://x",
        ready=Reply(503, b"not ready: device backend down\n"),
        snapshot=Reply(200, snap),
        now=1000.5,
    )
    ready, sample = endpoint.judge(facts, FAST)
    assert ready.status is Status.WARN and ready.found.endswith("/readyz 503: not ready: device backend down")
    assert sample.status is Status.WARN and "device backend down" in sample.found


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"<html>not here</html>", "(invalid: "),
        (b'{"schema": 2, "node": "n"}', "(schema: "),
        (b'{"schema": 1, "taken_at": "1000"}', "(invalid: "),
    ],
)
def test_a_snapshot_the_schema_refuses(body: bytes, why: str) -> None:
    facts = EndpointFacts("http://x", ready=Reply(200, b"ok"), snapshot=Reply(200, body), now=1000.5)
    _, sample = endpoint.judge(facts, FAST)
    assert sample.status is Status.WARN
    assert (
        sample.found.startswith("/api/v1/snapshot is not a snapshot of wire schema 1 ")
        and why in sample.found
    )
    assert "gpumon version" in sample.fix


def test_no_sample_yet() -> None:
    facts = EndpointFacts(
        "http://x", ready=Reply(503, b"no"), snapshot=Reply(503, b'{"error": "no sample yet"}')
    )
    _, sample = endpoint.judge(facts, FAST)
    assert sample.status is Status.WARN and "503" in sample.found
