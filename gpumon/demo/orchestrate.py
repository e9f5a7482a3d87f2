"""Running the demo: start every part, play the scenario's steps against the live cluster,
report, stop everything.

Parts, in order: the local control plane (devcluster) with Cluster API's own manager and the
kwok infrastructure provider on it, a real Prometheus when installed, the namespaces, the pool
(a Cluster and its MachineDeployment) and the nodes outside it, the node agents (pod-resources,
gpushare placement) and one exporter per node as nodes join, the controller (``gpumon
controller --act`` as a subprocess), then the workloads. One observer loop reads the cluster
twice a second; the display, the agents, the exporters and the step
checks all work from its latest :class:`ClusterView`.

Every process is started from the main thread through devcluster's supervision (own process
group, killed with us), and stopped in reverse order on the way out, Ctrl-C included.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Protocol

import aiohttp

from gpumon.demo import expect, fleet
from gpumon.demo.agents import NodeAgents
from gpumon.demo.exporters import ExporterFleet
from gpumon.demo.observe import Observer
from gpumon.demo.render import HeaderStatus
from gpumon.demo.scenario import Expect, Scenario, ScenarioStep
from gpumon.demo.views import ClusterView
from gpumon.devcluster import capi, cluster_api, nodes, processes
from gpumon.devcluster.binaries import ToolsMissing
from gpumon.devcluster.cluster import DevCluster, StartupError, free_ports
from gpumon.devcluster.localservers import ControllerProcess, PrometheusProcess
from gpumon.devcluster.state import alive
from gpumon.kube.client import KubeClient, KubeError
from gpumon.kube.kubeconfig import from_kubeconfig

log = logging.getLogger(__name__)
OBSERVE_INTERVAL_SECONDS = 0.5
READY_TIMEOUT_SECONDS = 180.0


class DemoError(Exception):
    """The demo could not start or a step did not reach its state; the message says which."""


@dataclass(frozen=True, slots=True)
class Paths:
    root: Path

    @property
    def cluster(self) -> Path:
        return self.root / "cluster"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def exporters(self) -> Path:
        return self.root / "exporters"

    @property
    def prometheus(self) -> Path:
        return self.root / "prometheus"

    @property
    def controller(self) -> Path:
        return self.root / "controller"

    @property
    def targets(self) -> Path:
        return self.root / "exporter-targets.json"

    @property
    def pid(self) -> Path:
        return self.root / "demo.pid"

    @property
    def log(self) -> Path:
        return self.root / "demo.log"

    @property
    def report(self) -> Path:
        return self.root / "report.json"


@dataclass(frozen=True, slots=True)
class RunOptions:
    scenario: Scenario
    paths: Paths
    step_timeout_seconds: float = 120.0
    keep: bool = False


@dataclass(frozen=True, slots=True)
class StepResult:
    name: str
    expect: str
    met: bool
    seconds: float
    detail: str


@dataclass(frozen=True, slots=True)
class Report:
    ready_seconds: float | None = None
    steps: tuple[StepResult, ...] = ()
    total_seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.steps) and all(s.met for s in self.steps)


class Display(Protocol):
    """Where the demo shows itself: a live table or log lines (:mod:`gpumon.demo.render`)."""

    def status(self, status: HeaderStatus) -> None:
        """What the demo is doing now."""

    def view(self, view: ClusterView) -> None:
        """The cluster as just observed."""

    def say(self, line: str) -> None:
        """A milestone worth a line of its own."""


def claim(paths: Paths) -> None:
    """Make ``paths.root`` this demo's: refuse if another demo runs from it, else clear it."""
    try:
        other = int(paths.pid.read_text())
    except (FileNotFoundError, ValueError):
        other = None
    if other is not None and alive(other):
        raise DemoError(
            f"a demo is already running from {paths.root} (pid {other}); stop it or pick another --state-dir"
        )
    shutil.rmtree(paths.root, ignore_errors=True)
    paths.root.mkdir(parents=True)
    paths.pid.write_text(str(os.getpid()))


