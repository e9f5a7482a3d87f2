"""What the chart would run, run from the built image: the exporter DaemonSet's container on
simulated GPUs and on NVIDIA's mock libnvidia-ml (mounted where the container toolkit puts the
driver's), and the controller Deployment's container against the local control plane, each as
its service account with the chart's own RBAC applied.

Each must become ready, serve real series, write nothing to its root filesystem (the chart makes
it read-only) and stop with exit code 0 on SIGTERM."""

from __future__ import annotations

import platform
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from chart_pod import Doc, Host, Running, find, image_config, launch, run
from chart_render import render
from image_build import BuiltImage
from metrics_text import Series, free_port, parse, select

from gpumon.devcluster.binaries import MockNvml
from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.podresources_server import PodResourcesFixture, pod_resources, serve
from gpumon.devcluster.waiting import eventually

pytestmark = pytest.mark.timeout(1800)  # a cold first build makes the base too (docs/images.md)

NODE = "image-node"
# Where the NVIDIA container toolkit mounts the driver's library in a Debian-family image.
NVML_IN_CONTAINER = f"/usr/lib/{platform.machine()}-linux-gnu/libnvidia-ml.so.1"
MOCK_CONFIG_IN_CONTAINER = "/etc/mock-nvml/config.yaml"
# The chart's objects the API server holds for a release; the workloads are what runs here.
APPLIED_KINDS = (
    "ServiceAccount",
    "ConfigMap",
    "Secret",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
)


@pytest.fixture
def release(devcluster: DevCluster, tmp_path: Path) -> Iterator[Any]:
    """Applies a render's accounts, RBAC and ConfigMaps (removed after the test: the namespace
    goes with the test, the cluster-wide objects would stay)."""
    applied: list[Path] = []

    def apply(docs: Sequence[Doc]) -> None:
        manifest = tmp_path / f"applied-{len(applied)}.yaml"
        manifest.write_text(yaml.safe_dump_all([d for d in docs if d["kind"] in APPLIED_KINDS]))
        devcluster.kubectl("apply", "-f", str(manifest))
        applied.append(manifest)

    yield apply
    for manifest in applied:
        devcluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", str(manifest))


def _service_account(devcluster: DevCluster, namespace: str, name: str, into: Path) -> Host:
    """The files the kubelet projects for a pod's service account, and the API's address."""
    into.mkdir()
    (into / "token").write_text(devcluster.kubectl("create", "token", name, "-n", namespace).strip())
    (into / "ca.crt").write_bytes(devcluster.layout.pki.ca_cert.read_bytes())
    (into / "namespace").write_text(namespace)
    return Host(service_account=into, api_host="127.0.0.1", api_port=devcluster.ports.apiserver)


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str] | None:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
            return r.status, await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return None


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _ready(session: aiohttp.ClientSession, running: Running, port: int) -> None:
    assert running.launch.readiness is not None, "the chart gives the container no readiness probe"

    async def ready() -> bool | None:
        if running.process.poll() is not None:
            raise AssertionError(
                f"the container exited with {running.process.returncode}:\n{running.output()}"
            )
        got = await _get(session, f"http://127.0.0.1:{port}{running.launch.readiness}")
        return True if got is not None and got[0] == 200 else None

    await eventually(ready, what="the readiness probe", timeout_seconds=120, seen=running.output)
    if running.launch.liveness is not None:
        got = await _get(session, f"http://127.0.0.1:{port}{running.launch.liveness}")
        assert got is not None and got[0] == 200, got


async def _scrape_until(
    session: aiohttp.ClientSession, running: Running, port: int, what: str, holds: Any
) -> Series:
    last: list[Series] = [{}]

    async def check() -> Series | None:
        got = await _get(session, f"http://127.0.0.1:{port}/metrics")
        if got is None or got[0] != 200:
            return None
        last[0] = parse(got[1])
        return last[0] if holds(last[0]) else None

    return await eventually(
        check,
        what=what,
        timeout_seconds=120,
        seen=lambda: sorted({n for n, _ in last[0]}) or running.output(),
    )


def _stops_cleanly(running: Running) -> None:
    code = running.stop()
    assert code == 0, f"exit {code} on SIGTERM:\n{running.output()}"
    assert running.root_filesystem_changes() == [], "written outside the mounts (readOnlyRootFilesystem)"


