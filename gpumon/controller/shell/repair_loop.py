"""The repair ladder's imperative shell: each round reads the nodes of the pools that repair,
plans each quarantined one (:func:`gpumon.controller.core.repair.plan_repair`), admits the
round's new disruptive steps as one batch through the quarantine's breaker and rate limit, and
carries out the moves: the record on the Node first, then the step's Job, so that a leader that
dies between the two leaves an attempt whose Job the next one creates (under the same name).
Each round lists the pods of every node on a ladder through the API (:mod:`.node_pods`): its GPU
pods say whether its GPUs and the node are free; before a reboot, which takes every pod down,
all its pods do, and are evicted, PDBs holding, until the node is free.

Only the leader plans and writes. Dry-run records the Events (prefixed) and writes nothing; as
dry-run never quarantines, its ladders never start.

The replacement step is carried out and followed by
:class:`gpumon.controller.shell.replacements.ReplacementStep`; a node that neither Cluster API nor
Karpenter owns gives up with a report.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpumon.controller.act.breaker_record import record_breaker
from gpumon.controller.act.events import EventRecorder
from gpumon.controller.act.evict import EvictionResult, Evictor
from gpumon.controller.act.repair_jobs import ensure_job, read_job, write_record
from gpumon.controller.core import contract as c
from gpumon.controller.core.breaker import PoolView, SafetyPolicy
from gpumon.controller.core.contract import DRY_RUN_PREFIX
from gpumon.controller.core.contract.breakers import BreakerTrip, breaker_to_annotation
from gpumon.controller.core.contract.node import is_excluded, quarantined_at, records_from_json
from gpumon.controller.core.contract.repair import (
    LADDER,
    AttemptOutcome,
    LadderStep,
    RepairRecord,
    record_from_json,
    replacements_from_annotations,
)
from gpumon.controller.core.objects import NodeView, PodView, node_from_json
from gpumon.controller.core.plans import DrainTarget, Event, ObjectRef
from gpumon.controller.core.policy import Policy, signal_status
from gpumon.controller.core.pools import Pool
from gpumon.controller.core.repair import (
    Machinery,
    Move,
    RepairInput,
    RepairPlan,
    Work,
    holding_the_node,
    needs_the_nodes_pods,
    plan_repair,
    quarantine_verdict,
    targets,
)
from gpumon.controller.core.repair_gate import admit_repairs, continuing_refusal
from gpumon.controller.core.repair_jobs import PoolRepair, job_manifest, job_name, job_work
from gpumon.controller.core.signals import NodeReading, SignalSource
from gpumon.controller.shell.api_access import ApiAccess
from gpumon.controller.shell.node_pods import NodePods
from gpumon.controller.shell.repair_metrics import RepairMetrics
from gpumon.controller.shell.replacements import ReplacementStep
from gpumon.k8s.selectors import parse_selector
from gpumon.kube.client import KubeApi, KubeError
from gpumon.kube.informer import View

log = logging.getLogger(__name__)

_JOB_STEPS = frozenset({LadderStep.RESET, LadderStep.REBOOT, LadderStep.VALIDATE})


@dataclass(frozen=True, slots=True)
class RepairSettings:
    policy: Policy  # signals' staleness and the Xid window, as the quarantine judges them
    namespace: str  # where the Jobs run: the controller's own
    state_configmap: str = "gpumon-controller"  # where a tripped breaker is recorded
    dry_run: bool = True
    interval_seconds: float = 5.0


class _Ladders(Collector):
    """Scrape-time: each repairing pool's nodes by where their ladder stands, read off the
    records in the node cache (every replica, so the gauge never goes stale with leadership)."""

    def __init__(self, members: Callable[[], Iterable[tuple[str, RepairRecord]]]) -> None:
        self._members = members

    def collect(self) -> Iterable[GaugeMetricFamily]:
        repairing = GaugeMetricFamily(
            "gpumon_controller_repairing_nodes",
            "Nodes with a repair ladder under way, by pool.",
            labels=["pool"],
        )
        gave_up = GaugeMetricFamily(
            "gpumon_controller_repair_gave_up_nodes",
            "Nodes whose repair ladder gave up and wait for a person, by pool.",
            labels=["pool"],
        )
        counts: dict[str, tuple[int, int]] = {}
        for pool, record in self._members():
            active, stuck = counts.get(pool, (0, 0))
            counts[pool] = (active + record.active, stuck + (record.gave_up_at is not None))
        for pool, (active, stuck) in sorted(counts.items()):
            repairing.add_metric([pool], active)
            gave_up.add_metric([pool], stuck)
        yield repairing
        yield gave_up


@dataclass(frozen=True, slots=True)
class _Member:
    view: NodeView
    pool: Pool
    repair: PoolRepair
    record: RepairRecord


class RepairLoop:
    def __init__(
        self,
        *,
        api: KubeApi,
        pools: Sequence[Pool],
        nodes: View[NodeView],
        node_pods: NodePods,
        source: SignalSource,
        recorder: EventRecorder,
        evictor: Evictor,
        is_leader: Callable[[], bool],
        safety: Callable[[], SafetyPolicy],
        open_breakers: Callable[[], Mapping[str, BreakerTrip]],
        metrics: RepairMetrics,
        settings: RepairSettings,
        state: Callable[[], Mapping[str, str]] = dict,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._pools = [(p, parse_selector(p.node_selector)) for p in pools if p.repair is not None]
        self._nodes = nodes
        self._node_pods = node_pods
        self._source = source
        self._recorder = recorder
        self._evictor = evictor
        self._is_leader = is_leader
        self._safety = safety
        self._open_breakers = open_breakers
        self._metrics = metrics
        self.settings = settings
        self._wall = wall_clock
        self.rounds = 0
        self._jobs = ApiAccess()
        self._state = state
        self._replacements = ReplacementStep(
            api=api,
            recorder=recorder,
            metrics=metrics,
            namespace=settings.namespace,
            state_configmap=settings.state_configmap,
            state=state,
            wall_clock=wall_clock,
        )
        metrics.registry.register(_Ladders(self._ladders))

    async def run(self) -> None:
        await self._nodes.synced.wait()
        while True:
            if self._is_leader():
                await self.round()
            await asyncio.sleep(self.settings.interval_seconds)

    def _ladders(self) -> Iterable[tuple[str, RepairRecord]]:
        for m in self._members():
            yield m.pool.name, m.record
        for r in replacements_from_annotations(self._state()):
            if r.gave_up_at is not None:  # its Node is gone: the ConfigMap keeps the give-up
                yield r.pool, RepairRecord(gave_up_at=r.gave_up_at)

    def _members(self) -> list[_Member]:
        out = []
        for view in self._nodes.items().values():
            for pool, selector in self._pools:
                if pool.repair is not None and selector.matches(view.labels):
                    record = record_from_json(view.annotations.get(c.ANNOTATION_REPAIR))
                    out.append(_Member(view, pool, pool.repair, record))
                    break
        return out

    async def round(self) -> None:
        self.rounds += 1
        now = self._wall()
        fleet = self._source.current()
        members = self._members()
        repairing: dict[str, set[str]] = {}
        for m in members:
            if m.record.active:
                repairing.setdefault(m.pool.name, set()).add(m.view.name)
        planned: list[tuple[_Member, RepairInput, RepairPlan]] = []
        # The pods that must leave each node before its reboot, where the node's pods were listed.
        holders: dict[str, list[PodView]] = {}
        for m in members:
            if quarantined_at(m.view) is None and not m.record.attempts and m.record.gave_up_at is None:
                continue  # healthy and never repaired: the common case, nothing to read
            pods = await self._pods_of(m.view.name)
            inp = await self._input(m, fleet.nodes.get(m.view.name), pods, repairing, now)
            if pods is not None and needs_the_nodes_pods(
                inp,
                now=now,
                policy=m.repair.policy,
                xid_window_seconds=self.settings.policy.health.xid_window_seconds,
            ):
                holders[m.view.name] = holding_the_node(pods)
                inp = replace(inp, node_free=not holders[m.view.name])
            planned.append((m, inp, self._plan(m, inp, now)))
        safety, breakers = self._safety(), self._open_breakers()
        refused: dict[str, str] = {}
        wanted = []
        for m, inp, p in planned:
            if not p.needs_admission:
                continue
            if m.record.active:  # the next step of a ladder under way: counted when it began
                why = continuing_refusal(m.pool.name, breakers, safety)
                if why is not None:
                    refused[m.view.name] = why
            else:
                wanted.append((m.view.name, m.pool.name, inp.quarantined_at or now))
        if wanted:
            admission = admit_repairs(wanted, self._pool_views(members), breakers, now=now, policy=safety)
            refused.update(admission.refused)
            for trip in admission.tripped:
                await self._record_trip(trip)
        for m, inp, plan in planned:
            if m.view.name in refused:
                plan = self._plan(m, inp, now, refused[m.view.name])
            if plan.drain_node and continuing_refusal(m.pool.name, breakers, safety) is not None:
                plan = replace(plan, drain_node=False)  # evicting is disruptive: held the same way
            await self._apply(m, inp, plan, holders.get(m.view.name, ()))
        if not self.settings.dry_run and self._is_leader():
            pools = {p.name: p for p, _ in self._pools}
            await self._replacements.follow(now, self._nodes.items(), pools)  # as this round left them

    async def _record_trip(self, trip: BreakerTrip) -> None:
        """A wave of ladders tripped the pool's breaker: recorded on the controller's ConfigMap
        as the quarantine records its own trips, so it stays open until a person closes it."""
        ns, name = self.settings.namespace, self.settings.state_configmap
        key, _ = breaker_to_annotation(trip)
        message = (
            f"circuit breaker for pool {trip.pool!r} opened by repairs: {trip.reason}; "
            f"remove annotation {key} to close it"
        )
        event = Event(
            ObjectRef("ConfigMap", name, namespace=ns), "GpuBreakerOpen", message, warning=True, key=key
        )
        await self._recorder.record(event, prefix=DRY_RUN_PREFIX if self.settings.dry_run else "")
        if self.settings.dry_run or not self._is_leader():
            return
        try:
            await record_breaker(self._api, ns, name, trip)
        except KubeError as e:
            self._metrics.errors.labels("breaker", type(e).__name__).inc()
            log.error("could not record the open breaker", extra={"pool": trip.pool, "error": str(e)})

    def _plan(self, m: _Member, inp: RepairInput, now: float, refusal: str | None = None) -> RepairPlan:
        return plan_repair(
            inp,
            now=now,
            policy=m.repair.policy,
            xid_window_seconds=self.settings.policy.health.xid_window_seconds,
            refusal=refusal,
        )

    def _pool_views(self, members: Sequence[_Member]) -> dict[str, PoolView]:
        """Each pool's size and when each of its ladders began: what the breaker and the rate
        limit count for repairs."""
        sizes: dict[str, int] = {}
        starts: dict[str, list[float]] = {}
        for m in members:
            sizes[m.pool.name] = sizes.get(m.pool.name, 0) + 1
            first = next((a for a in m.record.attempts if a.step in LADDER), None)
            if first is not None:
                starts.setdefault(m.pool.name, []).append(first.started_at)
        return {p: PoolView(n, tuple(starts.get(p, ()))) for p, n in sizes.items()}

    async def _pods_of(self, node: str) -> list[PodView] | None:
        """The node's pods, or None when they could not be listed (the node is then not free,
        and its free deadline still counts)."""
        try:
            return await self._node_pods.list(node, "repair")
        except KubeError as e:
            self._metrics.errors.labels("list_pods", type(e).__name__).inc()
            log.warning("the node's pods could not be listed; its ladder waits", extra={"node": node})
            return None

    async def _input(
        self,
        m: _Member,
        reading: NodeReading | None,
        pods: Sequence[PodView] | None,
        repairing: Mapping[str, set[str]],
        now: float,
    ) -> RepairInput:
        view = m.view
        signals, _ = signal_status(reading, now, self.settings.policy)
        records = records_from_json(view.annotations.get(c.ANNOTATION_UNHEALTHY_GPUS))
        verdict = quarantine_verdict(view.name, records, signals)
        # GPU pods (and pods with claims) hold the node until a reboot needs it empty.
        held = None if pods is None else holding_the_node(p for p in pods if p.uses_gpu or p.claims)
        bad = {g.uuid for g in verdict.gpus}
        if reading is not None and reading.pods_attributed:
            gpus_free = not any(g.pods for g in reading.gpus if g.uuid in bad)
        else:
            gpus_free = held == []
        return RepairInput(
            node=view.name,
            pool=m.pool.name,
            verdict=verdict,
            reading=reading,
            record=m.record,
            quarantined_at=quarantined_at(view),
            excluded=is_excluded(view),
            gpus_free=gpus_free,
            node_free=held == [],
            work=await self._work(view.name, m.record),
            others_repairing=len(repairing.get(m.pool.name, set()) - {view.name}),
            machinery=await self._machinery(m),
        )

    async def _machinery(self, m: _Member) -> Machinery:
        if not m.repair.policy.replace:
            return Machinery.NONE
        return await self._replacements.machinery(m.view.name)

    async def _work(self, node: str, record: RepairRecord) -> Work:
        running = record.running
        if running is not None and running.step is LadderStep.REPLACE:
            return await self._replacements.work(node)
        if running is None or running.step not in _JOB_STEPS:
            return Work.ABSENT
        if not self._jobs.allowed(self._wall()):
            return Work.RUNNING  # unknown: held as it is, the deadline still counts
        name = job_name(node, running.step, running.number)
        try:
            job = await read_job(self._api, self.settings.namespace, name)
        except KubeError as e:
            await self._jobs_refused(node, "read_job", e)
            return Work.RUNNING
        self._jobs_answered()
        return job_work(job)

    async def _jobs_refused(self, node: str, what: str, e: KubeError) -> None:
        self._metrics.errors.labels(what, type(e).__name__).inc()
        if not self._jobs.failed(self._wall()):
            return
        ns = self.settings.namespace
        message = (
            f"the Jobs API refuses gpumon in namespace {ns} ({e}): no repair step can run; "
            "with RBAC missing, apply deploy/rbac/controller-repair.yaml. Retrying with backoff"
        )
        log.error("repair Jobs unavailable", extra={"namespace": ns, "error": str(e)})
        await self._recorder.record(_node_event(node, "GpuRepairJobsUnavailable", message))

    def _jobs_answered(self) -> None:
        if self._jobs.succeeded():
            log.info("repair Jobs available again", extra={"namespace": self.settings.namespace})

    async def _drain_node(self, node: str, held: Sequence[PodView]) -> None:
        """Evict what is left on the node before its reboot, through the Eviction API (PDBs
        hold: a refusal, 429, is "not yet", retried with the evictor's backoff on a later round)."""
        now, dry = self._wall(), self.settings.dry_run
        if held:
            message = f"evicting {len(held)} pod(s) before the node's reboot"
            prefix = DRY_RUN_PREFIX if dry else ""
            await self._recorder.record(_node_event(node, "GpuRepairDraining", message), prefix=prefix)
        for pod in held:
            if not dry and not self._is_leader():
                return
            target = DrainTarget(pod, "the node reboots to repair its GPUs")
            out = await self._evictor.run(target, now=now, delete=False, dry_run=dry)
            if out.result in (EvictionResult.BLOCKED, EvictionResult.ERROR):
                self._metrics.errors.labels("evict", out.result.value).inc()

    async def _apply(
        self, m: _Member, inp: RepairInput, plan: RepairPlan, holders: Sequence[PodView]
    ) -> None:
        node = m.view.name
        prefix = DRY_RUN_PREFIX if self.settings.dry_run else ""
        for ev in plan.events:
            await self._recorder.record(ev, prefix=prefix)
        self._count(plan)
        if plan.drain_node:
            await self._drain_node(node, holders)
        if plan.move in (Move.NONE, Move.WAIT) and plan.record is None:
            return
        if self.settings.dry_run:
            log.info("dry-run: repair not carried out", extra={"node": node, "move": plan.move.value})
            return
        if not self._is_leader():
            return
        if plan.record is not None:
            try:
                written = await write_record(self._api, node, plan.record)
            except KubeError as e:
                self._metrics.errors.labels("record", type(e).__name__).inc()
                log.warning("repair record not written; next round", extra={"node": node, "error": str(e)})
                return
            self._nodes.update_local(node, node_from_json(written), _version(written))
        if plan.move in (Move.START, Move.ENSURE) and plan.step in _JOB_STEPS and plan.attempt is not None:
            await self._ensure_job(m, inp, plan)
        if (
            plan.move in (Move.START, Move.ENSURE)
            and plan.step is LadderStep.REPLACE
            and plan.attempt is not None
        ):
            await self._ensure_replacement(m, plan.attempt, plan.gpus)
        ended = plan.record is not None and plan.record.running is None
        if plan.move is Move.RECORD and plan.step is LadderStep.REPLACE and ended:
            # Ended while the Node was there: its record says how, the ConfigMap's copy goes.
            await self._replacements.forget(node)

    async def _ensure_replacement(self, m: _Member, attempt: int, gpus: Sequence[str]) -> None:
        selector = next(s for p, s in self._pools if p.name == m.pool.name)
        before = sorted(v.name for v in self._nodes.items().values() if selector.matches(v.labels))
        await self._replacements.ensure(
            node=m.view.name,
            pool=m.pool.name,
            attempt=attempt,
            gpus=gpus,
            deadline_seconds=m.repair.policy.deadline(LadderStep.REPLACE),
            before=before,
        )

    async def _ensure_job(self, m: _Member, inp: RepairInput, plan: RepairPlan) -> None:
        assert plan.step is not None and plan.attempt is not None
        template = m.repair.templates.get(plan.step)
        if template is None:
            log.error(
                "no Job template for the repair step", extra={"node": m.view.name, "step": plan.step.value}
            )
            return
        needs = targets(inp, self.settings.policy.health.xid_window_seconds, self._wall())
        actions = {needs[g].name for g in plan.gpus if g in needs}
        manifest = job_manifest(
            node=m.view.name,
            step=plan.step,
            attempt=plan.attempt,
            gpus=plan.gpus,
            action=",".join(sorted(actions)),
            template=template,
            namespace=self.settings.namespace,
            deadline_seconds=m.repair.policy.deadline(plan.step),
        )
        if not self._jobs.allowed(self._wall()):
            return
        try:
            created = await ensure_job(self._api, manifest)
        except KubeError as e:
            await self._jobs_refused(m.view.name, "job", e)
            return
        self._jobs_answered()
        if created:
            log.info("repair Job created", extra={"node": m.view.name, "job": manifest["metadata"]["name"]})

    def _count(self, plan: RepairPlan) -> None:
        step = (plan.step or LadderStep.DONE).value
        if plan.move is Move.START:
            self._metrics.repairs.labels(step, "started").inc()
        elif any(e.reason == "GpuRepairRefused" for e in plan.events):
            self._metrics.repairs.labels(step, "refused").inc()
        elif plan.move is Move.RECORD and plan.step is LadderStep.GIVE_UP:
            self._metrics.repairs.labels(step, "gave_up").inc()
        elif plan.move is Move.RECORD and plan.step is LadderStep.DONE:
            self._metrics.repairs.labels(step, "done").inc()
        elif plan.move is Move.RECORD and plan.record is not None and plan.attempt is not None:
            ended = next((a for a in plan.record.attempts if a.number == plan.attempt), None)
            if ended is not None and ended.outcome is not AttemptOutcome.RUNNING:
                self._metrics.repairs.labels(step, ended.outcome.value).inc()


def _node_event(node: str, reason: str, message: str) -> Event:
    return Event(ObjectRef("Node", node), reason, message, warning=True, key=reason)


def _version(obj: Mapping[str, object]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("resourceVersion", "")) if isinstance(meta, Mapping) else ""
