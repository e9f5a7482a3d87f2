"""Real Prometheus and real exporter processes for the `prometheus` tier.

``PrometheusProcess`` runs the Debian ``prometheus`` binary on a free loopback port with its own
config and storage in a temporary directory; ``configure()`` rewrites the config and reloads it
(scrape jobs, rule files, Alertmanagers), ``query()`` / ``wait_for()`` use the HTTP API.
``ExporterProcess`` runs ``gpumon exporter`` as a subprocess. Both keep their logs in files; the
tail of every log a failing test used is attached to its report. Fixtures: ``prometheus`` (one
per session, nothing scraped until a test configures it) and ``exporter`` (simulated GPUs,
``--metrics-profile both``, one per session).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

READY_DEADLINE_SECONDS = 120.0  # other test suites share the 2 cores: be patient
STOP_DEADLINE_SECONDS = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(
    url: str, *, headers: Mapping[str, str] | None = None, timeout: float = 10.0
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class _LoggedProcess:
    """A subprocess whose stdout and stderr go to one log file, stopped gently then killed."""

    name = "process"

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def _spawn(self, argv: Sequence[str]) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def _wait_until(self, ready: Callable[[], bool], what: str, deadline_seconds: float) -> None:
        deadline = time.monotonic() + deadline_seconds
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode} before {what}:\n{self.log_tail()}"
                )
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.name}: not {what} after {deadline_seconds:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(STOP_DEADLINE_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class PrometheusProcess(_LoggedProcess):
    name = "prometheus"

    def __init__(self, workdir: Path, *, scrape_interval: str = "1s") -> None:
        super().__init__(workdir / "prometheus.log")
        self.workdir = workdir
        self.config_path = workdir / "prometheus.yml"
        self.scrape_interval = scrape_interval
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self, *, deadline_seconds: float = READY_DEADLINE_SECONDS) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed: run `make system-packages`")
        self._write_config(self.config())
        self._spawn([
            binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
            "--log.level=info",
        ])
        self._wait_until(lambda: http_get(f"{self.url}/-/ready")[0] == 200, "ready", deadline_seconds)

    def config(
        self,
        jobs: Mapping[str, Sequence[str]] | None = None,
        *,
        rule_files: Sequence[Path] = (),
        alertmanagers: Sequence[str] = (),
        evaluation_interval: str = "1s",
    ) -> dict[str, Any]:
        """A Prometheus config scraping ``jobs`` (job name -> ["host:port", ...])."""
        config: dict[str, Any] = {
            "global": {"scrape_interval": self.scrape_interval, "scrape_timeout": self.scrape_interval,
                       "evaluation_interval": evaluation_interval},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(targets)}]}
                for job, targets in (jobs or {}).items()
            ],
        }
        if rule_files:
            config["rule_files"] = [str(p) for p in rule_files]
        if alertmanagers:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]}
        return config

    def configure(self, config: Mapping[str, Any]) -> None:
        """Replace the running config (see :meth:`config`) and wait until Prometheus applied it."""
        self._write_config(config)
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200, response.read()
        wanted = {j["job_name"] for j in config.get("scrape_configs", [])}
        self._wait_until(lambda: self._active_jobs() >= wanted, "scraping the configured jobs",
                         READY_DEADLINE_SECONDS)

    def _write_config(self, config: Mapping[str, Any]) -> None:
        self.config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))

    def _active_jobs(self) -> set[str]:
        targets = self.api("targets")["activeTargets"]
        return {t["labels"]["job"] for t in targets}

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the ``data`` of a successful answer, else an AssertionError."""
        query = urllib.parse.urlencode(params)
        status, body = http_get(f"{self.url}/api/v1/{path}" + (f"?{query}" if query else ""))
        answer = json.loads(body)
        assert status == 200 and answer.get("status") == "success", (path, params, answer)
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (``[{"metric": {...}, "value": [t, "v"]}, ...]``)."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        return list(data["result"])

    def wait_for(
        self,
        expr: str,
        *,
        until: Callable[[list[dict[str, Any]]], bool] = bool,
        timeout: float = 60.0,
    ) -> list[dict[str, Any]]:
        """Poll ``expr`` until ``until(result)`` holds; the last result on timeout is in the error."""
        deadline = time.monotonic() + timeout
        result = self.query(expr)
        while not until(result):
            if time.monotonic() > deadline:
                raise AssertionError(f"{expr!r} not satisfied after {timeout:.0f} s; last: {result}")
            time.sleep(0.5)
            result = self.query(expr)
        return result


