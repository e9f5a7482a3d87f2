"""Wiring: config in, one aiohttp app out, owning every background task's lifetime.

The app serves ``/metrics``, ``/healthz`` (the event loop answers and no background task keeps
dying) and ``/readyz`` (the caches are filled and no background task died within the last
minute), with the exporter's TLS and auth options (:mod:`gpumon.httpauth`; the probes stay
open). Its ``cleanup_ctx`` starts the informers, the signal source, the leader election, the
reconciler, the autoscaler and the repair ladder under one
:class:`~gpumon.runtime.tasks.Supervisor` (each restarted with backoff when it dies, counted in
``gpumon_controller_task_restarts_total{task}``), and stops them in reverse order; a clean stop
hands the lease over at once. Informers and metrics run on every replica; only the leader writes.
The lease is renewed on a thread and connection of its own (:mod:`~gpumon.controller.shell.lease_thread`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpumon.config.controller import ControllerConfig
from gpumon.config.files import read_config_text
from gpumon.controller.act.device_taint import served
from gpumon.controller.act.events import EventRecorder
from gpumon.controller.act.evict import Evictor
from gpumon.controller.act.retry import RetryPolicy
from gpumon.controller.configure import build_policy, pool_from_config
from gpumon.controller.core.backoff import Backoff
from gpumon.controller.core.breaker import SafetyPolicy
from gpumon.controller.core.claims import ClaimView, SliceView, claim_from_json, slice_from_json
from gpumon.controller.core.device_taints import RULES_PATH, SELECTOR, RuleView, rule_from_json
from gpumon.controller.core.drain_plan import DrainPolicy, Escalation
from gpumon.controller.core.node_plan import QuarantinePolicy
from gpumon.controller.core.objects import (
    GpuResources,
    NodeView,
    PdbView,
    node_from_json,
    pdb_from_json,
)
from gpumon.controller.core.policy import Policy
from gpumon.controller.core.pools import Pool
from gpumon.controller.core.signals import SignalSource
from gpumon.controller.shell.autoscaler_loop import AutoscaleMetrics, Autoscaler, gpu_resources
from gpumon.controller.shell.leader import LeaderElector, LeaderSettings
from gpumon.controller.shell.lease_thread import LeaseThread
from gpumon.controller.shell.metrics import ClusterGauges, ControllerMetrics
from gpumon.controller.shell.node_pods import NodePods
from gpumon.controller.shell.remediation_loop import Reconciler, ReconcilerSettings
from gpumon.controller.shell.repair_loop import RepairLoop, RepairSettings
from gpumon.controller.shell.repair_metrics import RepairMetrics
from gpumon.controller.shell.signal_sources.direct import DirectSettings, DirectSource
from gpumon.controller.shell.signal_sources.endpoints import (
    DiscoveredEndpoints,
    Endpoints,
    FileEndpoints,
    StaticEndpoints,
)
from gpumon.controller.shell.signal_sources.prometheus import PrometheusSettings, PrometheusSource
from gpumon.httpauth.guard import Guard, guard
from gpumon.httpauth.tls import client_context
from gpumon.k8s.dra import RESOURCE_SLICES_PATH, resource_claims_path
from gpumon.kube.client import KubeApi, KubeClient, KubeError
from gpumon.kube.informer import Informer, Selection, View
from gpumon.kube.registry import Informers
from gpumon.runtime.tasks import Supervisor, TaskTrouble

log = logging.getLogger(__name__)


def build_settings(config: ControllerConfig, policy: Policy) -> ReconcilerSettings:
    d, b, r = config.drain, config.breaker, config.rate_limit
    return ReconcilerSettings(
        policy=policy,
        quarantine=QuarantinePolicy(cordon=config.quarantine.cordon),
        drain=DrainPolicy(
            enabled=d.enabled,
            on_degraded=d.on_degraded,
            deadline_seconds=d.deadline_seconds,
            escalation=Escalation(d.escalation),
        ),
        safety=SafetyPolicy(
            paused=config.paused,
            breaker_enabled=b.enabled,
            breaker_min_nodes=b.min_nodes,
            breaker_max_fraction=b.max_fraction,
            breaker_window_seconds=b.window_seconds,
            rate_limit_max=config.rate_limit.max_quarantines,
            rate_limit_window_seconds=r.window_seconds,
        ),
        dry_run=config.dry_run,
        namespace=config.namespace,
        state_configmap=config.state_configmap,
        retry=RetryPolicy(Backoff(d.retry_initial_seconds, d.retry_max_seconds)),
    )


def _read_token(path: Path | None, field: str) -> str | None:
    return None if path is None else read_config_text(path, "token file", field=field).strip()


# A background task that died starts again after 1 s, then 2, 4... up to 30 s.
TASK_BACKOFF = Backoff(initial_seconds=1.0, max_seconds=30.0)
# A failed list or watch is tried again after 0.5 s, then 1, 2... up to 30 s, spread by informer.
WATCH_BACKOFF = Backoff(initial_seconds=0.5, max_seconds=30.0)


@dataclass(frozen=True, slots=True)
class RemediationCaches:
    """What the reconciler reads of the cluster (the autoscaler shares PDBs and slices). No
    Pods: a node's are listed when a decision about it needs them (NodePods)."""

    nodes: View[NodeView]
    pdbs: View[PdbView]
    state: View[Mapping[str, str]]
    claims: View[ClaimView]
    slices: View[SliceView]
    # gpumon's DeviceTaintRules; None when quarantine.device_taints is off. Not among the
    # views that readiness waits for: its informer runs only if discovery finds the API.
    rules: View[RuleView] | None