@pytest.mark.parametrize("backend", ["simulated", "mock-nvml"])
async def test_exporter_container_serves_gpus_and_pods(
    backend: str,
    image: BuiltImage,
    helm: Path,
    devcluster: DevCluster,
    namespace: str,
    release: Any,
    mock: MockNvml,
    session: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    port = free_port()
    values = {"exporter.port": str(port), "controller.enabled": "false"}
    if backend == "simulated":
        values |= {"exporter.config.backend": "simulated", "exporter.config.simulation.gpus": "2"}
    docs = render(helm, values, release=namespace, namespace=namespace)
    release(docs)
    daemonset = find(docs, "DaemonSet", "exporter")
    spec = daemonset["spec"]["template"]["spec"]
    account = spec["serviceAccountName"]

    host = _service_account(devcluster, namespace, account, tmp_path / "serviceaccount")
    host_proc = tmp_path / "host-proc"
    host_proc.mkdir()
    # Short: a unix socket path has at most 107 bytes, and pytest's temporary paths are long.
    sockets = Path(tempfile.mkdtemp(prefix="gpumon-pr-", dir="/tmp"))
    pod_resources_dir = "/var/lib/kubelet/pod-resources"
    host.host_paths = {"/proc": host_proc, pod_resources_dir: sockets}
    host.field_refs = {"spec.nodeName": NODE}
    gpus = 2
    if backend == "mock-nvml":
        profile = mock.profile("a100")
        gpus = len(yaml.safe_load(profile.read_text())["devices"])
        assert spec.get("runtimeClassName") in (None, "nvidia"), spec.get("runtimeClassName")
        host.runtime_mounts = {mock.library.resolve(): NVML_IN_CONTAINER, profile: MOCK_CONFIG_IN_CONTAINER}
        host.runtime_env = {"MOCK_NVML_CONFIG": MOCK_CONFIG_IN_CONTAINER}
    started = launch(daemonset, "exporter", docs, image_config(image.ref), host, tmp_path)

    kubelet = PodResourcesFixture()
    try:
        with (
            serve(sockets / "kubelet.sock", kubelet),
            run(image.ref, started, tmp_path / "exporter.log") as running,
        ):
            await _ready(session, running, port)
            first = await _scrape_until(
                session,
                running,
                port,
                f"utilization of all {gpus} GPUs",
                lambda s: len(select(s, "gpumon_gpu_utilization_ratio", node=NODE)) == gpus,
            )
            ((info, _),) = select(first, "gpumon_gpu_info", gpu="0").items()
            # The kubelet hands GPU 0 to a pod: the exporter attributes it.
            kubelet.pods = [
                pod_resources(namespace, "trainer", {"main": {"nvidia.com/gpu": [dict(info)["uuid"]]}})
            ]
            series = await _scrape_until(
                session,
                running,
                port,
                "the pod's GPU from pod-resources",
                lambda s: select(s, "gpumon_pod_gpu_allocated", pod="trainer", gpu="0"),
            )
            build = select(series, "gpumon_exporter_build_info")
            assert {dict(ls)["revision"] for ls in build} == {
                image.labels["org.opencontainers.image.revision"]
            }
            for source in ("proc", "pod_resources", "api"):
                assert select(series, "gpumon_exporter_pod_source_state", source=source, state="up") == {
                    frozenset({("source", source), ("state", "up")}): 1.0
                }, f"{source} is not up"
            if backend == "mock-nvml":
                assert select(series, "gpumon_exporter_nvml_up") == {frozenset(): 1.0}
                assert {dict(ls)["model"] for ls in select(series, "gpumon_gpu_info")} == {
                    yaml.safe_load(profile.read_text())["device_defaults"]["name"]
                }
                # Fault injection is a simulated-backend feature only.
                faults = await _get(session, f"http://127.0.0.1:{port}/api/v1/faults")
                assert faults is not None and faults[0] == 404, faults
            _stops_cleanly(running)
    finally:
        shutil.rmtree(sockets, ignore_errors=True)


async def test_controller_container_becomes_ready_and_leads(
    image: BuiltImage,
    helm: Path,
    devcluster: DevCluster,
    namespace: str,
    release: Any,
    session: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    port = free_port()
    docs = render(helm, {"controller.port": str(port)}, release=namespace, namespace=namespace)
    release(docs)
    deployment = find(docs, "Deployment", "controller")
    spec = deployment["spec"]["template"]["spec"]
    host = _service_account(devcluster, namespace, spec["serviceAccountName"], tmp_path / "serviceaccount")
    pod_name = f"{deployment['metadata']['name']}-6d4cf56db9-x7k2p"
    host.field_refs = {"metadata.name": pod_name, "metadata.namespace": namespace}
    started = launch(deployment, "controller", docs, image_config(image.ref), host, tmp_path)

    with run(image.ref, started, tmp_path / "controller.log") as running:
        await _ready(session, running, port)
        lease = deployment["metadata"]["name"]  # the chart names the Lease after the Deployment

        async def holder() -> str | None:
            out = devcluster.kubectl(
                "get",
                "lease",
                "-n",
                namespace,
                "-o",
                f"jsonpath={{.items[?(@.metadata.name=='{lease}')].spec.holderIdentity}}",
            )
            return out or None

        assert await eventually(holder, what=f"lease {lease} held", timeout_seconds=60) == pod_name
        series = await _scrape_until(
            session,
            running,
            port,
            "the controller's own series",
            lambda s: any(n.startswith("gpumon_") for n, _ in s),
        )
        assert series
        _stops_cleanly(running)
