"""The autoscaler's imperative shell: caches in, :func:`~gpumon.controller.core.scale_plan.plan_pools`
in the middle, thin idempotent writes out.

Actuation, one function per action: read a target's ``/scale`` (with the target's annotations),
patch ``spec.replicas`` as a JSON merge patch with an explicit integer (so 0 is written, not
dropped) guarded by the resourceVersion that was read (a concurrent change answers 409 and
the round is planned again), write the autoscaler's record on the target, cordon a node and
drain it through the Eviction API (:class:`~gpumon.controller.core.drain_plan.Evictor`, PDBs hold), mark
it and its Cluster API Machine with ``cluster.x-k8s.io/delete-machine``.

Only the leader plans and writes; the caches (pending GPU pods, each pool's nodes) run on every
replica, as views of the process's informers (:class:`~gpumon.kube.registry.Informers`): the
ResourceClaims it reads are the reconciler's watch too. Which pool nodes run GPU pods comes
from the exporters' per-pod signals, or, for a node they do not show busy, from one list of its
pods (:meth:`Autoscaler.busy_nodes`): there is no cache of the fleet's pods. With ``dry_run``
every decision is an Event and a log line, and nothing is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpumon.controller.act.events import EventRecorder
from gpumon.controller.act.evict import EvictionResult, Evictor
from gpumon.controller.act.machine_mark import mark_for_deletion
from gpumon.controller.act.node_write import cordon_for_removal, uncordon
from gpumon.controller.act.retry import DEFAULT_RETRY, Outcome, RetryPolicy, outcome
from gpumon.controller.act.scale import set_replicas, write_record
from gpumon.controller.core.claims import SliceView
from gpumon.controller.core.contract import DELETE_MACHINE_ANNOTATION, DRY_RUN_PREFIX
from gpumon.controller.core.demand import REFUSAL_KINDS, PodDemand, pending_gpu_pod, refusal, with_claims
from gpumon.controller.core.device_claims import (
    ClaimRequests,
    DeviceClassView,
    claim_requests,
    device_class_view,
)
from gpumon.controller.core.objects import GpuResources, PdbView, PodView, from_rfc3339, pdbs_covering
from gpumon.controller.core.plans import DrainTarget, Event, ObjectRef
from gpumon.controller.core.pools import Pool, PoolNode, ScaleState, ScaleTarget, pool_node_from_json
from gpumon.controller.core.scale_plan import Action, PoolInput, PoolPlan, plan_pools, removal_record
from gpumon.controller.core.signals import NodeReading, SignalSource
from gpumon.controller.read import read_scale
from gpumon.controller.shell.node_pods import NodePods
from gpumon.k8s.dra import DEVICE_CLASSES_PATH, resource_claims_path
from gpumon.k8s.dra_cel import compile_selector
from gpumon.kube.client import Conflict, KubeApi, KubeError, NotFound
from gpumon.kube.informer import Selection, View
from gpumon.kube.registry import Informers

log = logging.getLogger(__name__)

# Pods no scheduler has placed yet: the demand a pool may have to grow for.
PENDING_UNBOUND = "spec.nodeName=,status.phase=Pending"


def gpu_resources(base: GpuResources, pools: Iterable[Pool]) -> GpuResources:
    """``base`` plus every GPU resource a pool's template offers, so a node running pods that
    use shared GPUs (``aliyun.com/gpu-mem``) is never taken for idle, and every DRA driver a
    template's devices belong to."""
    names, drivers = set(base.names), set(base.drivers)
    for pool in pools:
        names |= pool.template.gpu_resources
        if pool.template.dra is not None:
            # Its nodes' slices are read (ready once published), its devices' holders drained.
            drivers |= {d.ref.driver for d in pool.template.dra.devices}
    return replace(base, names=frozenset(names), drivers=frozenset(drivers))


# ---------------------------------------------------------------------------------------------
# Whether a node runs GPU pods