@dataclass
class Controller:
    """Everything the app owns; tests reach in through the ``CONTROLLER`` key."""

    config: ControllerConfig
    api: KubeApi
    metrics: ControllerMetrics
    # Every list and watch of the process, one per selection; the views read them.
    informers: Informers
    caches: RemediationCaches
    reconciler: Reconciler
    elector: LeaseThread | None
    source: SignalSource
    session: aiohttp.ClientSession
    endpoints: Endpoints | None = None  # the direct source's exporters
    autoscaler: Autoscaler | None = None
    repair: RepairLoop | None = None  # with a pool that repairs (pools[].repair)
    supervisor: Supervisor = field(default_factory=lambda: Supervisor(delay=TASK_BACKOFF.delay))

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return self.supervisor.tasks

    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    @property
    def views(self) -> list[View[Any]]:
        """The caches readiness waits for."""
        extra = [self.endpoints.view] if isinstance(self.endpoints, DiscoveredEndpoints) else []
        extra += self.autoscaler.views if self.autoscaler is not None else []
        c = self.caches
        return [c.nodes, c.pdbs, c.state, c.claims, c.slices, *extra]


CONTROLLER = web.AppKey("controller", Controller)


def make_app(
    config: ControllerConfig,
    api: KubeApi,
    *,
    registry: CollectorRegistry | None = None,
    wall_clock: Callable[[], float] = time.time,
) -> web.Application:
    """Every part built and wired, in order: values from config, the caches, the leader
    election, the signal source, the two loops; nothing starts until the app does."""
    registry = registry or CollectorRegistry(auto_describe=True)
    metrics = ControllerMetrics(registry)
    metrics.dry_run.set(1 if config.dry_run else 0)
    policy = build_policy(config)
    settings = build_settings(config, policy)
    pools = [pool_from_config(p) for p in config.pools]
    resources = gpu_resources(_base_gpu_resources(config), pools)
    informers = _informers(metrics)
    caches = _remediation_caches(config, informers, resources, metrics)
    elector = _elector(config, api, metrics, wall_clock)

    def is_leader() -> bool:
        return elector is None or elector.is_leader()

    recorder = EventRecorder(
        api,
        instance=config.identity,
        wall_clock=wall_clock,
        on_result=lambda ok: metrics.events.labels("created" if ok else "failed").inc(),
    )
    evictor = Evictor(api, settings.retry)
    node_pods = NodePods(
        api,
        resources,
        evictor,
        on_list=lambda reader, result: metrics.pod_lists.labels(reader, result).inc(),
        on_skip=lambda reader: _api_errors(metrics, f"pods_{reader}")("malformed_object"),
    )
    supervisor = Supervisor(
        delay=TASK_BACKOFF.delay, on_restart=lambda task: metrics.task_restarts.labels(task).inc()
    )
    auth = guard(config.auth, on_error=_api_errors(metrics, "auth"), supervisor=supervisor, api=api)
    endpoints = _endpoints(config, informers, metrics)
    # The Prometheus source reads the nodes the reconciler holds state on GPU by GPU; it asks
    # only once the app runs, by when the reconciler below exists.
    source, session = _signals(
        config, policy, endpoints, metrics, wall_clock, held=lambda: reconciler.held_nodes()
    )
    reconciler = Reconciler(
        api=api,
        nodes=caches.nodes,
        node_pods=node_pods,
        pdbs=caches.pdbs,
        state=caches.state,
        claims=caches.claims,
        slices=caches.slices,
        source=source,
        is_leader=is_leader,
        recorder=recorder,
        evictor=evictor,
        metrics=metrics,
        settings=settings,
        wall_clock=wall_clock,
        rules=caches.rules,
    )
    _follow(caches, reconciler)
    autoscaler = None
    if pools:
        autoscaler = Autoscaler(
            api,
            pools,
            informers=informers,
            node_pods=node_pods,
            source=source,
            pdbs=caches.pdbs,
            slices=caches.slices,
            recorder=recorder,
            evictor=evictor,
            metrics=AutoscaleMetrics(registry),
            is_leader=is_leader,
            dry_run=config.dry_run,
            resources=resources,
            wall_clock=wall_clock,
            retry=settings.retry,
        )
    repair = None
    if any(p.repair is not None for p in pools):
        repair = _repair_loop(
            config,
            api,
            pools,
            caches,
            node_pods,
            source,
            recorder,
            evictor,
            reconciler,
            is_leader,
            registry,
            wall_clock,
        )
    controller = Controller(
        config=config,
        api=api,
        metrics=metrics,
        informers=informers,
        caches=caches,
        reconciler=reconciler,
        elector=elector,
        source=source,
        session=session,
        endpoints=endpoints,
        autoscaler=autoscaler,
        repair=repair,
        supervisor=supervisor,
    )
    registry.register(_cluster_gauges(controller))
    return _application(controller, auth)


