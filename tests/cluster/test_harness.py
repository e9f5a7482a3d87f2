"""The harness itself: a failed start reports the failing component's log and leaves nothing
running; the CLI starts a detached cluster that another command stops; a killed supervisor
takes its children with it."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpumon.devcluster.binaries import locate
from gpumon.devcluster.cluster import DevCluster, StartupError
from gpumon.devcluster.state import alive


def _pids_mentioning(text: str) -> list[int]:
    """Processes whose command line names ``text`` (every component's flags name its root)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in cmdline:
            found.append(int(entry.name))
    return found


def _wait_gone(pids: list[int], timeout_seconds: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout_seconds
    while (left := [p for p in pids if alive(p) and not _zombie(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _zombie(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) == "Z"
    except OSError:
        return True


def test_failed_start_reports_the_component_log_and_stops_the_rest(tmp_path: Path) -> None:
    broken = tmp_path / "kube-apiserver"
    broken.write_text("#!/bin/sh\necho 'apiserver: simulated crash' >&2\nexit 3\n")
    broken.chmod(0o755)
    tools = dataclasses.replace(locate(), kube_apiserver=broken)
    root = tmp_path / "cluster"

    with pytest.raises(StartupError) as failed:
        DevCluster.start(root, tools=tools)

    assert "kube-apiserver exited with code 3" in str(failed.value)
    assert "simulated crash" in str(failed.value)
    assert _pids_mentioning(str(root)) == []  # etcd, started before, is gone too


def _gpumon(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpumon.cli", "devcluster", f"--state-dir={state_dir}", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_cli_up_detach_then_status_kubeconfig_and_down(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    up = _gpumon(state_dir, "up", "--detach")
    try:
        assert up.returncode == 0, up.stderr
        status = _gpumon(state_dir, "status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.count(" ok ") == 5, status.stdout
        kubeconfig = _gpumon(state_dir, "kubeconfig").stdout.strip()
        assert Path(kubeconfig).is_file()
        assert _gpumon(state_dir, "up", "--detach").returncode == 1  # one cluster per state dir
        running = _pids_mentioning(str(state_dir))
        assert len(running) >= 6  # supervisor + five components
    finally:
        down = _gpumon(state_dir, "down")
    assert down.returncode == 0, down.stderr
    assert _wait_gone(running) == []
    assert _gpumon(state_dir, "status").returncode == 1
    assert not (state_dir / "state.json").exists()


def test_children_die_when_their_supervisor_is_killed(tmp_path: Path) -> None:
    marker = str(tmp_path / "sleeper")
    supervisor = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import pathlib, sys, time
            from gpumon.devcluster import processes
            argv = [sys.executable, "-c", "import time; time.sleep(300)", {marker!r}]
            child = processes.spawn("sleeper", argv, pathlib.Path({marker!r} + ".log"),
                                    cwd=pathlib.Path({str(tmp_path)!r}))
            print(child.pid, flush=True)
            time.sleep(300)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert supervisor.stdout is not None
    child_pid = int(supervisor.stdout.readline())
    # The launcher execs the program: its command line is briefly unreadable in between.
    deadline = time.monotonic() + 10
    while child_pid not in _pids_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child_pid in _pids_mentioning(marker)

    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait()

    assert _wait_gone([child_pid]) == []
    assert _pids_mentioning(marker) == []
