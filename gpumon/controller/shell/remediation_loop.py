"""The imperative shell: which nodes to look at, and carrying out what the pure parts decide.

Watch handlers only mark node names dirty; a round takes the dirty and due nodes, reads the
caches and the latest signals, evaluates (pure), admits new quarantines as one batch (pure),
plans each node (pure) and then writes, oldest fault first. Every replica evaluates, so a
standby's state is warm; only the leader records Events or writes, and it re-checks its lease
right before each write.

Each decision waits only for the caches it reads (client-go's HasSynced, per decision rather
than per process): quarantine and recovery need the Nodes and the state ConfigMap (pause,
breakers), so rounds start once those two are listed; a drain, and gpumon's DeviceTaintRules,
also need the PDBs, ResourceClaims and ResourceSlices. Until they are in, a node with a new
fault is tainted (and labelled quarantined) and its drain is held; a node already quarantined
is left as it is; both are looked at again once those caches are filled.

There is no cache of Pods: a drain lists the node's pods each time it looks at the node
(:mod:`.node_pods`), and looks again every ``drain_check_seconds`` while pods are left to evict.
A list that fails leaves the node tainted and its drain for the retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpumon.controller.act.breaker_record import record_breaker
from gpumon.controller.act.device_taint import apply_rules
from gpumon.controller.act.events import EventRecorder
from gpumon.controller.act.evict import EvictionResult, Evictor
from gpumon.controller.act.node_write import apply_node_write, node_path
from gpumon.controller.act.retry import DEFAULT_RETRY, RetryPolicy
from gpumon.controller.core import contract as c
from gpumon.controller.core.breaker import Admission, Candidate, PoolView, SafetyPolicy, admit
from gpumon.controller.core.claims import ClaimView, SliceView, holds_by_pod
from gpumon.controller.core.contract import DRY_RUN_PREFIX
from gpumon.controller.core.contract.breakers import (
    BreakerTrip,
    breaker_to_annotation,
    breakers_from_annotations,
)
from gpumon.controller.core.contract.node import is_excluded, is_quarantined, node_records, quarantined_at
from gpumon.controller.core.contract.repair import record_from_json
from gpumon.controller.core.device_taints import RuleView, plan_rules, rules_event, wanted_rules
from gpumon.controller.core.drain_plan import DrainPolicy, Escalation, needs_drain, plan_drain
from gpumon.controller.core.node_plan import (
    QuarantinePolicy,
    drain_started_at,
    node_ref,
    plan_node,
    signals_lost_event,
)
from gpumon.controller.core.objects import NodeView, PdbView
from gpumon.controller.core.plans import DrainPlan, Event, NodePlan, NodeWrite, ObjectRef, PlanKind
from gpumon.controller.core.policy import (
    EMPTY_NODE_STATE,
    NodeRuleState,
    Policy,
    evaluate_node,
    stale_at,
    waits_for_gpus,
    with_records,
)
from gpumon.controller.core.pools import pool_of
from gpumon.controller.core.repair import holds_quarantine, repair_phase
from gpumon.controller.core.signals import NodeReading, SignalSource, exporter_says_wrong
from gpumon.controller.core.verdicts import NodeVerdict, SignalStatus
from gpumon.controller.shell.due_queue import NODES_BETWEEN_YIELDS, DueQueue
from gpumon.controller.shell.metrics import ControllerMetrics
from gpumon.controller.shell.node_pods import NodePods
from gpumon.kube.client import KubeApi, KubeError, NotFound
from gpumon.kube.informer import View
from gpumon.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReconcilerSettings:
    policy: Policy
    quarantine: QuarantinePolicy
    drain: DrainPolicy
    safety: SafetyPolicy
    dry_run: bool = True
    namespace: str = "gpumon-system"
    state_configmap: str = "gpumon-controller"
    # A full pass over every node now and then, in case a change was ever missed.
    resync_seconds: float = 300.0
    # How often a draining node is looked at again (pods leaving, PDBs changing).
    drain_check_seconds: float = 5.0
    retry: RetryPolicy = DEFAULT_RETRY


class Reconciler:
    def __init__(
        self,
        *,
        api: KubeApi,
        nodes: View[NodeView],
        node_pods: NodePods,
        pdbs: View[PdbView],
        state: View[Mapping[str, str]],
        claims: View[ClaimView],
        slices: View[SliceView],
        source: SignalSource,
        is_leader: Callable[[], bool],
        recorder: EventRecorder,
        evictor: Evictor,
        metrics: ControllerMetrics,
        settings: ReconcilerSettings,
        wall_clock: Callable[[], float] = time.time,
        rules: View[RuleView] | None = None,
    ) -> None:
        self._api = api
        self._nodes = nodes
        self._node_pods = node_pods
        self._pdbs = pdbs
        self._state = state
        self._claims = claims
        self._slices = slices
        # gpumon's DeviceTaintRules; written only once discovery found the API and the cache
        # is filled (rules_served).
        self._rules = rules
        self._rules_ready = False
        self._source = source
        self._is_leader = is_leader
        self._recorder = recorder
        self._evictor = evictor
        self._metrics = metrics
        self.settings = settings
        self._wall = wall_clock
        self._states: dict[str, NodeRuleState] = {}
        self._status: dict[str, SignalStatus] = {}
        self._dirty: set[str] = set()
        self._due = DueQueue()
        # The nodes gpumon quarantined, as each was last evaluated or written, so that a
        # claim's change finds them without a pass over every node.
        self._quarantined: set[str] = set()
        # Nodes whose drain (or device taints) waited for the pod-level caches.
        self._held: set[str] = set()
        # Each node's next look: the earliest its last look asked for (an evaluation derives
        # every wake-up it needs again, so the earlier ones are obsolete), in a heap whose
        # entries not in _due_at any more are skipped.
        self._timers: list[tuple[float, str]] = []
        self._due_at: dict[str, float] = {}
        # When each node's reading would go stale: compared with the source's latest reading
        # then, evaluated only if it has (a heartbeat keeps a healthy node fresh for ever).
        self._stale_checks: list[tuple[float, str]] = []
        self._stale_at: dict[str, float] = {}
        self._wake = asyncio.Event()
        self.rounds = 0

    # -- what to look at ----------------------------------------------------------------------

    def mark(self, nodes: Iterable[str]) -> None:
        self._dirty.update(nodes)
        self._wake.set()

    def on_node(self, key: str, old: NodeView | None, new: NodeView | None) -> None:
        self.mark((key,))

    def on_claim(self, key: str, old: ClaimView | None, new: ClaimView | None) -> None:
        """The pods a claim is reserved for hold its devices: a node with findings or a
        quarantine whose slices publish one of them may drain differently. Found through those
        nodes' slices (the few nodes that matter), not through the claim's pods: there is no
        cache of pods to find them in."""
        pools = {(d.driver, d.pool) for view in (old, new) if view is not None for d in view.devices}
        self.mark(
            n for n in self.held_nodes() if any((s.driver, s.pool) in pools for s in self._slices.indexed(n))
        )

    def on_slice(self, key: str, old: SliceView | None, new: SliceView | None) -> None:
        held = self.held_nodes()
        if nodes := {v.node for v in (old, new) if v is not None and v.node in held}:
            self.mark(nodes)

    def on_rule(self, key: str, old: RuleView | None, new: RuleView | None) -> None:
        # One of gpumon's rules changed (or a person deleted it): put its node's rules right,
        # whatever state the node is in (it may be gone, leaving its rules behind).
        self.mark({v.node for v in (old, new) if v is not None and v.node})

    def rules_served(self) -> None:
        """The API serves DeviceTaintRules and their cache is filled: put every node's right."""
        self._rules_ready = True
        self.mark(self._nodes.items())
        if self._rules is not None:
            self.mark(r.node for r in self._rules.items().values() if r.node)

    def leadership_gained(self) -> None:
        """Look again at the nodes a new leader may have to write to: a standby evaluates but
        never acts, and only nodes with findings or pending rules, a quarantine to keep or lift,
        or gpumon's DeviceTaintRules can have anything to act on. Marking every node cost a
        whole-fleet round per gain: at 10,000 nodes on a loaded loop that round delayed the next
        renewal past its deadline, and the leadership just gained was lost (docs/benchmarks.md)."""
        nodes = set(self._states)
        nodes.update(name for name, view in self._nodes.items().items() if is_quarantined(view))
        if self._rules is not None:
            nodes.update(r.node for r in self._rules.items().values() if r.node)
        self.mark(nodes)

    def held_nodes(self) -> set[str]:
        """The nodes with findings, pending rules or a quarantine: those a change of their pods'
        devices could matter to, and those the Prometheus source reads GPU by GPU."""
        return {*self._states, *self._quarantined}

    def _note_quarantine(self, view: NodeView) -> None:
        if is_quarantined(view):
            self._quarantined.add(view.name)
        else:
            self._quarantined.discard(view.name)

    def _schedule(self, when: float | None, node: str) -> None:
        if when is not None and when < self._due_at.get(node, math.inf):
            self._due_at[node] = when
            heapq.heappush(self._timers, (when, node))

    def _watch_staleness(self, node: str, when: float) -> None:
        self._stale_at[node] = when
        heapq.heappush(self._stale_checks, (when, node))

    def take_due(self, now: float) -> set[str]:
        """The nodes to look at now: marked, due, or gone stale since they were last looked at."""
        due = set(self._dirty)
        self._dirty.clear()
        while self._timers and self._timers[0][0] <= now:
            when, node = heapq.heappop(self._timers)
            if self._due_at.get(node) == when:
                del self._due_at[node]
                due.add(node)
        fleet = self._source.current() if self._stale_checks and self._stale_checks[0][0] <= now else None
        while fleet is not None and self._stale_checks and self._stale_checks[0][0] <= now:
            when, node = heapq.heappop(self._stale_checks)
            if self._stale_at.get(node) != when:
                continue
            del self._stale_at[node]
            reading = fleet.nodes.get(node)
            later = None if reading is None else stale_at(reading, self.settings.policy)
            if later is not None and later > now:
                self._watch_staleness(node, later)  # heard from since: nothing to decide
            else:
                due.add(node)
        return due

    async def next_round(self, now: float) -> list[str]:
        """The nodes of the next round (see DueQueue): those with findings or a quarantine, or
        whose exporter judged a GPU worse than healthy, first."""
        readings = self._source.current().nodes

        def wrong(node: str) -> bool:
            held = node in self._states or node in self._quarantined
            return held or exporter_says_wrong(readings.get(node))

        await self._due.add(self.take_due(now), wrong)
        return self._due.take()

    def _next_wake(self) -> float:
        return min([math.inf, *(heap[0][0] for heap in (self._timers, self._stale_checks) if heap)])

    # -- views of the cluster -----------------------------------------------------------------

    @property
    def _state_key(self) -> str:
        return f"{self.settings.namespace}/{self.settings.state_configmap}"

    @property
    def state_annotations(self) -> Mapping[str, str]:
        return self._state.get(self._state_key) or {}

    def paused(self) -> bool:
        return self.settings.safety.paused or self.state_annotations.get(c.ANNOTATION_PAUSED) == "true"

    def open_breakers(self) -> dict[str, BreakerTrip]:
        return breakers_from_annotations(self.state_annotations)

    def pools(self) -> dict[str, PoolView]:
        sizes: dict[str, int] = {}
        times: dict[str, list[float]] = {}
        for view in self._nodes.items().values():
            pool = pool_of(view.labels, self.settings.policy.pool_label)
            sizes[pool] = sizes.get(pool, 0) + 1
            at = quarantined_at(view)
            if at is not None:
                times.setdefault(pool, []).append(at)
        return {p: PoolView(n, tuple(times.get(p, ()))) for p, n in sizes.items()}

    def quarantined_counts(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for view in self._nodes.items().values():
            if not is_quarantined(view):
                continue
            records = node_records(view)
            severity = (
                max((r.severity for r in records), key=lambda s: s.rank).value if records else "unknown"
            )
            key = (pool_of(view.labels, self.settings.policy.pool_label), severity)
            out[key] = out.get(key, 0) + 1
        return out

    def overdue_drains(self) -> dict[str, int]:
        """Nodes still draining past the drain deadline, by pool (every pool, zeros too)."""
        now = self._wall()
        out = dict.fromkeys(self.pools(), 0)
        for view in self._nodes.items().values():
            draining = view.labels.get(c.LABEL_STATE) == c.NodePhase.DRAINING
            if draining and now - drain_started_at(view, now) >= self.settings.drain.deadline_seconds:
                out[pool_of(view.labels, self.settings.policy.pool_label)] += 1
        return out

    def signal_counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in SignalStatus}
        for node in self._nodes.items():
            out[self._status.get(node, SignalStatus.MISSING).value] += 1
        return out

    # -- the loop -----------------------------------------------------------------------------

    @property
    def _drain_caches(self) -> tuple[View[Any], ...]:
        """What a drain reads besides the Node and its pods: the PDBs, and which GPU each DRA
        claim holds (the slices also say which devices gpumon's rules taint)."""
        return (self._pdbs, self._claims, self._slices)

    def drains_ready(self) -> bool:
        return all(i.synced.is_set() for i in self._drain_caches)

    async def _release_held(self) -> None:
        for informer in self._drain_caches:
            await informer.synced.wait()
        held, self._held = self._held, set()
        self.mark(held)
        if self._rules_ready:
            self.rules_served()  # their sync was held too

    async def run(self) -> None:
        for informer in (self._nodes, self._state):
            await informer.synced.wait()
        release = asyncio.create_task(self._release_held(), name="drain caches synced")
        try:
            await self._rounds()
        finally:
            await cancel_and_wait([release])

    async def _rounds(self) -> None:
        loop = asyncio.get_running_loop()
        next_resync = self._wall()
        while True:
            now = self._wall()
            if now >= next_resync:
                self._dirty.update(self._nodes.items())
                next_resync = now + self.settings.resync_seconds
            due = await self.next_round(now)
            if due:
                started = loop.time()
                try:
                    await self.round(due)
                except Exception:
                    log.exception("reconcile round failed; retrying its nodes")
                    for node in due:
                        self._schedule(now + self.settings.retry.round_retry_seconds, node)
                self._metrics.reconcile.observe(loop.time() - started)
                continue
            wake_at = min(next_resync, self._next_wake())
            self._wake.clear()
            if self._dirty or self._due:
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.01, wake_at - self._wall())):
                    await self._wake.wait()

    async def round(self, names: Iterable[str]) -> None:
        self.rounds += 1
        now = self._wall()
        fleet = self._source.current()
        policy = self.settings.policy
        evaluated: list[tuple[NodeView, NodeVerdict, NodeReading | None, SignalStatus]] = []
        gone: list[str] = []
        for i, name in enumerate(sorted(names)):
            if i and i % NODES_BETWEEN_YIELDS == 0:
                await asyncio.sleep(0)
            # This look derives every wake-up the node needs again.
            self._due_at.pop(name, None)
            self._stale_at.pop(name, None)
            view = self._nodes.get(name)
            if view is None:
                self._states.pop(name, None)
                self._status.pop(name, None)
                self._quarantined.discard(name)
                self._node_pods.gone(name)
                gone.append(name)
                continue
            self._note_quarantine(view)
            records = node_records(view)
            prev = with_records(self._states.get(name, EMPTY_NODE_STATE), records, policy)
            reading = fleet.nodes.get(name)
            if reading is not None and waits_for_gpus(reading, prev, is_quarantined(view), now, policy):
                self._states[name] = prev  # the source reads held_nodes() GPU by GPU next round
                self._watch_staleness(name, stale_at(reading, policy))
                continue
            ev = evaluate_node(name, view.labels, reading, prev, now, policy)
            if ev.state.targets:
                self._states[name] = ev.state
            else:
                self._states.pop(name, None)
            before = self._status.get(name, SignalStatus.MISSING)
            self._status[name] = ev.verdict.signals
            if ev.verdict.age_seconds is not None:
                self._metrics.signal_age.observe(ev.verdict.age_seconds)
            self._schedule(ev.next_check_at, name)
            if ev.stale_at is not None:
                self._watch_staleness(name, ev.stale_at)
            evaluated.append((view, ev.verdict, reading, before))
        if not self._is_leader():
            return
        await self._recorder.retry()
        for view, verdict, _, before in evaluated:
            if before is SignalStatus.FRESH and verdict.signals is not SignalStatus.FRESH:
                await self._recorder.record(signals_lost_event(view, verdict))
        admission = await self._admit(evaluated, now)
        order = sorted(evaluated, key=lambda e: (e[1].first_bad_at or float("inf"), e[0].name))
        for view, verdict, reading, _ in order:
            await self._act(view, verdict, reading, admission.refused.get(view.name), now)
        for name in gone:
            await self._sync_device_taints(name, now)

    # -- deciding -----------------------------------------------------------------------------

    async def _admit(
        self, evaluated: list[tuple[NodeView, NodeVerdict, NodeReading | None, SignalStatus]], now: float
    ) -> Admission:
        candidates = [
            Candidate(
                view.name, pool_of(view.labels, self.settings.policy.pool_label), verdict.first_bad_at or now
            )
            for view, verdict, _, _ in evaluated
            if verdict.severity is not None
            and verdict.signals is SignalStatus.FRESH
            and not is_quarantined(view)
            and not is_excluded(view)
        ]
        if not candidates:
            return Admission(frozenset(), {})
        safety = replace(self.settings.safety, paused=self.paused())
        admission = admit(candidates, self.pools(), self.open_breakers(), now=now, policy=safety)
        if admission.retry_at is not None:
            for node in admission.refused:
                self._schedule(admission.retry_at, node)
        for trip in admission.tripped:
            await self._record_trip(trip)
        return admission

    async def _record_trip(self, trip: BreakerTrip) -> None:
        key, _ = breaker_to_annotation(trip)
        ns, name = self.settings.namespace, self.settings.state_configmap
        ref = ObjectRef("ConfigMap", name, namespace=ns)
        msg = f"circuit breaker for pool {trip.pool!r} opened: {trip.reason}"
        msg += f"; remove annotation {key} to close it"
        prefix = DRY_RUN_PREFIX if self.settings.dry_run else ""
        await self._recorder.record(Event(ref, "GpuBreakerOpen", msg, warning=True, key=key), prefix=prefix)
        if self.settings.dry_run or not self._is_leader():
            return
        try:
            obj = await record_breaker(self._api, ns, name, trip)
            meta = obj.get("metadata") or {}
            annotations = dict(meta.get("annotations") or {})
            self._state.update_local(self._state_key, annotations, str(meta.get("resourceVersion", "")))
        except KubeError as e:
            self._metrics.api_errors.labels("breaker", type(e).__name__).inc()
            log.error("could not record the open breaker", extra={"pool": trip.pool, "error": str(e)})

    # -- acting -------------------------------------------------------------------------------

    async def _act(
        self,
        view: NodeView,
        verdict: NodeVerdict,
        reading: NodeReading | None,
        refusal: str | None,
        now: float,
    ) -> None:
        if verdict.signals is not SignalStatus.FRESH:
            return  # unknown holds everything: no quarantine, no drain, no recovery
        repair = record_from_json(view.annotations.get(c.ANNOTATION_REPAIR))
        if verdict.severity is None and is_quarantined(view) and holds_quarantine(repair):
            return  # healthy, but the repair's validation Job has not passed yet
        drain_plan: DrainPlan | None = None
        phase = c.NodePhase.QUARANTINED
        headed_for_quarantine = is_quarantined(view) or (refusal is None and not is_excluded(view))
        wants_drain = (
            verdict.severity is not None
            and headed_for_quarantine
            and needs_drain(verdict, self.settings.drain)
        )
        if wants_drain and not self.drains_ready():
            self._held.add(view.name)
            if is_quarantined(view):
                return  # tainted already; its drain's progress is written once pods are known
        elif wants_drain:
            drain_plan = await self._plan_drain(view, verdict, reading, now)
            if drain_plan is not None:
                phase = drain_plan.phase
            elif is_quarantined(view):
                return  # the pods could not be listed: the drain waits for the retry
        phase = repair_phase(repair) or phase  # a step of the repair ladder under way
        plan = plan_node(
            view, verdict, now=now, phase=phase, refusal=refusal, policy=self.settings.quarantine
        )
        if plan.kind is PlanKind.NONE and drain_plan is None:
            await self._sync_device_taints(view.name, now)
            return
        if self.paused() and plan.kind in (PlanKind.QUARANTINE, PlanKind.UPDATE, PlanKind.RECOVER):
            msg = f"paused: not applying {plan.kind.value} ({c.ANNOTATION_PAUSED} or config)"
            await self._recorder.record(
                Event(node_ref(view), "GpuActionPaused", msg, key=f"paused:{plan.kind}")
            )
            return
        applied = await self._apply(view, plan, verdict, phase, refusal, now)
        # Before any eviction: the replacement's new claim must not get a device of the bad GPU.
        await self._sync_device_taints(view.name, now)
        if drain_plan is not None and applied and plan.kind not in (PlanKind.REFUSED, PlanKind.SKIPPED):
            await self._drain(view, drain_plan, now)

    async def _plan_drain(
        self, view: NodeView, verdict: NodeVerdict, reading: NodeReading | None, now: float
    ) -> DrainPlan | None:
        """The drain's plan from the node's pods, listed now; None when the list fails (the node
        is looked at again after the round retry)."""
        try:
            pods = await self._node_pods.list(view.name, "drain")
        except KubeError as e:
            self._metrics.api_errors.labels("drain", type(e).__name__).inc()
            log.warning("the node's pods could not be listed; the drain waits", extra={"node": view.name})
            self._schedule(now + self.settings.retry.round_retry_seconds, view.name)
            return None
        return plan_drain(
            verdict,
            reading,
            pods,
            list(self._pdbs.items().values()),
            now=now,
            started_at=drain_started_at(view, now),
            policy=self.settings.drain,
            holds=holds_by_pod(pods, self._claims.items(), self._slices.indexed(view.name)),
        )

    async def _sync_device_taints(self, name: str, now: float) -> None:
        """Make the node's DeviceTaintRules what its unhealthy-GPU record asks for (the record
        as written, so in dry-run there is nothing to follow)."""
        rules = self._rules
        if rules is None or not self._rules_ready or self.settings.dry_run:
            return
        if not self.drains_ready():
            # The slices say which DRA devices the node's GPUs are: without them every rule
            # would look unwanted. Looked at again once they are listed.
            self._held.add(name)
            return
        if self.paused() or not self._is_leader():
            return
        view = self._nodes.get(name)
        plan = plan_rules(name, wanted_rules(name, view, self._slices.indexed(name)), rules.items().values())
        if not plan:
            return
        try:
            if view is None and await self._node_exists(name):
                return  # outside this controller's node selector: its rules are not ours to judge
            created = await apply_rules(self._api, plan)
        except KubeError as e:
            self._metrics.actions.labels("device_taint", "error").inc()
            self._metrics.api_errors.labels("device_taints", type(e).__name__).inc()
            log.warning("device taint rules not written; will retry", extra={"node": name, "error": str(e)})
            self._schedule(now + self.settings.retry.round_retry_seconds, name)
            return
        for rule in created:
            rules.update_local(rule.name, rule, "")
        self._metrics.actions.labels("device_taint", "success").inc()
        if view is not None:
            await self._recorder.record(rules_event(name, plan))

    async def _node_exists(self, name: str) -> bool:
        try:
            await self._api.get(node_path(name))
        except NotFound:
            return False
        return True

    async def _apply(
        self,
        view: NodeView,
        plan: NodePlan,
        verdict: NodeVerdict,
        phase: c.NodePhase,
        refusal: str | None,
        now: float,
    ) -> bool:
        prefix = DRY_RUN_PREFIX if self.settings.dry_run else ""
        for ev in plan.events:  # counted in gpumon_controller_events_total by the recorder
            await self._recorder.record(ev, prefix=prefix)
        if plan.kind in (PlanKind.REFUSED, PlanKind.SKIPPED):
            self._metrics.actions.labels(plan.kind.value, "refused").inc()
            return False
        if plan.write is None:
            return True
        if self.settings.dry_run:
            self._metrics.actions.labels(plan.kind.value, "dry_run").inc()
            log.info("dry-run: not writing", extra={"node": view.name, "action": plan.kind.value})
            return True
        if not self._is_leader():
            return False

        def replan(fresh: NodeView) -> NodeWrite | None:
            return plan_node(
                fresh, verdict, now=now, phase=phase, refusal=refusal, policy=self.settings.quarantine
            ).write

        try:
            written = await apply_node_write(self._api, plan.write, replan, self.settings.retry)
        except KubeError as e:
            self._metrics.actions.labels(plan.kind.value, "error").inc()
            self._metrics.api_errors.labels("quarantine", type(e).__name__).inc()
            log.warning("node write failed; will retry", extra={"node": view.name, "error": str(e)})
            self._schedule(now + self.settings.retry.round_retry_seconds, view.name)
            return False
        if written is not None:
            self._nodes.update_local(view.name, written, written.resource_version)
            self._note_quarantine(written)
        self._metrics.actions.labels(plan.kind.value, "success").inc()
        if plan.kind is PlanKind.QUARANTINE and verdict.first_bad_at is not None:
            latency = max(0.0, self._wall() - verdict.first_bad_at)
            self._metrics.fault_to_taint.observe(latency)
            log.info("quarantined", extra={"node": view.name, "fault_to_taint_seconds": round(latency, 3)})
        return True

    async def _drain(self, view: NodeView, plan: DrainPlan, now: float) -> None:
        ref = node_ref(view)
        dry = self.settings.dry_run
        prefix = DRY_RUN_PREFIX if dry else ""
        escalate = plan.overdue and self.settings.drain.escalation is Escalation.DELETE
        if plan.overdue:
            left = ", ".join(
                f"{t.pod.namespace}/{t.pod.name}"
                + (f" (PDB {', '.join(p.name for p in t.pdbs)})" if t.pdbs else "")
                for t in plan.targets
            )
            then = "deleting them" if escalate else "escalation is report-only: evictions keep being retried"
            msg = f"drain deadline passed with {len(plan.targets)} pod(s) left: {left}; {then}"
            await self._recorder.record(
                Event(ref, "GpuDrainDeadlineExceeded", msg, warning=True, key="deadline"), prefix=prefix
            )
        for target in plan.targets:
            if not dry and not self._is_leader():
                return
            out = await self._evictor.run(target, now=now, delete=escalate, dry_run=dry)
            if out.result is EvictionResult.WAITING:
                continue
            self._metrics.evictions.labels(out.result.value).inc()
            pod = target.pod
            pod_ref = ObjectRef("Pod", pod.name, pod.uid, pod.namespace)
            name = f"{pod.namespace}/{pod.name}"
            match out.result:
                case EvictionResult.EVICTED | EvictionResult.DRY_RUN:
                    msg = f"evicted from node {view.name}: {target.why}"
                    await self._recorder.record(
                        Event(pod_ref, "GpuPodEvicted", msg, key=pod.uid), prefix=prefix
                    )
                    await self._recorder.record(
                        Event(ref, "GpuPodEvicted", f"evicted {name}: {target.why}", key=pod.uid),
                        prefix=prefix,
                    )
                case EvictionResult.DELETED:
                    msg = f"deleted from node {view.name} after the drain deadline: {target.why}"
                    await self._recorder.record(
                        Event(pod_ref, "GpuPodDeleted", msg, warning=True, key=pod.uid)
                    )
                case EvictionResult.BLOCKED:
                    pdbs = ", ".join(f"{p.namespace}/{p.name}" for p in target.pdbs) or "none found"
                    msg = f"eviction of {name} refused (PDB {pdbs}): {out.detail}; retrying with backoff"
                    await self._recorder.record(
                        Event(ref, "GpuEvictionBlocked", msg, warning=True, key=f"blocked:{pod.uid}")
                    )
                case EvictionResult.ERROR:
                    msg = f"eviction of {name} failed: {out.detail}"
                    await self._recorder.record(
                        Event(ref, "GpuEvictionFailed", msg, warning=True, key=f"error:{pod.uid}")
                    )
                case _:
                    pass
        if plan.targets:
            wake = [now + self.settings.drain_check_seconds]
            retry = self._evictor.next_try_at(plan.targets)
            if retry is not None:
                wake.append(retry)
            if not plan.overdue:
                wake.append(plan.deadline_at)
            self._schedule(min(wake), view.name)
