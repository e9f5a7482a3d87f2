"""`gpumon exporter --backend simulated` as a real process: scrape, break a GPU, stop cleanly."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

# Generous: other engineers' builds and tests share this machine's two cores.
START_DEADLINE = 90.0
CHANGE_DEADLINE = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def _post(url: str, body: dict[str, Any]) -> int:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return int(resp.status)


def _series(base: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    status, body = _get(base + "/metrics")
    assert status == 200
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def _value(
    series: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float | None:
    for (n, labelset), v in series.items():
        if n == name and set(labels.items()) <= labelset:
            return v
    return None


def _poll(condition: Callable[[], bool], deadline: float, what: str) -> float:
    """Seconds until ``condition`` held; fails after ``deadline`` seconds."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < deadline, f"{what}: not within {deadline} s"
        time.sleep(0.02)
    return time.monotonic() - start


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, IO[bytes]]]:
    port = _free_port()
    log = (tmp_path / "exporter.log").open("w+b")
    env = {**os.environ, "GPUMON_PODS__ENABLED": "false"}  # no kubelet or API server here
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpumon.cli", "exporter", "--backend", "simulated", "--simulate-gpus", "4",
         "--listen-address", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )  # fmt: skip
    try:
        yield proc, f"http://127.0.0.1:{port}", log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def _healthy_then_unhealthy(base: str, gpu: str) -> Callable[[], bool]:
    def changed() -> bool:
        s = _series(base)
        return (
            _value(s, "gpumon_gpu_health", gpu=gpu, state="unhealthy") == 1
            and _value(s, "gpumon_gpu_xid_errors_total", gpu=gpu, xid="79") == 1
        )

    return changed


def test_exporter_process_end_to_end(
    exporter: tuple[subprocess.Popen[bytes], str, IO[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    proc, base, log = exporter
    _poll(lambda: _get(base + "/readyz")[0] == 200 or proc.poll() is not None, START_DEADLINE, "ready")
    assert proc.poll() is None, "exporter exited early"

    before = _series(base)
    assert _value(before, "gpumon_gpu_health", gpu="1", state="healthy") == 1
    assert _value(before, "gpumon_gpu_xid_errors_total", gpu="1") is None
    assert _value(before, "gpumon_exporter_nvml_up") == 1

    # Through the fault endpoint.
    started = time.monotonic()
    assert _post(base + "/api/v1/faults", {"gpu": 1, "fault": "xid", "code": 79}) == 200
    _poll(_healthy_then_unhealthy(base, "1"), CHANGE_DEADLINE, "Xid 79 via the endpoint")
    endpoint_latency = time.monotonic() - started

    # Through the CLI (a new Python process each time: its start-up is part of this figure).
    started = time.monotonic()
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpumon.cli",
            "simulate",
            "fault",
            "--exporter",
            base,
            "--gpu",
            "2",
            "--xid",
            "79",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    cli_done = time.monotonic()
    _poll(_healthy_then_unhealthy(base, "2"), CHANGE_DEADLINE, "Xid 79 via the CLI")
    cli_latency = time.monotonic() - cli_done

    listed = subprocess.run(
        [sys.executable, "-m", "gpumon.cli", "simulate", "faults", "--exporter", base],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        listed.returncode == 0
        and "xid gpu=1 code=79" in listed.stdout
        and "xid gpu=2 code=79" in listed.stdout
    )

    after = _series(base)
    assert _value(after, "gpumon_gpu_health", gpu="0", state="healthy") == 1, "other GPUs unaffected"
    with capsys.disabled():
        print(
            f"\n[e2e] Xid 79 -> /metrics: {endpoint_latency * 1000:.0f} ms after POST /api/v1/faults; "
            f"{cli_latency * 1000:.0f} ms after `gpumon simulate fault` returned"
        )

    # A watch stream left open must not hold up a graceful stop.
    watch = urllib.request.urlopen(base + "/api/v1/watch", timeout=30)
    assert json.loads(watch.readline())["type"] == "state"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    watch.close()
    log.seek(0)
    output = log.read().decode()
    assert f"serving metrics at {base}/metrics" in output
    assert "Traceback" not in output
