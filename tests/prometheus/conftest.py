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
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpumon.devcluster.localservers import (  # noqa: F401 - re-exported to the test modules
    READY_DEADLINE_SECONDS,
    ExporterProcess,
    PrometheusProcess,
    free_port,
    http_get,
    http_post_json,
)
from gpumon.devcluster.localservers import LoggedProcess as _LoggedProcess


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
        "--backend",
        "simulated",
        "--metrics-profile",
        "both",
        "--node-name",
        "prom-test-node",
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
# A small simulated fleet (adapter rules): two exporters scraped under the job name the alerts
# and dashboards expect, and pods holding whole GPUs as the kubelet's pod-resources API reports
# them (a real gRPC server per node). Without the API server, no process is attributed to a pod:
# allocated containers show 0 memory and 0 % busy. (The dashboards are tested against a whole
# fleet on the local control plane: tests/cluster/test_dashboards_live.py.)

FLEET_JOB = "gpumon-exporter"
# node -> (model, pods: (namespace, pod, container, GPU indexes)).
FleetPod = tuple[str, str, str, tuple[int, ...]]
FLEET_NODES: dict[str, tuple[str, tuple[FleetPod, ...]]] = {
    "gpu-node-a": (
        "A100-SXM4-80GB",
        (("ml", "inference-7d9f8-abcde", "inference", (0,)), ("ml", "trainer-0", "trainer", (2, 3))),
    ),
    "gpu-node-b": (
        "H100-80GB-HBM3",
        (
            ("ml", "inference-7d9f8-fghij", "inference", (0,)),
            ("research", "notebook-alice", "notebook", (1,)),
        ),
    ),
}


@pytest.fixture(scope="session")
def gpu_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ExporterProcess]]:
    from podresources_server import pod_resources, serve, short_socket_dir

    fleet: dict[str, ExporterProcess] = {}
    with contextlib.ExitStack() as stack:
        sockets = stack.enter_context(short_socket_dir())
        try:
            for seed, (node, (model, pods)) in enumerate(FLEET_NODES.items(), start=1):
                workdir = tmp_path_factory.mktemp(node)
                kubelet = stack.enter_context(serve(sockets / f"{node}.sock"))
                kubelet.pods = [
                    pod_resources(ns, pod, {container: {"nvidia.com/gpu": [str(i) for i in gpus]}})
                    for ns, pod, container, gpus in pods
                ]
                (workdir / "proc").mkdir()
                config = workdir / "exporter.yaml"
                config.write_text(
                    yaml.safe_dump(
                        {
                            "pods": {
                                "pod_resources_socket": str(sockets / f"{node}.sock"),
                                "host_proc": str(workdir / "proc"),
                                "api": False,
                            }
                        }
                    )
                )
                fleet[node] = ExporterProcess(
                    workdir,
                    "--config",
                    str(config),
                    "--backend",
                    "simulated",
                    "--node-name",
                    node,
                    "--simulate-gpus",
                    "4",
                    "--simulate-model",
                    model,
                    "--simulate-seed",
                    str(seed),
                    "--slow-interval",
                    "1",
                )
                fleet[node].start()
            yield fleet
        finally:
            for process in fleet.values():
                process.stop()


@pytest.fixture(scope="module")
def fleet_prometheus(
    prometheus: PrometheusProcess, gpu_fleet: dict[str, ExporterProcess]
) -> PrometheusProcess:
    """The session Prometheus scraping the fleet, once every node's pods are in."""
    prometheus.configure(prometheus.config({FLEET_JOB: [p.target for p in gpu_fleet.values()]}))
    pods = sum(len(gpus) for _, node_pods in FLEET_NODES.values() for *_, gpus in node_pods)
    prometheus.wait_for(
        "count(gpumon_pod_gpu_allocated)", until=lambda r: bool(r) and int(r[0]["value"][1]) == pods
    )
    return prometheus


# ---------------------------------------------------------------------------------------------
# The controller's Prometheus source against a fleet of its own (a module's): simulated exporters
# with fast sampling, and a Prometheus scraping them.

SOURCE_JOB = "gpumon-exporter"


@contextlib.contextmanager
def simulated_exporters(
    tmp_path_factory: pytest.TempPathFactory, nodes: tuple[str, ...], gpus: int
) -> Iterator[dict[str, ExporterProcess]]:
    out: dict[str, ExporterProcess] = {}
    try:
        for seed, node in enumerate(nodes):
            out[node] = ExporterProcess(
                tmp_path_factory.mktemp(node),
                "--backend", "simulated", "--node-name", node, "--simulate-gpus", str(gpus),
                "--simulate-seed", str(seed), "--fast-interval", "0.5", "--slow-interval", "1",
            )  # fmt: skip
            out[node].spawn()
        for process in out.values():
            process.wait_ready()
        yield out
    finally:
        for process in out.values():
            process.stop()


@contextlib.contextmanager
def scraping(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    fleet: dict[str, ExporterProcess],
    ready: str,
    count: int,
) -> Iterator[PrometheusProcess]:
    """A Prometheus scraping ``fleet``, once the query ``ready`` counts ``count``."""
    server = PrometheusProcess(tmp_path_factory.mktemp(name))
    try:
        server.start(server.config({SOURCE_JOB: [p.target for p in fleet.values()]}))
        server.wait_for(ready, until=lambda r: bool(r) and int(r[0]["value"][1]) == count, timeout=90.0)
        yield server
    finally:
        server.stop()