class ExporterProcess(_LoggedProcess):
    """``gpumon exporter`` on a free loopback port."""

    name = "gpumon exporter"

    def __init__(self, workdir: Path, *args: str) -> None:
        super().__init__(workdir / "exporter.log")
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.target}"
        self.args = args

    def start(self, *, deadline_seconds: float = READY_DEADLINE_SECONDS) -> None:
        self._spawn([sys.executable, "-m", "gpumon.cli", "exporter", "--listen-address", "127.0.0.1",
                     "--port", str(self.port), *self.args])
        self._wait_until(lambda: http_get(f"{self.url}/readyz")[0] == 200, "ready", deadline_seconds)

    def metrics(self, accept: str = "text/plain") -> bytes:
        status, body = http_get(f"{self.url}/metrics", headers={"Accept": accept})
        assert status == 200, body
        return body


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusProcess]:
    server = PrometheusProcess(tmp_path_factory.mktemp("prometheus"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExporterProcess]:
    process = ExporterProcess(
        tmp_path_factory.mktemp("exporter"),
        "--backend", "simulated", "--metrics-profile", "both", "--node-name", "prom-test-node",
    )
    try:
        process.start()
        yield process
    finally:
        process.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome: Any = yield
    report = outcome.get_result()
    if report.failed:
        used = {id(v): v for v in getattr(item, "funcargs", {}).values() if isinstance(v, _LoggedProcess)}
        for process in used.values():
            report.sections.append((f"{process.name} log ({process.log_path})", process.log_tail()))


# ---------------------------------------------------------------------------------------------
# A small simulated fleet (dashboards, adapter rules): two exporters scraped under the job name
# the alerts and dashboards expect, a `cluster` label added by the scrape config as relabeling
# would, GPUs broken in the ways the dashboards show, and pods holding whole GPUs as the
# kubelet's pod-resources API reports them (a real gRPC server per node). Without the API
# server, no process is attributed to a pod: allocated containers show 0 memory and 0 % busy.

FLEET_JOB = "gpumon-exporter"
FLEET_CLUSTER = "prom-test"
# node -> (model, faults injected at start through POST /api/v1/faults,
#          pods: (namespace, pod, container, GPU indexes)).
FleetPod = tuple[str, str, str, tuple[int, ...]]
FLEET_NODES: dict[str, tuple[str, tuple[dict[str, Any], ...], tuple[FleetPod, ...]]] = {
    "gpu-node-a": (
        "A100-SXM4-80GB",
        ({"gpu": 1, "fault": "xid", "code": 79},
         {"gpu": 2, "fault": "overheat", "celsius": 97},
         {"gpu": 3, "fault": "ecc", "count": 2}),
        (("ml", "inference-7d9f8-abcde", "inference", (0,)),
         ("ml", "trainer-0", "trainer", (2, 3))),
    ),
    "gpu-node-b": (
        "H100-80GB-HBM3",
        (),
        (("ml", "inference-7d9f8-fghij", "inference", (0,)),
         ("research", "notebook-alice", "notebook", (1,))),
    ),
}


def http_post_json(url: str, body: Any, *, timeout: float = 10.0) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="session")
def gpu_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ExporterProcess]]:
    from podresources_server import pod_resources, serve, short_socket_dir

    fleet: dict[str, ExporterProcess] = {}
    with contextlib.ExitStack() as stack:
        sockets = stack.enter_context(short_socket_dir())
        try:
            for seed, (node, (model, _, pods)) in enumerate(FLEET_NODES.items(), start=1):
                workdir = tmp_path_factory.mktemp(node)
                kubelet = stack.enter_context(serve(sockets / f"{node}.sock"))
                kubelet.pods = [
                    pod_resources(ns, pod, {container: {"nvidia.com/gpu": [str(i) for i in gpus]}})
                    for ns, pod, container, gpus in pods
                ]
                (workdir / "proc").mkdir()
                config = workdir / "exporter.yaml"
                config.write_text(yaml.safe_dump({"pods": {
                    "pod_resources_socket": str(sockets / f"{node}.sock"),
                    "host_proc": str(workdir / "proc"),
                    "api": False,
                }}))
                fleet[node] = ExporterProcess(
                    workdir, "--config", str(config), "--backend", "simulated", "--node-name", node,
                    "--simulate-gpus", "4", "--simulate-model", model, "--simulate-seed", str(seed),
                    "--slow-interval", "1",
                )
                fleet[node].start()
            for node, (_, faults, _) in FLEET_NODES.items():
                for fault in faults:
                    status, answer = http_post_json(f"{fleet[node].url}/api/v1/faults", fault)
                    assert status == 200, answer
            yield fleet
        finally:
            for process in fleet.values():
                process.stop()


def fleet_scrape_config(
    prometheus: PrometheusProcess, fleet: Mapping[str, ExporterProcess]
) -> dict[str, Any]:
    config = prometheus.config({FLEET_JOB: [p.target for p in fleet.values()]})
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            static["labels"] = {"cluster": FLEET_CLUSTER}
    return config


@pytest.fixture(scope="module")
def fleet_prometheus(
    prometheus: PrometheusProcess, gpu_fleet: dict[str, ExporterProcess]
) -> PrometheusProcess:
    """The session Prometheus scraping the fleet, once every node's series and faults are in."""
    prometheus.configure(fleet_scrape_config(prometheus, gpu_fleet))
    prometheus.wait_for(
        f'count(count by (node) (gpumon_gpu_info{{cluster="{FLEET_CLUSTER}"}}))',
        until=lambda r: bool(r) and int(r[0]["value"][1]) == len(FLEET_NODES),
    )
    prometheus.wait_for('gpumon_gpu_throttled{reason="hw_thermal"} == 1')
    prometheus.wait_for('gpumon_gpu_xid_errors_total{xid="79"}')
    pods = sum(len(gpus) for _, _, node_pods in FLEET_NODES.values() for *_, gpus in node_pods)
    prometheus.wait_for("count(gpumon_pod_gpu_allocated)",
                        until=lambda r: bool(r) and int(r[0]["value"][1]) == pods)
    return prometheus