def _base_gpu_resources(config: ControllerConfig) -> GpuResources:
    """What makes a pod a GPU pod, from the drain's config; the pools add theirs (pods using a
    pool's shared-GPU resources are GPU pods too: their node is never idle)."""
    d = config.drain
    return GpuResources(
        frozenset(d.gpu_resource_names), tuple(d.gpu_resource_prefixes), frozenset(d.gpu_dra_drivers)
    )


def _api_errors(metrics: ControllerMetrics, component: str) -> Callable[[str], None]:
    return lambda kind: metrics.api_errors.labels(component, kind).inc()


def _informers(metrics: ControllerMetrics) -> Informers:
    """The process's one informer per selection, its failures counted by informer and type."""
    return Informers(
        backoff=lambda attempt, name: WATCH_BACKOFF.delay(attempt, salt=sum(map(ord, name))),
        on_error=lambda name, e: _api_errors(metrics, name)(type(e).__name__),
    )


def _ignoring_version(a: NodeView, b: NodeView) -> bool:
    return replace(a, resource_version="") == replace(b, resource_version="")


def _remediation_caches(
    config: ControllerConfig, informers: Informers, resources: GpuResources, metrics: ControllerMetrics
) -> RemediationCaches:
    def of(path: str, *, labels: str = "", fields: str = "") -> Informer:
        return informers.informer(Selection(path, label_selector=labels, field_selector=fields))

    # DRA: the claims allocated GPU devices and the slices saying which GPU each device is.
    drivers = resources.drivers
    rules = None
    if config.quarantine.device_taints:
        rules = of(RULES_PATH, labels=SELECTOR).view(rule_from_json, name="devicetaintrules")
    metrics.device_taints_state("unknown" if rules is not None else "disabled")
    return RemediationCaches(
        nodes=of("/api/v1/nodes", labels=config.node_selector or "").view(
            node_from_json, name="nodes", same=_ignoring_version
        ),
        pdbs=of("/apis/policy/v1/poddisruptionbudgets").view(pdb_from_json, name="pdbs"),
        state=of(
            f"/api/v1/namespaces/{config.namespace}/configmaps",
            fields=f"metadata.name={config.state_configmap}",
        ).view(lambda obj: dict((obj.get("metadata") or {}).get("annotations") or {}), name="state"),
        claims=of(resource_claims_path()).view(
            lambda obj: claim_from_json(obj, drivers), name="resourceclaims"
        ),
        slices=of(RESOURCE_SLICES_PATH).view(
            lambda obj: slice_from_json(obj, drivers), name="resourceslices", index=lambda s: s.node
        ),
        rules=rules,
    )


