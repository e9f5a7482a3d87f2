"""Bench fixture: one GPU node on NVIDIA's mock libnvidia-ml, with pods, for ``gpumon exporter
--backend nvml`` with pod attribution on, as a real node would feed it.

- the mock library's A100 profile (8 GPUs), each GPU running ``pods_per_gpu`` processes
  (``processes:`` in the profile, so NVML lists them with their memory and SM samples);
- a host /proc tree with each process's ``stat`` and ``cgroup`` (cgroup v2, systemd driver,
  containerd), as the kubelet's containers show there;
- the kubelet's pod-resources API on a unix socket (gpumon's fixture server, the real v1 proto),
  one whole GPU per pod's container;
- a stand-in API server (aiohttp, plain HTTP) answering the exporter's one list and watch of
  this node's pods: the list holds every pod, the watch sends a bookmark every few seconds.

Nothing here is timed; :mod:`bench.footprint` runs the exporters on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from gpumon.devcluster import podresources_server
from gpumon.devcluster.binaries import MockNvml, locate_mock_nvml

NODE = "bench-node"
NAMESPACE = "team-a"
GPUS = 8


@dataclass(frozen=True)
class PodServices:
    """What the exporter reads to attribute GPU processes to pods, without a kubelet or root."""

    host_proc: Path
    socket: Path
    kubeconfig: Path
    pods: int

    def env(self) -> dict[str, str]:
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "GPUMON_PODS__HOST_PROC": str(self.host_proc),
            "GPUMON_PODS__POD_RESOURCES_SOCKET": str(self.socket),
        }


@dataclass(frozen=True)
class MockNode:
    root: Path
    mock: MockNvml
    profile: Path
    services: PodServices

    @property
    def pods(self) -> int:
        return self.services.pods

    def env(self) -> dict[str, str]:
        """What a process needs to see this node: the library, its profile, the API."""
        return {
            "LD_LIBRARY_PATH": str(self.mock.lib_dir),
            "MOCK_NVML_CONFIG": str(self.profile),
            "KUBECONFIG": str(self.services.kubeconfig),
        }

    def gpumon_env(self) -> dict[str, str]:
        return self.env() | self.services.env()


def _uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def _cid(n: int) -> str:
    return f"{n:064x}"


def _pod(n: int, gpu_uuid: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(n),
            "namespace": NAMESPACE,
            "uid": _uid(n),
            "resourceVersion": str(100 + n),
            "labels": {"app": "train", "job": f"job-{n // 8}"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}" * 200},
        },
        "spec": {
            "nodeName": NODE,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1.0",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    "env": [{"name": f"VAR_{i}", "value": "x" * 40} for i in range(20)],
                }
            ],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "main", "containerID": f"containerd://{_cid(n)}", "ready": True, "restartCount": 0}
            ],
            "podIP": f"10.1.0.{n}",
            "gpu": gpu_uuid,
        },
    }


def _profile(mock: MockNvml, pods_per_gpu: int) -> tuple[dict[str, Any], list[str]]:
    with mock.profile("a100").open() as f:
        profile: dict[str, Any] = yaml.safe_load(f)
    profile = copy.deepcopy(profile)
    uuids = []
    for d in profile["devices"][:GPUS]:
        i = d["index"]
        uuids.append(d["uuid"])
        d["processes"] = [
            {
                "pid": 20000 + i * pods_per_gpu + j,
                "type": "C",
                "name": "python3",
                "used_memory_mib": 1024 + 64 * j,
                "sm_util": 10 + j,
                "mem_util": 5 + j,
            }
            for j in range(pods_per_gpu)
        ]
    return profile, uuids


class _Api:
    """The list and the watch of this node's pods, as kube-apiserver answers them."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.lists = 0
        self.watches = 0

    async def pods_handler(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("fieldSelector") != f"spec.nodeName={NODE}":
            return web.json_response({"kind": "Status", "code": 400}, status=400)
        if request.query.get("watch", "false").lower() in ("false", "0", ""):
            self.lists += 1
            return web.json_response(
                {
                    "kind": "PodList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": "1000"},
                    "items": self.pods,
                }
            )
        self.watches += 1
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        await resp.prepare(request)
        timeout = float(request.query.get("timeoutSeconds", "300"))
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while loop.time() < end:
            await asyncio.sleep(min(5.0, end - loop.time()))
            bookmark = {
                "type": "BOOKMARK",
                "object": {"kind": "Pod", "metadata": {"resourceVersion": "1000"}},
            }
            try:
                await resp.write(json.dumps(bookmark).encode() + b"\n")
            except ConnectionResetError:  # the exporter went away
                break
        return resp