@dataclass
class _Live:
    """The observer loop's latest view, and an event set whenever a new one arrives."""

    view: ClusterView | None = None
    fresh: asyncio.Event = field(default_factory=asyncio.Event)

    async def next(self) -> ClusterView:
        self.fresh.clear()
        await self.fresh.wait()
        assert self.view is not None
        return self.view


def run(options: RunOptions, display: Display, clock: Callable[[], float] = time.monotonic) -> Report:
    """Start everything, play the scenario, stop everything; ``options.paths`` must have been
    claimed (:func:`claim`). A failed start or step is in the report; Ctrl-C stops everything, then
    raises KeyboardInterrupt."""
    started = clock()
    paths = options.paths
    report = Report()
    try:
        with contextlib.ExitStack() as stack:
            display.status(HeaderStatus("starting the local control plane"))
            cluster = DevCluster.start(paths.cluster)
            stack.callback(cluster.stop)
            shutil.copyfile(cluster.kubeconfig, paths.kubeconfig)
            display.status(HeaderStatus("starting Cluster API's manager"))
            capi_running = cluster_api.start(cluster)
            scenario = options.scenario
            ports = free_ports(fleet.ports_needed(scenario) + 1)
            the_fleet = fleet.build(scenario, ports[:-1])
            prometheus = None
            if PrometheusProcess.binary() is not None:
                display.status(HeaderStatus("starting Prometheus"))
                prometheus = PrometheusProcess(paths.prometheus, scrape_interval="2s")
                stack.callback(prometheus.stop)
                paths.targets.write_text("[]")
                try:
                    prometheus.start(
                        fleet.prometheus_config(targets_file=paths.targets, controller_port=ports[-1])
                    )
                except (RuntimeError, TimeoutError) as e:  # the demo works without it
                    prometheus.stop()
                    prometheus = None
                    display.say(f"going on without Prometheus: {str(e).splitlines()[0]}")
            controller = ControllerProcess(
                paths.controller,
                fleet.controller_config(
                    the_fleet,
                    scenario,
                    kubeconfig=paths.kubeconfig,
                    port=ports[-1],
                    targets_file=paths.targets,
                ),
                "--act",
                port=ports[-1],
            )
            stack.callback(controller.stop)
            links = [
                ("kubeconfig", f"export KUBECONFIG={paths.kubeconfig}"),
                ("exporters", f"every node's /metrics address is in {paths.targets}"),
                ("controller metrics", f"{controller.url}/metrics"),
            ]
            if prometheus is not None:
                links.append(("Prometheus UI", f"{prometheus.url}/graph"))
            play = _Play(options, display, the_fleet, controller, links, started, clock, capi_running)
            report = asyncio.run(play.run())
    except (DemoError, ToolsMissing, StartupError) as e:
        report = replace(report, error=str(e))
    finally:
        paths.pid.unlink(missing_ok=True)
    report = replace(report, total_seconds=clock() - started)
    paths.report.write_text(json.dumps(asdict(report), indent=2))
    return report