def shows_gpu_pods(reading: NodeReading | None) -> bool:
    """The exporter places pods on the node's GPUs: busy, without asking the API. Its silence
    proves nothing (an exporter that does not attribute pods, one not heard from yet), so a
    node without such a reading is asked about through the API."""
    return reading is not None and reading.busy


def _stays(pod: PodView) -> bool:
    """Pods a node keeps until it goes: the kubelet's (mirror) and the node's own (DaemonSet)."""
    return pod.mirror or pod.owner_kind == "DaemonSet" or pod.finished


def _keeps_node(pod: PodView) -> bool:
    """A GPU pod that keeps its node from being scaled down: one asking for a GPU resource, or
    holding DRA claims (whatever their devices: a node is never taken from under a claim)."""
    return (pod.uses_gpu or bool(pod.claims)) and not _stays(pod)


# ---------------------------------------------------------------------------------------------
# Metrics


class AutoscaleMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.replicas = Gauge(
            "gpumon_autoscaler_replicas",
            "A pool's replicas: current (spec of its /scale target), status (what exists), desired "
            "(last plan), min, max.",
            ["pool", "kind"],
            registry=registry,
        )
        self.pending_pods = Gauge(
            "gpumon_autoscaler_pending_pods",
            "Unschedulable GPU pods a pool can host.",
            ["pool"],
            registry=registry,
        )
        self.refused_pods = Gauge(
            "gpumon_autoscaler_refused_pods",
            "Pending GPU pods the autoscaler never counts as demand, reported (kind: cgpu_core_step, a "
            "gpu-core.percentage not a multiple of 5; dra_unsupported, a ResourceClaim form the planner "
            "does not evaluate; dra_unevaluable, a DRA selector with no value on a template's devices).",
            ["kind"],
            registry=registry,
        )
        self.arriving_nodes = Gauge(
            "gpumon_autoscaler_arriving_nodes",
            "Nodes requested but not registered, or registered without allocatable GPUs, still counted.",
            ["pool"],
            registry=registry,
        )
        self.refused = Gauge(
            "gpumon_autoscaler_pool_refused",
            "1 while a pool is not scaled (cluster-autoscaler or Karpenter manages it, bad bounds, "
            "unreadable target).",
            ["pool"],
            registry=registry,
        )
        self.plans = Counter(
            "gpumon_autoscaler_plans",
            "Plans by pool, action and result (applied, dry_run, conflict, error, refused, none, not_leader)",
            ["pool", "action", "result"],
            registry=registry,
        )
        self.plan_duration = Histogram(
            "gpumon_autoscaler_plan_duration_seconds",
            "Time to plan every pool once (pure planning, no API calls).",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
            registry=registry,
        )
        self.pending_to_request = Histogram(
            "gpumon_autoscaler_pending_to_request_seconds",
            "From the first pod of a scale-up being found unschedulable to the /scale patch.",
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
            registry=registry,
        )

    def observe(self, plan: PoolPlan, scale: ScaleState | None) -> None:
        self.refused.labels(plan.pool).set(1 if plan.action is Action.REFUSED else 0)
        if plan.action is Action.REFUSED or scale is None:
            return
        for kind, value in (
            ("status", scale.status_replicas),
            ("current", plan.current),
            ("desired", plan.desired),
            ("min", plan.min_replicas),
            ("max", plan.max_replicas),
        ):
            self.replicas.labels(plan.pool, kind).set(value)
        self.pending_pods.labels(plan.pool).set(plan.pending)
        self.arriving_nodes.labels(plan.pool).set(plan.arriving)


# ---------------------------------------------------------------------------------------------
# The loop


@dataclass(frozen=True, slots=True)
class LoopSettings:
    # A round at least this often: cooldowns, idle timers and drains move on without events.
    resync_seconds: float = 10.0
    # After a change, wait this long for more (pods of one Job arrive together) before planning.
    debounce_seconds: float = 0.5


