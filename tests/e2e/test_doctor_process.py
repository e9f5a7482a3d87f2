"""`gpumon doctor` as a real process beside a running exporter: the exporter checks pass, and a
kubelet socket that never answers fails at the deadline instead of hanging doctor."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_host_proc import cgroup_file, write_process
from podresources_server import short_socket_dir

START_DEADLINE = 90.0  # generous: the machine is shared


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def wedged_kubelet() -> Iterator[Path]:
    """A pod-resources socket whose connections wait in the backlog for ever."""
    with short_socket_dir() as d, socket.socket(socket.AF_UNIX) as listener:
        path = d / "kubelet.sock"
        listener.bind(str(path))
        listener.listen(64)
        yield path


def test_doctor_beside_a_running_exporter(tmp_path: Path, wedged_kubelet: Path) -> None:
    proc_root = tmp_path / "proc"
    write_process(proc_root, 1, cgroup_file("/init.scope", 2))
    port = free_port()
    env = {
        **os.environ,
        "NODE_NAME": "gpu-node-1",
        "GPUMON_PODS__POD_RESOURCES_SOCKET": str(wedged_kubelet),
        "GPUMON_PODS__API": "false",
    }
    flags = ["--backend", "simulated", "--port", str(port), "--listen-address", "127.0.0.1"]
    flags += ["--host-proc", str(proc_root), "--fast-interval", "0.2"]
    exporter = subprocess.Popen(
        [sys.executable, "-m", "gpumon.cli", "exporter", *flags],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + START_DEADLINE
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the exporter never became ready"
            time.sleep(0.1)
        done = subprocess.run(
            [sys.executable, "-m", "gpumon.cli", "doctor", *flags, "--output", "json", "--timeout", "2"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        exporter.terminate()
        exporter.wait(30)
    doc = json.loads(done.stdout)
    checks = {(c["family"], c["name"]): c for c in doc["checks"]}
    assert done.returncode == 2 == doc["exit_code"]
    assert checks[("exporter", "exporter endpoint")]["status"] == "ok"
    assert checks[("exporter", "last sample")]["status"] == "ok"
    kubelet = checks[("pod-resources", "pod-resources socket")]
    assert kubelet["status"] == "fail" and kubelet["seconds"] <= 2
    assert [c["family"] for c in doc["checks"] if c["status"] == "fail"] == ["pod-resources"]