async def _cancel_the_rest() -> None:
    """Watch handlers still streaming when the server stops."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.contextmanager
def _serve_api(api: _Api) -> Iterator[int]:
    """The stand-in API server on a loopback port, in a thread with its own loop."""
    app = web.Application()
    app.router.add_get("/api/v1/pods", api.pods_handler)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="bench-api", daemon=True)
    thread.start()
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    asyncio.run_coroutine_threadsafe(runner.setup(), loop).result(10)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    asyncio.run_coroutine_threadsafe(site.start(), loop).result(10)
    port = runner.addresses[0][1]
    try:
        yield port
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        asyncio.run_coroutine_threadsafe(_cancel_the_rest(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def pod_name(n: int) -> str:
    return f"train-{n:03d}"


@contextlib.contextmanager
def serve_pods(root: Path, placements: Sequence[tuple[int, str]]) -> Iterator[PodServices]:
    """Pod ``n`` of this node runs process ``placements[n][0]`` on the GPU whose UUID is
    ``placements[n][1]``: its host /proc entry under ``root``, the kubelet's pod-resources on a
    unix socket and the API's list and watch of this node's pods, served until the block ends."""
    host_proc = root / "proc"
    pods = []
    fixture = podresources_server.PodResourcesFixture()
    resources = []
    for n, (pid, uuid) in enumerate(placements):
        d = host_proc / str(pid)
        d.mkdir(parents=True)
        stat = ["S", "1", str(pid), str(pid), "0", "-1", "4194560", *["0"] * 12, "1000", *["0"] * 32]
        (d / "stat").write_text(f"{pid} (python3) {' '.join(stat)}\n")
        slice_ = f"/kubepods.slice/kubepods-pod{_uid(n).replace('-', '_')}.slice"
        (d / "cgroup").write_text(f"0::{slice_}/cri-containerd-{_cid(n)}.scope\n")
        pods.append(_pod(n, uuid))
        resources.append(
            podresources_server.pod_resources(NAMESPACE, pod_name(n), {"main": {"nvidia.com/gpu": [uuid]}})
        )
    fixture.pods = resources
    # Unix socket paths are limited to 107 bytes: a short directory of its own.
    sock_dir = Path(tempfile.mkdtemp(prefix="gpumon-pr-"))
    socket = sock_dir / "kubelet.sock"
    api = _Api(pods)
    with podresources_server.serve(socket, fixture), _serve_api(api) as port:
        kubeconfig = root / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "bench", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                    "users": [{"name": "bench", "user": {"token": "bench-token"}}],
                    "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
                    "current-context": "bench",
                }
            )
        )
        yield PodServices(host_proc, socket, kubeconfig, len(pods))


@contextlib.contextmanager
def mock_node(pods_per_gpu: int = 8) -> Iterator[MockNode]:
    mock = locate_mock_nvml()
    root = Path(tempfile.mkdtemp(prefix="gpumon-bench-"))
    profile, uuids = _profile(mock, pods_per_gpu)
    profile_path = root / "profile.yaml"
    profile_path.write_text(yaml.safe_dump(profile))
    placements = [
        (20000 + i * pods_per_gpu + j, uuid) for i, uuid in enumerate(uuids) for j in range(pods_per_gpu)
    ]
    with serve_pods(root, placements) as services:
        yield MockNode(root, mock, profile_path, services)