class Autoscaler:
    """Plans every pool on changes and on a timer, and carries the plans out (leader only)."""

    def __init__(
        self,
        api: KubeApi,
        pools: Sequence[Pool],
        *,
        informers: Informers,
        node_pods: NodePods,
        source: SignalSource,
        pdbs: View[PdbView],
        recorder: EventRecorder,
        slices: View[SliceView] | None = None,
        evictor: Evictor,
        metrics: AutoscaleMetrics,
        is_leader: Callable[[], bool],
        dry_run: bool,
        resources: GpuResources,
        settings: LoopSettings = LoopSettings(),
        wall_clock: Callable[[], float] = time.time,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        self._retry = retry
        self._api = api
        self.pools = tuple(pools)
        self._node_pods = node_pods
        self._source = source
        self._pdbs = pdbs
        self._slices = slices
        self._recorder = recorder
        self._evictor = evictor
        self.metrics = metrics
        self._is_leader = is_leader
        self.dry_run = dry_run
        self.settings = settings
        self._wall = wall_clock
        self._wake = asyncio.Event()
        self.pending: View[PodDemand] = informers.informer(
            Selection("/api/v1/pods", field_selector=PENDING_UNBOUND)
        ).view(
            lambda obj: pending_gpu_pod(obj, resources, from_rfc3339),
            name="pending-gpu-pods",
            on_change=self._changed,
        )
        # DRA: the claims pending pods name and the DeviceClasses they ask for, watched only when
        # a pool's template publishes devices (a cluster without DRA may not serve the API).
        self.claims: View[ClaimRequests] | None = None
        self.device_classes: View[DeviceClassView] | None = None
        if any(pool.template.dra is not None for pool in pools):
            self.claims = informers.informer(Selection(resource_claims_path(None))).view(
                lambda obj: claim_requests(obj, compile_selector),
                name="resource-claims",
                on_change=self._changed,
            )
            self.device_classes = informers.informer(Selection(DEVICE_CLASSES_PATH)).view(
                lambda obj: device_class_view(obj, compile_selector),
                name="device-classes",
                on_change=self._changed,
            )
        self.nodes: dict[str, View[PoolNode]] = {
            pool.name: informers.informer(Selection("/api/v1/nodes", label_selector=pool.node_selector)).view(
                self._node_converter(pool),
                name=f"pool-nodes-{pool.name}",
                on_change=self._changed,
            )
            for pool in pools
        }
        # Observations that are not in the cluster; after a restart they start again from now,
        # which only ever delays a scale-down or makes new capacity wait to settle.
        self._idle_since: dict[str, float] = {}
        self._ready_since: dict[str, float] = {}
        self._unregistered_since: dict[str, float] = {}
        self._skip_until: dict[str, float] = {}
        self.rounds = 0

    @staticmethod
    def _node_converter(pool: Pool) -> Callable[[Mapping[str, Any]], PoolNode]:
        return lambda obj: pool_node_from_json(obj, pool.template)

    @property
    def views(self) -> list[View[Any]]:
        dra = [v for v in (self.claims, self.device_classes) if v is not None]
        return [self.pending, *dra, *self.nodes.values()]

    def pending_demand(self) -> list[PodDemand]:
        """The pending pods, their DRA claims resolved: without claims to read, pods that name
        claims are no demand."""
        claims = self.claims.items() if self.claims is not None else {}
        classes = self.device_classes.items() if self.device_classes is not None else {}
        out = []
        for pod in self.pending.items().values():
            resolved = with_claims(pod, claims, classes)
            if resolved is not None:
                out.append(resolved)
        return out

    def _changed(self, key: str, old: object, new: object) -> None:
        self._wake.set()

    # -- observing ----------------------------------------------------------------------------

    def _devices_published(self, pool: Pool, node: PoolNode) -> PoolNode:
        """A node of a DRA template has its GPUs once its driver published a ResourceSlice of
        them (as a device plugin's node has them once they are allocatable): until then it is
        joining, arriving capacity, and after the timeout a node whose GPUs never came."""
        dra = pool.template.dra
        if dra is None or self._slices is None or not dra.devices or not node.gpus_allocatable:
            return node
        driver = dra.devices[0].ref.driver
        published = any(d.ref.driver == driver for s in self._slices.indexed(node.name) for d in s.devices)
        return node if published else replace(node, gpus_allocatable=False)

    async def busy_nodes(self) -> set[str]:
        """The pool nodes running GPU pods. Those the exporters show busy cost nothing; every
        other node (idle, or its exporter not telling) is asked about with one list of its
        pods: a node is room for pending pods and a scale-down candidate only on that answer.
        A list that fails counts the node busy, which never removes a node and never takes it
        for room."""
        fleet = self._source.current()
        busy = set()
        for pool in self.pools:
            for name in self.nodes[pool.name].items():
                if shows_gpu_pods(fleet.nodes.get(name)):
                    busy.add(name)
                    continue
                try:
                    pods = await self._node_pods.list(name, "scale_down")
                except KubeError as e:
                    log.warning(
                        "a pool node's pods could not be listed", extra={"node": name, "error": str(e)}
                    )
                    busy.add(name)
                    continue
                if any(_keeps_node(p) for p in pods):
                    busy.add(name)
        return busy

    def inputs(
        self, scales: Mapping[str, ScaleState | str], busy_nodes: Collection[str], now: float
    ) -> list[PoolInput]:
        """What the planner sees of every pool; ``scales`` holds each target's state, or the
        error reading it, ``busy_nodes`` the nodes running GPU pods (:meth:`busy_nodes`)."""
        seen: set[str] = set()
        out = []
        for pool in self.pools:
            nodes = tuple(self._devices_published(pool, n) for n in self.nodes[pool.name].items().values())
            busy = set()
            for n in nodes:
                seen.add(n.name)
                if n.name in busy_nodes:
                    busy.add(n.name)
                    self._idle_since.pop(n.name, None)
                else:
                    self._idle_since.setdefault(n.name, now)
                if n.gpus_allocatable:
                    self._ready_since.setdefault(n.name, now)
                else:
                    self._ready_since.pop(n.name, None)
            scale = scales.get(pool.name)
            if isinstance(scale, ScaleState) and scale.spec_replicas > len(nodes):
                self._unregistered_since.setdefault(pool.name, now)
            else:
                self._unregistered_since.pop(pool.name, None)
            out.append(
                PoolInput(
                    pool=pool,
                    scale=scale if isinstance(scale, ScaleState) else None,
                    nodes=nodes,
                    busy=frozenset(busy),
                    idle_since=dict(self._idle_since),
                    unregistered_since=self._unregistered_since.get(pool.name),
                    ready_since=dict(self._ready_since),
                    skip_until=dict(self._skip_until),
                    read_error=scale if isinstance(scale, str) else "",
                )
            )
        for table in (self._idle_since, self._ready_since, self._skip_until):
            for gone in [k for k in table if k not in seen]:
                del table[gone]
        return out

    # -- the loop -----------------------------------------------------------------------------

    async def run(self) -> None:
        for view in (*self.views, self._pdbs):
            await view.synced.wait()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.resync_seconds):
                    await self._wake.wait()
            if self._wake.is_set():
                await asyncio.sleep(self.settings.debounce_seconds)
            self._wake.clear()
            if not self._is_leader():
                continue
            try:
                await self.round()
            except Exception:
                log.exception("autoscaling round failed; retrying")
                await asyncio.sleep(self._retry.round_retry_seconds)
                self._wake.set()

    async def round(self) -> tuple[PoolPlan, ...]:
        self.rounds += 1
        scales: dict[str, ScaleState | str] = {}
        for pool in self.pools:
            try:
                scales[pool.name] = await read_scale(self._api, pool.target)
            except KubeError as e:
                scales[pool.name] = str(e)
        busy = await self.busy_nodes()
        now = self._wall()
        inputs = self.inputs(scales, busy, now)
        started = time.perf_counter()
        pending = self.pending_demand()
        plans = plan_pools(inputs, pending, now)
        self.metrics.plan_duration.observe(time.perf_counter() - started)
        await self._report_refused(pending)
        by_pool = {i.pool.name: i for i in inputs}
        for plan in plans:
            inp = by_pool[plan.pool]
            self.metrics.observe(plan, inp.scale)
            await self._record_notes(inp, plan)
            try:
                result = await self._apply(inp, plan, now)
            except KubeError as e:
                if outcome(e) is Outcome.REPLAN:
                    result = "conflict"  # someone changed the target since it was read: plan again
                    self._wake.set()
                else:
                    result = "error"
                    log.warning("autoscaling write failed", extra={"pool": plan.pool, "error": str(e)})
            self.metrics.plans.labels(plan.pool, plan.action.value, result).inc()
        return plans

    async def _report_refused(self, pending: Sequence[PodDemand]) -> None:
        """One Event per pending pod no scheduler would place (the planner never counts them),
        and their number by kind."""
        counts: dict[str, int] = {}
        prefix = DRY_RUN_PREFIX if self.dry_run else ""
        templates = [pool.template for pool in self.pools]
        for pod in pending:
            refused = refusal(pod, templates)
            if refused is None:
                continue
            counts[refused.kind] = counts.get(refused.kind, 0) + 1
            ref = ObjectRef("Pod", pod.name, pod.uid, pod.namespace)
            event = Event(ref, "GpuRequestRefused", refused.message, warning=True, key=f"refused:{pod.uid}")
            await self._recorder.record(event, prefix=prefix)
        for kind in REFUSAL_KINDS:
            self.metrics.refused_pods.labels(kind).set(counts.get(kind, 0))

    async def _record_notes(self, inp: PoolInput, plan: PoolPlan) -> None:
        target = inp.pool.target
        ref = ObjectRef(
            target.kind, target.name, inp.scale.uid if inp.scale else "", target.namespace, target.api_version
        )
        prefix = DRY_RUN_PREFIX if self.dry_run else ""
        for note in plan.notes:
            await self._recorder.record(
                Event(ref, note.reason, note.message, warning=note.warning, key=note.key), prefix=prefix
            )

    # -- acting -------------------------------------------------------------------------------

    async def _apply(self, inp: PoolInput, plan: PoolPlan, now: float) -> str:
        if plan.action is Action.REFUSED:
            return "refused"
        if self.dry_run:
            if plan.action is not Action.NONE:
                log.info("dry-run: not scaling", extra={"pool": plan.pool, "plan": plan.reason})
            return "dry_run" if plan.action is not Action.NONE else "none"
        if not self._is_leader():
            return "not_leader"  # lost the lease during the round: the next leader plans again
        assert inp.scale is not None
        target, rv = inp.pool.target, inp.scale.resource_version
        for node in plan.abandon:
            await self._give_up(node, now, inp.pool)
        match plan.action:
            case Action.SCALE_UP:
                await self._scale_up(inp, plan, now)
            case Action.FINISH_REMOVAL:
                await set_replicas(self._api, target, plan.desired, rv)
                log.info("scaled down", extra={"pool": plan.pool, "replicas": plan.desired})
            case Action.SCALE_DOWN:
                await self._scale_down(inp, plan, now)
            case _:
                if plan.record_changed:
                    await write_record(self._api, target, plan.record, rv)
                return "none"
        return "applied"

    async def _scale_up(self, inp: PoolInput, plan: PoolPlan, now: float) -> None:
        assert inp.scale is not None
        target = inp.pool.target
        rv = await set_replicas(self._api, target, plan.desired, inp.scale.resource_version)
        log.info(
            "scale request",
            extra={
                "pool": plan.pool,
                "from": plan.current,
                "to": plan.desired,
                # What the target reported before: how many machines exist, which they are.
                "status_replicas": inp.scale.status_replicas,
                "selector": inp.scale.selector,
            },
        )
        waited = [
            pod.pending_since
            for pod in self.pending.items().values()
            if pod.key in plan.pods and pod.pending_since is not None
        ]
        if waited:
            self.metrics.pending_to_request.observe(max(0.0, self._wall() - min(waited)))
        # Advisory: without it, requested replicas still count as arriving capacity.
        try:
            await self._record_scale_up(target, plan, rv)
        except KubeError as e:
            log.warning("could not write the autoscaler record", extra={"pool": plan.pool, "error": str(e)})

    async def _record_scale_up(self, target: ScaleTarget, plan: PoolPlan, rv: str) -> None:
        """The record of a scale-up just written, over the version that write returned. A
        target's own controller may write it in between: Cluster API's MachineDeployment
        controller writes the MachineDeployment as soon as its replicas change (on v1.13.6 a
        step-limit test lost one record of three that way, and the cooldown then counts from
        an older scale-up). Then the target is read again and, its replicas still the ones just
        written, the record goes over that version; a target whose replicas moved meanwhile is
        left to the next round's plan."""
        try:
            await write_record(self._api, target, plan.record, rv)
            return
        except Conflict:
            again = await read_scale(self._api, target)
        if again.spec_replicas != plan.desired:
            log.warning(
                "autoscaler record not written: the target's replicas moved",
                extra={"pool": plan.pool, "replicas": again.spec_replicas},
            )
            return
        await write_record(self._api, target, plan.record, again.resource_version)

    async def _give_up(self, node: str, now: float, pool: Pool) -> None:
        with contextlib.suppress(NotFound):
            await uncordon(self._api, node)
        self._skip_until[node] = now + pool.scale_down_unneeded_seconds

    async def _scale_down(self, inp: PoolInput, plan: PoolPlan, now: float) -> None:
        assert inp.scale is not None
        pool = inp.pool
        views = {n.name: n for n in inp.nodes}
        drained: list[PoolNode] = []
        for name in plan.drain:
            node = views[name]
            if await self._drain(node, pool, now):
                drained.append(node)
        if not drained:
            return
        for node in drained:
            if not node.marked:
                await mark_for_deletion(self._api, node, pool.target)
        record, replicas = removal_record(plan, [n.name for n in drained], now)
        # The record first: a restart before the patch finds it and finishes the removal.
        rv = await write_record(self._api, pool.target, record, inp.scale.resource_version)
        await set_replicas(self._api, pool.target, replicas, rv)
        names = ", ".join(n.name for n in drained)
        await self._recorder.record(
            Event(
                ObjectRef(
                    pool.target.kind,
                    pool.target.name,
                    inp.scale.uid,
                    pool.target.namespace,
                    pool.target.api_version,
                ),
                "GpuPoolScaledDown",
                f"scaled {pool.target} {plan.current} -> {replicas}: removed idle {names} "
                f"(marked {DELETE_MACHINE_ANNOTATION})",
                key=f"removed:{names}",
            )
        )

    async def _drain(self, node: PoolNode, pool: Pool, now: float) -> bool:
        """Cordon and evict; True once only pods that stay with the node are left."""
        pods = await self._node_pods.list(node.name, "scale_down")
        if any(_keeps_node(p) for p in pods):
            # A GPU pod got there after the plan was made: leave the node in service.
            if node.removing_since is not None:
                await self._give_up(node.name, now, pool)
            return False
        if node.removing_since is None:
            await cordon_for_removal(self._api, node.name, now)
        left = [p for p in pods if not _stays(p)]
        pdbs = list(self._pdbs.items().values())
        for pod in left:
            if pod.terminating:
                continue
            target = DrainTarget(pod, f"scale-down of node {node.name}", pdbs_covering(pod, pdbs))
            out = await self._evictor.run(target, now=now, delete=False, dry_run=False)
            if out.result is EvictionResult.BLOCKED:
                await self._recorder.record(
                    Event(
                        ObjectRef("Node", node.name, node.name),
                        "GpuPoolEvictionBlocked",
                        f"scale-down eviction of {pod.namespace}/{pod.name} refused: {out.detail}",
                        warning=True,
                        key=f"blocked:{pod.uid}",
                    )
                )
        return not left