def _follow(caches: RemediationCaches, reconciler: Reconciler) -> None:
    """The reconciler hears of every change of what it reads."""
    caches.nodes.on_change = reconciler.on_node
    caches.claims.on_change = reconciler.on_claim
    caches.slices.on_change = reconciler.on_slice
    if caches.rules is not None:
        caches.rules.on_change = reconciler.on_rule
    caches.state.on_change = lambda key, old, new: reconciler.mark(caches.nodes.items())


def _repair_loop(
    config: ControllerConfig,
    api: KubeApi,
    pools: list[Pool],
    caches: RemediationCaches,
    node_pods: NodePods,
    source: SignalSource,
    recorder: EventRecorder,
    evictor: Evictor,
    reconciler: Reconciler,
    is_leader: Callable[[], bool],
    registry: CollectorRegistry,
    wall_clock: Callable[[], float],
) -> RepairLoop:
    """The repair ladder of the pools that repair: it reads the quarantine's caches and signals,
    and is held by the quarantine's pause switch and breakers."""
    settings = reconciler.settings
    return RepairLoop(
        api=api,
        pools=pools,
        nodes=caches.nodes,
        node_pods=node_pods,
        source=source,
        recorder=recorder,
        evictor=evictor,
        is_leader=is_leader,
        safety=lambda: replace(settings.safety, paused=reconciler.paused()),
        open_breakers=reconciler.open_breakers,
        metrics=RepairMetrics(registry),
        settings=RepairSettings(
            policy=settings.policy,
            namespace=config.namespace,
            state_configmap=config.state_configmap,
            dry_run=config.dry_run,
        ),
        state=lambda: reconciler.state_annotations,
        wall_clock=wall_clock,
    )


# A lease request gives up at the renew deadline (a round slower than that leaves the replica not
# acting anyway), or sooner, as the controller's other requests do, so that a hung connection
# under a long deadline is tried again within it.
LEASE_REQUEST_SECONDS = 30.0
# A clean stop waits this long for the hand-over (one GET, one PUT); past it, the lease expires.
LEASE_STOP_SECONDS = 5.0


def _elector(
    config: ControllerConfig, api: KubeApi, metrics: ControllerMetrics, wall_clock: Callable[[], float]
) -> LeaseThread | None:
    """The lease's elector on its own thread; None without leader election (this replica always
    leads)."""
    if not config.leader.enabled:
        metrics.leader.set(1)
        return None
    leader = config.leader
    settings = LeaderSettings(
        leader.lease_duration_seconds, leader.renew_deadline_seconds, leader.retry_period_seconds
    )

    def elector(thread_api: KubeApi, on_change: Callable[[bool], None]) -> LeaderElector:
        return LeaderElector(
            thread_api,
            namespace=config.namespace,
            name=leader.lease_name,
            identity=config.identity,
            settings=settings,
            wall_clock=wall_clock,
            on_change=on_change,
        )

    return LeaseThread(
        elector,
        _lease_client(api, min(leader.renew_deadline_seconds, LEASE_REQUEST_SECONDS)),
        on_change=metrics.leading,
        stop_seconds=LEASE_STOP_SECONDS,
    )


def _lease_client(api: KubeApi, timeout: float) -> Callable[[], AbstractAsyncContextManager[KubeApi]]:
    """The lease thread's client: the controller's credentials on a connection of its own. A
    test double, bound to no loop, is used as it is."""
    if isinstance(api, KubeClient):
        credentials = api.credentials
        return lambda: KubeClient(credentials, request_timeout=timeout, connections=1)
    return lambda: nullcontext(api)