class _Play:
    def __init__(
        self,
        options: RunOptions,
        display: Display,
        the_fleet: fleet.Fleet,
        controller: ControllerProcess,
        links: list[tuple[str, str]],
        started: float,
        clock: Callable[[], float],
        capi_running: cluster_api.ClusterApiRunning,
    ) -> None:
        self.o = options
        self.capi = capi_running
        self.s = options.scenario
        self.display = display
        self.fleet = the_fleet
        self.controller = controller
        self.links = links
        self.started = started
        self.clock = clock
        self.live = _Live()
        self.replicas = self.s.workload.replicas
        self.broken: tuple[expect.Broken, ...] = ()
        self.repaired: tuple[expect.Broken, ...] = ()  # what the last repaired step brought back
        # Repair Jobs whose command's effect the demo has played on the simulated GPUs.
        self.played: set[str] = set()
        self.report = Report()

    def status(self, title: str, detail: str = "") -> None:
        self.display.status(HeaderStatus(title, detail, self.clock() - self.started, tuple(self.links)))

    async def run(self) -> Report:
        main = asyncio.current_task()
        assert main is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
        try:
            async with self._parts():
                return await self._scenario()
        except asyncio.CancelledError:
            raise KeyboardInterrupt from None

    @contextlib.asynccontextmanager
    async def _parts(self) -> AsyncIterator[None]:
        paths = self.o.paths
        credentials = from_kubeconfig(paths.kubeconfig)
        async with KubeClient(credentials) as api, aiohttp.ClientSession() as session:
            agents = NodeAgents(api)
            exporters = ExporterFleet(
                self.fleet,
                self.s,
                paths.exporters,
                agents=agents,
                kubeconfig=paths.kubeconfig,
                targets_file=paths.targets,
            )
            self.api, self.session, self.exporters, self.agents = api, session, exporters, agents
            try:
                self.status("creating the fleet")
                await self._create_fleet()
                self.observer = asyncio.create_task(
                    self._observe(Observer(api, exporters, session)), name="observer"
                )
                try:
                    yield
                finally:
                    self.observer.cancel()
                    await asyncio.gather(self.observer, return_exceptions=True)
            finally:
                await asyncio.to_thread(exporters.stop_all)
                agents.close()

    async def _observe(self, observer: Observer) -> None:
        shared = {s.name: fleet.SHARED_GIB_PER_GPU for s in self.fleet.static if s.template.shared}
        while True:
            t = time.monotonic()
            try:
                view = await observer.view()
                await self.exporters.sync(view)
                await self.agents.sync(view, shared)
            except (KubeError, aiohttp.ClientError, TimeoutError) as e:
                log.warning("observing the cluster failed", extra={"error": repr(e)})
            else:
                self.live.view = view
                self.live.fresh.set()
                self.display.view(view)
            await asyncio.sleep(max(0.05, OBSERVE_INTERVAL_SECONDS - (time.monotonic() - t)))

    async def _create_fleet(self) -> None:
        for ns in fleet.namespaces():
            await self.api.post("/api/v1/namespaces", ns)
        await self.api.post(
            f"/api/v1/namespaces/{fleet.CONTROLLER_NAMESPACE}/configmaps", fleet.controller_configmap()
        )
        for obj in fleet.pool_objects(self.fleet, self.s, manager_kubeconfig=self.capi.kubeconfig_yaml):
            await self.api.post(capi.collection_path(obj), obj)
        for spec in self.fleet.static:
            await self.api.post("/api/v1/nodes", nodes.manifest(spec.name, spec.template))

    async def _next_view(self, deadline: float) -> ClusterView | None:
        """The next observed view, or None when the deadline passes first."""
        if self.observer.done():
            raise DemoError(f"observing the cluster stopped: {self.observer.exception()!r}")
        try:
            async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                return await self.live.next()
        except TimeoutError:
            return None

    async def _until(self, what: str, ok: Callable[[ClusterView], bool], seconds: float) -> ClusterView:
        deadline = time.monotonic() + seconds
        while True:
            view = await self._next_view(deadline)
            if view is not None and ok(view):
                return view
            if time.monotonic() > deadline:
                raise DemoError(f"{what}: not reached in {seconds:.0f} s; logs in {self.o.paths.root}")

    async def _start_controller_and_workloads(self) -> None:
        want_static = {s.name for s in self.fleet.static}

        def fleet_up(v: ClusterView) -> bool:
            pool = v.pool_nodes()
            return (
                len(pool) == self.s.fleet.pool_nodes
                and all(n.ready and n.gpu_resources for n in pool)
                and want_static <= {n.name for n in v.nodes if n.ready}
                and all(n.name in v.gpus for n in v.nodes)
            )

        self.status("booting the pool and the exporters")
        await self._until("every node Ready with its exporter answering", fleet_up, READY_TIMEOUT_SECONDS)
        self.status("starting the controller")
        self.controller.spawn()
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not await asyncio.to_thread(self.controller.leading):
            if not self.controller.running:
                raise DemoError(
                    f"the controller exited; last lines of {self.controller.log_path}:\n"
                    + processes.tail(self.controller.log_path)
                )
            if time.monotonic() > deadline:
                raise DemoError(
                    f"the controller was not ready in {READY_TIMEOUT_SECONDS:.0f} s; "
                    f"see {self.controller.log_path}"
                )
            await asyncio.sleep(0.3)
        for obj in fleet.workloads(self.s):
            if obj["kind"] == "Deployment":
                await self.api.post(f"/apis/apps/v1/namespaces/{fleet.NAMESPACE}/deployments", obj)
            else:
                await self.api.post(f"/apis/policy/v1/namespaces/{fleet.NAMESPACE}/poddisruptionbudgets", obj)

    async def _scenario(self) -> Report:
        try:
            await self._start_controller_and_workloads()
        except DemoError as e:
            return Report(error=str(e))
        except KubeError as e:
            return Report(error=f"the API server refused a demo object: {e}")
        ready = self.clock() - self.started
        self.report = Report(ready_seconds=ready)
        self.display.say(f"ready in {ready:.1f} s")
        for what, where in self.links:
            self.display.say(f"{what}: {where}")
        for i, step in enumerate(self.s.steps, start=1):
            result = await self._step(i, step)
            self.report = replace(self.report, steps=(*self.report.steps, result))
            if not result.met:
                break
        if self.o.keep:
            self.status(
                "scenario "
                + ("done" if self.report.ok else "FAILED")
                + ": everything keeps running; Ctrl-C stops it",
                self._summary(),
            )
            self.display.say(
                f"measured: ready {self.report.ready_seconds:.1f} s, {self._summary()}; "
                "everything keeps running (--keep), Ctrl-C stops it"
            )
            await asyncio.Event().wait()
        return self.report

    def _summary(self) -> str:
        return ", ".join(
            f"{s.name} {s.seconds:.0f} s" + ("" if s.met else " (FAILED)") for s in self.report.steps
        )

    def _context(self, view: ClusterView) -> expect.StepContext:
        return expect.StepContext(
            apps=fleet.expected_apps(self.s, self.replicas),
            attributed_app=fleet.WORKLOAD,
            pool_desired_before=view.pool.desired if view.pool else 0,
            broken=self.broken,
        )

    async def _step(self, number: int, step: ScenarioStep) -> StepResult:
        title = f"step {number}/{len(self.s.steps)}: {step.name}"
        self.display.say(f"{title}: {step.say}" if step.say else title)
        t0 = self.clock()
        view = self.live.view or await self.live.next()
        ctx = self._context(view)
        try:
            await self._act(step, view)
        except DemoError as e:
            return StepResult(step.name, step.expect.value, False, self.clock() - t0, str(e))
        ctx = replace(ctx, apps=fleet.expected_apps(self.s, self.replicas), broken=self.broken)
        timeout = step.timeout_seconds or self.o.step_timeout_seconds
        deadline = time.monotonic() + timeout
        outcome = expect.ExpectOutcome(False, "no view of the cluster since the step began")
        while not outcome.met:
            if time.monotonic() > deadline:
                detail = f"not {step.expect.value} in {timeout:.0f} s: {outcome.detail}"
                self.display.say(f"{title}: FAILED, {detail}")
                return StepResult(step.name, step.expect.value, False, self.clock() - t0, detail)
            self.status(f"{title}: waiting until {step.expect.value}", outcome.detail)
            seen = await self._next_view(deadline)  # always one observed after the action
            if seen is not None:
                if step.repair:
                    await self._play_repairs(seen)
                resized = self._resized(step, seen, ctx)
                if resized:
                    self.display.say(f"{title}: FAILED, {resized}")
                    return StepResult(step.name, step.expect.value, False, self.clock() - t0, resized)
                outcome = expect.check(step.expect, seen, ctx)
        seconds = self.clock() - t0
        if step.expect is Expect.REPAIRED:
            self.repaired = self.broken
        if step.expect in (Expect.RECOVERED, Expect.REPAIRED, Expect.REPLACED):
            self.broken = ()
        self.display.say(f"{title}: {step.expect.value} after {seconds:.1f} s: {outcome.detail}")
        self.status(f"{title}: {step.expect.value}", outcome.detail)
        if step.hold_seconds:
            await asyncio.sleep(step.hold_seconds)
        return StepResult(step.name, step.expect.value, True, seconds, outcome.detail)

    @staticmethod
    def _resized(step: ScenarioStep, view: ClusterView, ctx: expect.StepContext) -> str | None:
        """A replacement is a swap: the pool's size holds throughout, or the step has failed."""
        if step.expect is not Expect.REPLACED or view.pool is None:
            return None
        if view.pool.desired == ctx.pool_desired_before:
            return None
        return (
            f"the pool's replicas went {ctx.pool_desired_before} -> {view.pool.desired} "
            "during the replacement; a replacement must keep the pool's size"
        )

    async def _act(self, step: ScenarioStep, view: ClusterView) -> None:
        if step.inject is not None:
            node, gpu = self._target(step, view)
            victims = next((g.pods for g in view.gpus.get(node, ()) if g.index == gpu), ())
            await self._inject(node, step.inject.body(gpu))
            self.broken = (*self.broken, expect.Broken(node, gpu, tuple(victims)))
            self.display.say(
                f"  {step.inject.fault} on {node} GPU {gpu}, held by {', '.join(victims) or 'no pod'}"
            )
        elif step.clear:
            for b in self.broken:
                await self._inject(b.node, {"fault": "clear", "gpu": b.gpu})
                self.display.say(f"  reset {b.node} GPU {b.gpu}")
        elif step.repair:
            for b in self.broken:
                await self._inject(b.node, {"fault": "recovery_action", "gpu": b.gpu, "action": "gpu_reset"})
                self.display.say(
                    f"  the driver asks for a GPU reset of {b.node} GPU {b.gpu} (recovery action GPU_RESET)"
                )
        elif step.scale is not None:
            self.replicas = step.scale
            await self.api.patch(
                f"/apis/apps/v1/namespaces/{fleet.NAMESPACE}/deployments/{fleet.WORKLOAD}/scale",
                {"spec": {"replicas": step.scale}},
            )
            self.display.say(f"  {fleet.WORKLOAD} scaled to {step.scale} replicas")

    async def _play_repairs(self, view: ClusterView) -> None:
        """kwok runs no containers: it completes a repair Job's pod without running its command.
        Once a node's reset Job has succeeded, the demo does to the simulated GPUs what
        ``nvidia-smi --gpu-reset`` does to real ones (fault ``clear``), as the cluster tests do;
        the controller then must see the exporter report them healthy with action NONE."""
        for node in dict.fromkeys(b.node for b in self.broken):
            done = [
                j for j in view.jobs_of(node, "reset") if j.state == "succeeded" and j.name not in self.played
            ]
            if not done:
                continue
            self.played.update(j.name for j in done)
            gpus = [b.gpu for b in self.broken if b.node == node]
            for gpu in gpus:
                await self._inject(node, {"fault": "clear", "gpu": gpu})
            self.display.say(
                f"  reset Job {done[-1].name} succeeded: kwok completed its pod, no nvidia-smi ran; the "
                f"demo resets {node} GPU {', '.join(map(str, gpus))} in the simulator, as the command would"
            )

    async def _inject(self, node: str, body: dict[str, object]) -> None:
        try:
            await self.exporters.inject(self.session, node, body)
        except RuntimeError as e:
            raise DemoError(str(e)) from None

    def _target(self, step: ScenarioStep, view: ClusterView) -> tuple[str, int]:
        """The node and GPU a fault goes to: as given, else a pool GPU holding a workload pod."""
        assert step.inject is not None
        if step.inject.again:
            if not self.repaired:
                raise DemoError("inject.again: no earlier step repaired a GPU")
            return self.repaired[0].node, self.repaired[0].gpu
        node, gpu = step.inject.node, step.inject.gpu
        prefix = f"{fleet.NAMESPACE}/{fleet.WORKLOAD}-"
        candidates = [
            (n.name, g.index)
            for n in view.pool_nodes()
            if node in (None, n.name)
            for g in view.gpus.get(n.name, ())
            if gpu in (None, g.index) and any(p.startswith(prefix) for p in g.pods)
        ]
        if candidates:
            return candidates[0]
        if node is not None:
            return node, gpu or 0
        raise DemoError("no pool GPU holds a workload pod to break; give inject.node and inject.gpu")
