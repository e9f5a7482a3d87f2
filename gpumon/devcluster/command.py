"""``gpumon devcluster up|down|kubeconfig|status``: a local control plane for people.

``up`` supervises the cluster in the foreground until Ctrl-C (or SIGTERM from ``down``);
``up --detach`` starts that same supervisor in a new session, waits until the cluster is
ready and returns. Either way the state directory tells the other sub-commands where it is."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

HELP = "run a local Kubernetes control plane with kwok GPU nodes (for tests and the demo)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gpumon.devcluster.state import DEFAULT_DIR

    parser.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_DIR,
        help=f"where the cluster keeps its files (default {DEFAULT_DIR})",
    )
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="start the cluster; runs until Ctrl-C unless --detach")
    up.add_argument("--detach", action="store_true", help="return once ready and keep it running")
    up.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness")
    sub.add_parser("down", help="stop a cluster started with `up`")
    sub.add_parser("kubeconfig", help="print the admin kubeconfig's path (export KUBECONFIG=$(…))")
    sub.add_parser("status", help="health of every component; exit 1 unless all are healthy")


def run(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir.expanduser().resolve()
    if args.action == "up":
        return _detach(state_dir, args.timeout) if args.detach else _up(state_dir, args.timeout)
    return {"down": _down, "kubeconfig": _kubeconfig, "status": _status}[args.action](state_dir)


def _err(msg: str) -> int:
    print(f"gpumon devcluster: {msg}", file=sys.stderr)
    return 1


def _running(state_dir: Path) -> bool:
    from gpumon.devcluster import state

    s = state.load(state_dir)
    return s is not None and state.alive(s.supervisor_pid)


def _clear_stale(state_dir: Path) -> None:
    from gpumon.devcluster import state

    state.forget(state_dir)
    shutil.rmtree(state.cluster_root(state_dir), ignore_errors=True)


def _raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _up(state_dir: Path, timeout: float) -> int:
    from gpumon.devcluster import state
    from gpumon.devcluster.binaries import ToolsMissing
    from gpumon.devcluster.cluster import DevCluster, StartupError
    from gpumon.runtime import logs

    logs.configure()
    if _running(state_dir):
        return _err(f"a cluster is already running from {state_dir}; run `gpumon devcluster down` first")
    _clear_stale(state_dir)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        cluster = DevCluster.start(state.cluster_root(state_dir), timeout_seconds=timeout)
    except (ToolsMissing, StartupError) as e:
        return _err(str(e))
    except KeyboardInterrupt:
        _clear_stale(state_dir)
        return 130
    try:
        state.save(
            state.State(
                supervisor_pid=os.getpid(),
                server=cluster.server,
                kubeconfig=str(cluster.kubeconfig),
                ca_cert=str(cluster.layout.pki.ca_cert),
                client_cert=str(cluster.layout.pki.admin_cert),
                client_key=str(cluster.layout.pki.admin_key),
                components=tuple(
                    state.ComponentState(ch.name, ch.pid, str(ch.log), comp.health)
                    for ch, comp in zip(cluster.children, cluster.components, strict=True)
                ),
            ),
            state_dir,
        )
        print(f"devcluster ready in {cluster.timings['total']:.1f}s: {cluster.server}")
        print(f"export KUBECONFIG={cluster.kubeconfig}", flush=True)
        while True:
            for child in cluster.children:
                if child.exited() is not None:
                    return _err(f"{child.name} exited with code {child.exited()}; see {child.log}")
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 0
    finally:
        cluster.stop()
        _clear_stale(state_dir)


def _detach(state_dir: Path, timeout: float) -> int:
    from gpumon.devcluster import processes, state

    if _running(state_dir):
        return _err(f"a cluster is already running from {state_dir}; run `gpumon devcluster down` first")
    _clear_stale(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    log = state.supervisor_log(state_dir)
    with log.open("wb") as out:
        supervisor = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpumon.cli",
                "devcluster",
                f"--state-dir={state_dir}",
                "up",
                f"--timeout={timeout}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout + 10
    while time.monotonic() < deadline:
        s = state.load(state_dir)
        if s is not None and s.supervisor_pid == supervisor.pid:
            print(f"devcluster running (supervisor pid {supervisor.pid}): {s.server}")
            print(f"export KUBECONFIG={s.kubeconfig}")
            return 0
        if supervisor.poll() is not None:
            return _err(f"the cluster did not start; {log}:\n{processes.tail(log)}")
        time.sleep(0.2)
    supervisor.terminate()
    return _err(f"the cluster was not ready in {timeout:.0f}s; see {log}")


def _down(state_dir: Path) -> int:
    from gpumon.devcluster import state

    s = state.load(state_dir)
    if s is None or not state.alive(s.supervisor_pid):
        _clear_stale(state_dir)
        print("no devcluster running")
        return 0
    os.kill(s.supervisor_pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while state.alive(s.supervisor_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if state.alive(s.supervisor_pid):
        # Its components die with it (PR_SET_PDEATHSIG).
        os.kill(s.supervisor_pid, signal.SIGKILL)
    _clear_stale(state_dir)
    print("devcluster stopped")
    return 0


def _kubeconfig(state_dir: Path) -> int:
    from gpumon.devcluster import state

    s = state.load(state_dir)
    if s is None or not state.alive(s.supervisor_pid):
        return _err("no devcluster running; start one with `gpumon devcluster up --detach`")
    print(s.kubeconfig)
    return 0


def _status(state_dir: Path) -> int:
    from gpumon.devcluster import state
    from gpumon.devcluster.health import Prober

    s = state.load(state_dir)
    if s is None or not state.alive(s.supervisor_pid):
        return _err("no devcluster running")
    prober = Prober(Path(s.ca_cert), Path(s.client_cert), Path(s.client_key))
    healthy = True
    print(f"server {s.server}  supervisor pid {s.supervisor_pid}")
    for c in s.components:
        probe = prober.probe(c.health)
        healthy &= probe.ok
        print(f"  {c.name:<24} pid {c.pid:<8} {'ok' if probe.ok else 'FAIL'}  {probe.detail[:100]}")
    return 0 if healthy else 1