def _endpoints(
    config: ControllerConfig, informers: Informers, metrics: ControllerMetrics
) -> Endpoints | None:
    """Where the direct source finds the exporters: the map in config, the targets file, or
    else their pods through the API."""
    d = config.signals.direct
    if config.signals.source != "direct":
        return None
    if d.endpoints:
        return StaticEndpoints(d.endpoints)
    if d.targets_file is not None:
        return FileEndpoints(
            d.targets_file,
            node_label=d.targets_node_label,
            scheme=d.scheme,
            refresh_seconds=d.targets_refresh_seconds,
            on_error=lambda kind: metrics.signal_errors.labels("direct", kind).inc(),
        )
    return DiscoveredEndpoints(informers, d.namespace, d.label_selector, d.port, d.scheme)


def _signals(
    config: ControllerConfig,
    policy: Policy,
    endpoints: Endpoints | None,
    metrics: ControllerMetrics,
    wall_clock: Callable[[], float],
    held: Callable[[], Collection[str]] = frozenset,
) -> tuple[SignalSource, aiohttp.ClientSession]:
    """The signal source and the HTTP session it reads through (the app closes it)."""
    s = config.signals
    # Read before the session opens: a bad token or CA file must not leave it unclosed.
    bearer_token = (
        _read_token(s.prometheus.bearer_token_file, "signals.prometheus.bearer_token_file")
        if s.source == "prometheus"
        else _read_token(s.direct.bearer_token_file, "signals.direct.bearer_token_file")
    )
    exporter_tls = (
        client_context(s.direct.ca_file, "signals.direct.ca_file")
        if s.source == "direct" and s.direct.ca_file is not None
        else True
    )
    # Exporter streams are many and long-lived: no pool limit; snapshot fetches have their own.
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ssl=exporter_tls))
    source = _build_source(config, policy, endpoints, session, metrics, wall_clock, bearer_token, held)
    return source, session


def _cluster_gauges(controller: Controller) -> ClusterGauges:
    reconciler = controller.reconciler
    return ClusterGauges(
        quarantined=reconciler.quarantined_counts,
        breakers=lambda: reconciler.open_breakers(),
        pools=lambda: reconciler.pools(),
        signal_status=reconciler.signal_counts,
        synced=lambda: {v.name: v.synced.is_set() for v in controller.views},
        paused=reconciler.paused,
        overdue_drains=reconciler.overdue_drains,
    )


def _application(controller: Controller, auth: Guard) -> web.Application:
    """The HTTP face: /metrics, /healthz and /readyz behind the auth guard, and the lifespan that
    runs every task."""
    app = web.Application(middlewares=[auth.middleware])
    app[CONTROLLER] = controller
    app.cleanup_ctx.append(auth.lifespan)
    app.cleanup_ctx.append(_lifespan)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    return app


def _build_source(
    config: ControllerConfig,
    policy: Policy,
    endpoints: Endpoints | None,
    session: aiohttp.ClientSession,
    metrics: ControllerMetrics,
    wall_clock: Callable[[], float],
    bearer_token: str | None,
    held: Callable[[], Collection[str]] = frozenset,
) -> SignalSource:
    s = config.signals
    window = policy.health.xid_window_seconds
    if s.source == "prometheus":
        p = s.prometheus

        def on_round(ok: bool, seconds: float) -> None:
            metrics.signal_rounds.labels("success" if ok else "failure").inc()

        return PrometheusSource(
            PrometheusSettings(
                url=p.url,
                interval_seconds=s.interval_seconds,
                timeout_seconds=p.timeout_seconds,
                retries=p.retries,
                xid_window_seconds=window,
                stale_after_seconds=policy.stale_after_seconds,
                node_label=p.node_label,
                bearer_token=bearer_token,
                verdicts=any(pool.repair is not None for pool in config.pools),
                busy=bool(config.pools),
            ),
            policy.rules,
            session,
            wall_clock=wall_clock,
            on_round=on_round,
            held=held,
        )
    d = s.direct
    assert endpoints is not None, "_endpoints gives the direct source one"
    return DirectSource(
        DirectSettings(
            heartbeat_seconds=s.heartbeat_seconds,
            poll_interval_seconds=d.poll_interval_seconds,
            timeout_seconds=d.timeout_seconds,
            max_concurrency=d.max_concurrency,
            bearer_token=bearer_token,
            server_name=d.server_name,
            lines_per_second=d.lines_per_second,
            line_burst=d.line_burst,
        ),
        endpoints,
        session,
        wall_clock=wall_clock,
        on_error=lambda kind: metrics.signal_errors.labels("direct", kind).inc(),
        on_refusal=lambda node, kind: metrics.exporter_refusals.labels(node, kind).inc(),
        on_refusals_forgotten=metrics.forget_refusals,
    )


