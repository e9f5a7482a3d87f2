"""One gpumon exporter per node of a node pool, with per-pod attribution from real sources, and
a GPU load the test turns up and down.

kwok runs no kubelet and no container, so what a GPU node would have is played here for the
nodes that match a label selector, as they come and go:

- the exporter: gpumon's own exporter app (:func:`gpumon.exporter.server.make_app`) on one
  simulated GPU, with the real :class:`~gpumon.exporter.attribution.PodAttribution` (pod
  watch through the API, /proc cgroups, kubelet pod-resources), served on a loopback port.
  It runs in this process because the simulated backend's run-time control of what the GPU's
  processes do (``SimulatedBackend.set_processes``) is a method, not an endpoint;
- the kubelet's part: a pod-resources server on a unix socket saying which pod holds the GPU,
  and a host /proc tree with the pod's GPU process in the pod's cgroup;
- the workload: each running pod of the workload on a node has one process on that node's GPU
  keeping ``level`` of its SMs busy.

Prometheus finds the exporters through a file_sd targets file written here.

Every wait here has a deadline (:data:`STOP_SECONDS`): an exporter that does not stop is a bug
in it, reported with the stacks of its tasks that are still running, not a test that hangs
until pytest's timeout."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from devcluster_fixtures import gpumon_credentials
from fake_host_proc import cgroup_file, container_path, write_process
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from gpumon.config import ExporterConfig, PodsConfig, SamplingConfig, SimulationConfig
from gpumon.devcluster import podresources_server
from gpumon.devcluster.nodes import GPU
from gpumon.devcluster.podresources_server import PodResourcesFixture, pod_resources
from gpumon.devices.simulated import SimProcess, SimulatedBackend
from gpumon.exporter.attribution import build_attribution
from gpumon.exporter.self_metrics import SelfMetrics
from gpumon.exporter.server import make_app
from gpumon.kube.client import KubeClient

GIB = 1 << 30
POD_GPU_MEMORY = 16 * GIB
# An exporter stops in well under a second (its sampler, its pod watch, its server's grace of 2 s).
STOP_SECONDS = 20.0


class StuckError(AssertionError):
    """Something did not finish within its deadline; the message says what and where it is."""


async def _finish(aw: Any, what: str, seconds: float = STOP_SECONDS) -> None:
    """Await ``aw`` for at most ``seconds``, in a task of its own: a deadline that does not rely
    on the awaited code honouring a cancellation (what is being tested here). On the deadline,
    raise with the stack of every task still running, which shows where it is stuck."""
    task = asyncio.ensure_future(aw)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if done:
        task.result()
        return
    stacks = io.StringIO()
    for t in asyncio.all_tasks():
        if t is not asyncio.current_task():
            t.print_stack(limit=8, file=stacks)
    raise StuckError(f"{what}: not done after {seconds:.0f}s; tasks still running:\n{stacks.getvalue()}")


@dataclass
class NodeExporter:
    node: str
    backend: SimulatedBackend
    kubelet: PodResourcesFixture
    host_proc: Path
    runner: web.AppRunner
    port: int
    stack: contextlib.ExitStack
    holder: tuple[str, int] | None = None  # (pod UID, its process's pid) on GPU 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def uuid(self) -> str:
        return self.backend.devices()[0].uuid


@dataclass
class PoolExporters:
    api: client.ApiClient
    node_selector: str  # the pool's nodes
    namespace: str  # the workload's pods: this namespace ...
    pod_selector: str  # ... and label selector; one container each, one GPU each
    workdir: Path
    targets_file: Path  # Prometheus file_sd
    level: float = 0.0  # SM busy fraction of every workload pod's process
    running: dict[str, NodeExporter] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _next_pid: int = 20000
    _seed: int = 0
    _task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self._core = client.CoreV1Api(self.api)
        self._kube = KubeClient(gpumon_credentials(self.api))  # the exporters' own client, on our identity
        self._sockets = Path(tempfile.mkdtemp(prefix="gpumon-e2e-"))  # a socket path holds 107 bytes
        self._write_targets()

    async def _start(self, node: str) -> NodeExporter:
        root = self.workdir / node
        (root / "proc").mkdir(parents=True, exist_ok=True)
        self._seed += 1
        stack = contextlib.ExitStack()
        socket = self._sockets / f"{self._seed}.sock"
        kubelet = stack.enter_context(podresources_server.serve(socket, PodResourcesFixture()))
        config = ExporterConfig(
            node_name=node,
            listen_address="127.0.0.1",
            port=0,  # bound below, and read back: no free port that another process takes meanwhile
            backend="simulated",
            simulation=SimulationConfig(gpus=1, seed=self._seed),
            sampling=SamplingConfig(fast_interval_seconds=1, slow_interval_seconds=1),
            pods=PodsConfig(pod_resources_socket=socket, host_proc=root / "proc", api=True),
        )
        backend = SimulatedBackend(1, config.simulation.model, seed=config.simulation.seed)
        backend.set_processes(0, [])  # idle until a workload pod lands
        # What `gpumon exporter` wires (gpumon/exporter/command.py), with the pod watch on our client.
        metrics = SelfMetrics(CollectorRegistry(auto_describe=True), backend=config.backend)
        attributor = build_attribution(
            config.pods,
            node,
            call_timeout_seconds=config.sampling.call_timeout_seconds,
            pods_api=self._kube,
        )
        metrics.registry.register(attributor.metrics)
        app = make_app(config, backend, metrics=metrics, attributor=attributor)
        app.cleanup_ctx.insert(0, attributor.lifespan)
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=2)
        await runner.setup()
        await web.TCPSite(runner, config.listen_address, config.port).start()
        port = int(runner.addresses[0][1])
        return NodeExporter(node, backend, kubelet, root / "proc", runner, port, stack)

    async def _stop(self, exporter: NodeExporter) -> None:
        await _finish(exporter.runner.cleanup(), f"stopping the exporter of {exporter.node}")
        exporter.stack.close()

    def check(self) -> None:
        """Raise what ended the loop that keeps the exporters in step with the pool, if it ended:
        otherwise the test would only see the load stop following ``level``."""
        if self._task is not None and self._task.done() and not self._task.cancelled():
            error = self._task.exception()
            raise AssertionError(f"the pool exporters' loop ended: {error!r}") from error

    def _write_targets(self) -> None:
        doc = [{"targets": sorted(e.target for e in self.running.values()), "labels": {}}]
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.targets_file)  # Prometheus never reads half a file

    def _place(self, exporter: NodeExporter, pod: Any | None) -> None:
        """``pod`` (or nobody) holds the node's GPU and runs its process at ``level``."""
        uid = pod.metadata.uid if pod is not None else None
        if exporter.holder is not None and exporter.holder[0] != uid:
            shutil.rmtree(exporter.host_proc / str(exporter.holder[1]), ignore_errors=True)
            exporter.holder = None
        if pod is None:
            exporter.kubelet.pods = ()
            exporter.backend.set_processes(0, [])
            return
        container = pod.spec.containers[0].name
        if exporter.holder is None:
            pid, self._next_pid = self._next_pid, self._next_pid + 1
            # The container ID is not in kwok's pod status: the exporter goes by the pod's UID.
            path = container_path("systemd", "containerd", "guaranteed", uid, f"{pid:064x}")
            write_process(exporter.host_proc, pid, cgroup_file(path, 2))
            exporter.holder = (uid, pid)
            exporter.kubelet.pods = (
                pod_resources(pod.metadata.namespace, pod.metadata.name, {container: {GPU: [exporter.uuid]}}),
            )
        exporter.backend.set_processes(0, [SimProcess(exporter.holder[1], POD_GPU_MEMORY, self.level)])

    async def sync(self) -> None:
        nodes = {
            n.metadata.name for n in (await self._core.list_node(label_selector=self.node_selector)).items
        }
        for name in sorted(nodes - self.running.keys()):
            self.running[name] = await self._start(name)
        for name in sorted(self.running.keys() - nodes):
            await self._stop(self.running.pop(name))
        self._write_targets()
        pods = (await self._core.list_namespaced_pod(self.namespace, label_selector=self.pod_selector)).items
        on_node = {
            p.spec.node_name: p
            for p in pods
            if p.spec.node_name and p.status.phase == "Running" and p.metadata.deletion_timestamp is None
        }
        for name, exporter in self.running.items():
            self._place(exporter, on_node.get(name))

    async def _loop(self, closing: asyncio.Event) -> None:
        while not closing.is_set():
            try:
                await self.sync()
            except (ApiException, aiohttp.ClientError, TimeoutError) as e:
                self.errors.append(repr(e))  # the API hiccuped: the next round catches up
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closing.wait(), 0.5)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[PoolExporters]:
        # Stopped by a flag, not cancelled: a cancellation landing inside an exporter's
        # cleanup would be swallowed there (its cleanup awaits the tasks it cancels under
        # `suppress(CancelledError)`), and the loop would go on for ever.
        closing = asyncio.Event()
        self._task = asyncio.create_task(self._loop(closing), name="pool-exporters")
        try:
            yield self
        finally:
            closing.set()
            try:
                await _finish(self._task, "the pool exporters' loop, told to stop")
            finally:
                for exporter in list(self.running.values()):
                    await self._stop(exporter)
                self.running.clear()
                await self._kube.close()
                shutil.rmtree(self._sockets, ignore_errors=True)
