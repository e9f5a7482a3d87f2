"""Per-pod GPU metrics end to end: ``gpumon exporter`` on simulated GPUs, pods in the real API
server, a host /proc tree mapping the GPU processes to those pods' containers, and a kubelet
pod-resources endpoint. Two pods share GPU 0 through gpushare, one shares GPU 1 through HAMi,
one owns GPU 2; then the owner is deleted."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pod_objects
import pytest
import yaml
from fake_host_proc import write_process
from kubernetes_asyncio import client
from podresources_server import FakeKubelet, pod_resources, serve, short_socket_dir
from prometheus_client.parser import text_string_to_metric_families

from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.nodemaker import NodeMaker
from gpumon.devcluster.nodes import NodeTemplate
from gpumon.devcluster.waiting import eventually
from gpumon.devices.simulated import SimulatedBackend
from gpumon.k8s import sharing

MIB = 1 << 20
GIB = 1 << 30
SLOW_SECONDS = 1.0
DEADLINE = 90.0  # other suites share the two cores: be patient, never sleep to pass

# pod -> (container, pid, GPU, MiB used, SM share)
WORKLOAD = {
    "share-a": ("main", 4101, 0, 10240, 0.30),
    "share-b": ("main", 4102, 0, 8192, 0.20),
    "hami": ("app", 4201, 1, 2048, 0.25),
    "owner": ("cuda", 4301, 2, 30000, 0.80),
}
HOST_PID = 4999  # a process on GPU 0 outside any pod


def pod_manifest(name: str, node: str, uuids: list[str]) -> dict[str, Any]:
    container, _, gpu, _, _ = WORKLOAD[name]
    annotations: dict[str, str] = {}
    limits: dict[str, str] = {}
    if name == "share-a":
        annotations = {sharing.GPUSHARE_INDEX: str(gpu), sharing.GPUSHARE_ASSIGNED: "true"}
        limits = {sharing.GPUSHARE_MEMORY_RESOURCE: "16", sharing.CGPU_CORE_RESOURCE: "40"}
    elif name == "share-b":
        annotations = {sharing.GPUSHARE_INDEX: str(gpu), sharing.GPUSHARE_ASSIGNED: "true"}
        limits = {sharing.GPUSHARE_MEMORY_RESOURCE: "24"}
    elif name == "hami":
        annotations = {sharing.HAMI_ALLOCATED: f"{uuids[gpu]},NVIDIA,6144,30:;"}
    else:
        limits = {"nvidia.com/gpu": "1"}
    return pod_objects.pod_manifest(name, node, {container: limits}, annotations=annotations)


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def pick(
    series: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> dict[str, float]:
    """Values of ``name`` matching ``labels``, by pod."""
    return {
        dict(ls).get("pod", ""): v for (n, ls), v in series.items() if n == name and set(labels.items()) <= ls
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_shared_and_owned_gpus_then_deletion(
    api: client.ApiClient, devcluster: DevCluster, make_nodes: NodeMaker, namespace: str, tmp_path: Path
) -> None:
    uuids = [d.uuid for d in _simulated_devices()]
    core = client.CoreV1Api(api)
    (node,) = await make_nodes(1, NodeTemplate(gpus=4))

    # Pods bound to the node, Running under kwok, their containers' IDs in status; then the
    # host's /proc, which names the pods by the UIDs the API server gave them.
    pods = await pod_objects.run_pods(core, namespace, (pod_manifest(name, node, uuids) for name in WORKLOAD))
    host_proc = tmp_path / "proc"
    for name, (container, pid, _, _, _) in WORKLOAD.items():
        pods[name].write_process(host_proc, pid, container)
    write_process(host_proc, HOST_PID, "0::/system.slice/xorg.service\n")

    scenario = tmp_path / "scenario.yaml"
    procs = [
        {"gpu": gpu, "pid": pid, "used_memory_mib": mib, "sm_share": sm}
        for _, pid, gpu, mib, sm in WORKLOAD.values()
    ]
    procs.append({"gpu": 0, "pid": HOST_PID, "used_memory_mib": 512, "sm_share": 0.05})
    scenario.write_text(yaml.safe_dump({"processes": procs}))

    kubelet = FakeKubelet()
    kubelet.pods = [
        pod_resources(namespace, name, {c: ({"nvidia.com/gpu": [uuids[gpu]]} if name == "owner" else {})})
        for name, (c, _, gpu, _, _) in WORKLOAD.items()
    ]
    with (
        short_socket_dir() as sockets,
        serve(sockets / "kubelet.sock", kubelet),
        _exporter(tmp_path, devcluster, node, scenario, host_proc, sockets / "kubelet.sock") as url,
    ):
        # Allocated pods show at once with 0 used; their processes count from the next slow refresh.
        expected = {name: mib * MIB for name, (_, _, _, mib, _) in WORKLOAD.items()}
        series = await _until(
            url,
            lambda s: pick(s, "gpumon_pod_gpu_memory_used_bytes", namespace=namespace) == expected,
            "pods' memory",
        )
        used = pick(series, "gpumon_pod_gpu_memory_used_bytes", namespace=namespace)
        util = pick(series, "gpumon_pod_gpu_utilization_ratio", namespace=namespace)
        assert util == pytest.approx({name: sm for name, (_, _, _, _, sm) in WORKLOAD.items()})
        for gpu in range(3):
            on_gpu = {name for name, w in WORKLOAD.items() if w[2] == gpu}
            card_used = pick(series, "gpumon_gpu_memory_used_bytes", gpu=str(gpu))[""]
            card_util = pick(series, "gpumon_gpu_utilization_ratio", gpu=str(gpu))[""]
            assert sum(used[n] for n in on_gpu) <= card_used
            assert sum(util[n] for n in on_gpu) <= card_util + 1e-9
        # gpu labels agree with the card the annotation named
        assert set(pick(series, "gpumon_pod_gpu_memory_used_bytes", gpu="0", uuid=uuids[0])) == {
            "share-a",
            "share-b",
        }

        assert pick(series, "gpumon_pod_gpu_memory_allocated_bytes", namespace=namespace) == {
            "share-a": 16 * GIB,
            "share-b": 24 * GIB,
            "hami": 6144 * MIB,
        }
        assert pick(series, "gpumon_pod_gpu_core_allocated_ratio", namespace=namespace) == {
            "share-a": 0.40,
            "hami": 0.30,
        }
        assert pick(series, "gpumon_pod_gpu_allocated", resource="nvidia.com/gpu", gpu="2") == {"owner": 1.0}
        for source in ("pod_resources", "api", "proc"):
            assert pick(series, "gpumon_exporter_pod_source_state", source=source, state="up") == {"": 1.0}

        # The owner pod is deleted: the API, the kubelet and the process all let go of it.
        await core.delete_namespaced_pod("owner", namespace, grace_period_seconds=0)
        kubelet.pods = [p for p in kubelet.pods if p.name != "owner"]
        shutil.rmtree(host_proc / str(WORKLOAD["owner"][1]))
        started = asyncio.get_running_loop().time()
        series = await _until(
            url, lambda s: not [k for k in s if dict(k[1]).get("pod") == "owner"], "owner's series gone"
        )
        gone_after = asyncio.get_running_loop().time() - started
        assert set(pick(series, "gpumon_pod_gpu_memory_used_bytes", namespace=namespace)) == {
            "share-a",
            "share-b",
            "hami",
        }
    # Within one slow period of the sources letting go, plus the API's delete and one scrape.
    assert gone_after < 3 * SLOW_SECONDS + 5


class _exporter:
    """``gpumon exporter`` with per-pod attribution wired to the test's sources."""

    def __init__(
        self, tmp: Path, cluster: DevCluster, node: str, scenario: Path, host_proc: Path, socket_path: Path
    ) -> None:
        self.port = free_port()
        self.log = tmp / "exporter.log"
        self.argv = [
            sys.executable, "-m", "gpumon.cli", "exporter", "--backend", "simulated", "--simulate-gpus", "4",
            "--scenario", str(scenario), "--node-name", node, "--listen-address", "127.0.0.1",
            "--port", str(self.port), "--fast-interval", "0.25", "--slow-interval", str(SLOW_SECONDS),
        ]  # fmt: skip
        self.env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "GPUMON_PODS__HOST_PROC": str(host_proc),
            "GPUMON_PODS__POD_RESOURCES_SOCKET": str(socket_path),
        }
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> str:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        return f"http://127.0.0.1:{self.port}/metrics"

    def __exit__(self, *exc: object) -> None:
        assert self.process is not None
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def _until(url: str, condition: Any, what: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    async def check() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
        try:
            series = await asyncio.to_thread(scrape, url)
        except OSError:
            return None
        return series if condition(series) else None

    result: dict[tuple[str, frozenset[tuple[str, str]]], float] = await eventually(
        check, what=what, timeout_seconds=DEADLINE, interval_seconds=0.1
    )
    return result


def _simulated_devices() -> Any:
    backend = SimulatedBackend(4)
    backend.open()
    try:
        return backend.devices()
    finally:
        backend.close()