async def _lifespan(app: web.Application) -> AsyncIterator[None]:
    controller = app[CONTROLLER]
    source = controller.source
    start = controller.supervisor.start

    rules = controller.caches.rules
    deferred = rules.informer if rules is not None else None
    for informer in controller.informers.informers:
        if informer is not deferred:
            start(f"informer {informer.name}", functools.partial(informer.run, controller.api))
    if isinstance(controller.endpoints, FileEndpoints):
        start("exporter targets file", controller.endpoints.run)
    start(f"signals {source.name}", functools.partial(source.run, controller.reconciler.mark))
    if controller.elector is not None:
        elector = controller.elector
        start("leader election", elector.run)

        async def follow_leadership() -> None:
            while True:
                await elector.leader_changed.wait()
                elector.leader_changed.clear()
                controller.reconciler.leadership_gained()

        start("leadership changes", follow_leadership)
    start("reconciler", controller.reconciler.run)
    if rules is not None:
        start("device taints", functools.partial(_device_taints, controller, rules))
    if controller.autoscaler is not None:
        start("autoscaler", controller.autoscaler.run)
    if controller.repair is not None:
        start("repair", controller.repair.run)
    yield
    # Stop acting and hand the lease over first: from here on no write passes is_leader() (one
    # already past it may still land, as when a lease lapses), and a standby takes over without
    # waiting a lease duration. A replica whose tasks were cancelled first (stopped dead) has no
    # lease thread left and releases nothing.
    if controller.elector is not None:
        await controller.elector.release()
    await controller.supervisor.stop()
    await controller.session.close()


DISCOVERY_BACKOFF = Backoff(initial_seconds=1.0, max_seconds=60.0)


async def _device_taints(controller: Controller, rules: View[RuleView]) -> None:
    """Ask once whether the API server serves DeviceTaintRules (retrying only while it cannot
    be reached); if it does, keep gpumon's rules cached and let the reconciler write them,
    otherwise say so once and stay idle: an absent API is a cluster's choice, not an error."""
    attempt = 0
    while True:
        try:
            found = await served(controller.api)
            break
        except KubeError as e:
            attempt += 1
            await asyncio.sleep(DISCOVERY_BACKOFF.delay(attempt))
            log.debug("device taint discovery failed; retrying", extra={"error": str(e)})
    if not found:
        controller.metrics.device_taints_state("unserved")
        log.info(
            "DeviceTaintRules are not served (resource.k8s.io/v1beta2 devicetaintrules, gate "
            "DRADeviceTaintRules): bad GPUs' DRA devices are not tainted; the node taint and the "
            "drain still apply"
        )
        await asyncio.Event().wait()
    controller.metrics.device_taints_state("active")
    run = asyncio.ensure_future(rules.informer.run(controller.api))
    try:
        await rules.synced.wait()
        controller.reconciler.rules_served()
        await run
    finally:
        run.cancel()


async def _metrics(request: web.Request) -> web.Response:
    registry = request.app[CONTROLLER].metrics.registry
    return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


def _troubles(what: str, troubles: list[TaskTrouble]) -> str:
    return what + ": " + ", ".join(f"{t.name} ({t.deaths}x, {t.error})" for t in troubles) + "\n"


async def _healthz(request: web.Request) -> web.Response:
    # Only a task that keeps dying makes the kubelet restart us: one restart heals in place.
    looping = request.app[CONTROLLER].supervisor.crashlooping()
    if looping:
        return web.Response(status=503, text=_troubles("crashlooping", looping))
    return web.Response(text="ok\n")


async def _readyz(request: web.Request) -> web.Response:
    controller = request.app[CONTROLLER]
    waiting = [v.name for v in controller.views if not v.synced.is_set()]
    if waiting:
        return web.Response(status=503, text="caches not synced: " + ", ".join(waiting) + "\n")
    restarting = controller.supervisor.restarting()
    if restarting:
        return web.Response(status=503, text=_troubles("restarted", restarting))
    return web.Response(text="ok\n")
