"""The repair ladder's replacement step, carried out: the node's Machine (Cluster API) or
NodeClaim (Karpenter), read off the Node (:mod:`gpumon.controller.core.node_owner`), is deleted,
or, where a MachineHealthCheck covers the Machine, the Node's ``GpuReplacementRequested``
condition is set for the check to act (never both). The replacement is recorded on the
controller's ConfigMap before anything is deleted, because the Node and its record go with it;
:meth:`ReplacementStep.follow` follows the recorded replacements whose Node is gone until a new
node joined the pool or the deadline passed (:mod:`gpumon.controller.core.repair_replace`).

The ladder's loop (:mod:`gpumon.controller.shell.repair_loop`) decides when; this module only
carries out and reads back, as the leader.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpumon.controller.act.events import EventRecorder
from gpumon.controller.act.replace import (
    delete_owner,
    health_checks,
    patch_node_status,
    pool_nodes,
    read_node,
    read_owner,
)
from gpumon.controller.act.state_record import annotate_state
from gpumon.controller.core import contract as c
from gpumon.controller.core.contract.repair import (
    LadderStep,
    Replacement,
    record_from_json,
    replacement_to_annotation,
    replacements_from_annotations,
)
from gpumon.controller.core.node_owner import NodeOwner, node_owner
from gpumon.controller.core.objects import NodeView, to_rfc3339
from gpumon.controller.core.plans import Event, ObjectRef
from gpumon.controller.core.pools import Pool
from gpumon.controller.core.repair import Machinery, Work
from gpumon.controller.core.repair_replace import (
    Ending,
    HealthCheckCover,
    ReplacementView,
    covering_health_check,
    follow_replacement,
    health_check_events,
    machinery_of,
    owner_work,
    replacement_condition,
)
from gpumon.controller.shell.api_access import ApiAccess
from gpumon.controller.shell.repair_metrics import RepairMetrics
from gpumon.kube.client import KubeApi, KubeError

log = logging.getLogger(__name__)


class ReplacementStep:
    def __init__(
        self,
        *,
        api: KubeApi,
        recorder: EventRecorder,
        metrics: RepairMetrics,
        namespace: str,
        state_configmap: str,
        state: Callable[[], Mapping[str, str]],
        wall_clock: Callable[[], float],
    ) -> None:
        self._api = api
        self._recorder = recorder
        self._metrics = metrics
        self._namespace = namespace
        self._state_configmap = state_configmap
        self._state = state
        self._wall = wall_clock
        self._access = ApiAccess()  # reading and deleting Machines and NodeClaims
        # Which Machine or NodeClaim owns a node (read off the Node once: it never changes).
        self._owners: dict[str, NodeOwner | None] = {}
        # The attempt whose replacement a MachineHealthCheck was asked for, by node: asked once
        # (a new leader asks once more; the condition patch is idempotent).
        self._asked: dict[str, int] = {}

    async def owner(self, node: str) -> NodeOwner | None:
        """The Machine or NodeClaim behind ``node``, read off the Node (the cache keeps none of
        the keys that say it) once per node."""
        if node not in self._owners:
            try:
                obj = await read_node(self._api, node)
            except KubeError as e:
                self._metrics.errors.labels("read_node", type(e).__name__).inc()
                return None  # asked again next round
            self._owners[node] = node_owner(obj) if obj is not None else None
        return self._owners[node]

    async def machinery(self, node: str) -> Machinery:
        return machinery_of(await self.owner(node))

    async def work(self, node: str) -> Work:
        """The running replacement's work: the node's Machine or NodeClaim gone, deleting, or
        not asked to go yet."""
        owner = await self.owner(node)
        if owner is None or not self._access.allowed(self._wall()):
            return Work.RUNNING  # unknown: held as it is, the deadline still counts
        try:
            obj = await read_owner(self._api, owner.path)
        except KubeError as e:
            await self._refused(node, owner, "read_owner", e)
            return Work.RUNNING
        self._answered()
        return owner_work(obj)

    async def ensure(
        self,
        *,
        node: str,
        pool: str,
        attempt: int,
        gpus: Sequence[str],
        deadline_seconds: float,
        before: Sequence[str],
    ) -> None:
        """Record the replacement on the ConfigMap, then delete the Machine or NodeClaim (or ask
        the MachineHealthCheck that covers it). A leader that dies in between leaves a recorded
        replacement whose Node is still there and whose owner is not deleting: the next one
        deletes it (the same object, once). ``before``: the pool's nodes now."""
        now = self._wall()
        owner = await self.owner(node)
        if owner is None or not self._access.allowed(now):
            return
        recorded = {r.node: r for r in replacements_from_annotations(self._state())}.get(node)
        if recorded is None or recorded.attempt != attempt:
            replacement = Replacement(
                node=node,
                pool=pool,
                owner=owner.path,
                machinery=owner.machinery,
                attempt=attempt,
                gpus=tuple(gpus),
                started_at=now,
                deadline_at=now + deadline_seconds,
                before=tuple(before),
            )
            key, value = replacement_to_annotation(replacement)
            if not await self._annotate_state({key: value}):
                return
        if self._asked.get(node) == attempt:
            # A MachineHealthCheck was asked for this attempt: its Machine stays undeleted until
            # the check acts (about 15 s), and the planner asks again each round meanwhile; the
            # Machine and the checks are not read again for it.
            return
        try:
            # Never both: where a MachineHealthCheck judges the Machine, it replaces the node.
            cover = await self._health_check(owner)
        except KubeError as e:
            await self._refused(node, owner, "health_checks", e)
            return
        if cover is not None:
            try:
                await self._ask_health_check(node, owner, cover, attempt)
            except KubeError as e:
                await self._refused(node, owner, "replacement_condition", e)
            return
        try:
            await delete_owner(self._api, owner)
        except KubeError as e:
            await self._refused(node, owner, "delete_owner", e)
            return
        self._answered()
        log.info("replacement asked", extra={"node": node, "kind": owner.kind, "owner": owner.name})

    async def forget(self, node: str) -> None:
        """The Node's own record ended the replacement: the ConfigMap's copy goes."""
        for r in replacements_from_annotations(self._state()):
            if r.node == node:
                await self._end_request(node)
                await self._annotate_state({r.key: None})

    async def follow(self, now: float, nodes: Mapping[str, NodeView], pools: Mapping[str, Pool]) -> None:
        """The recorded replacements: dropped once the Node's own record ended them; once the
        Node is gone, ended when the owner is gone and a new node joined, or given up at the
        deadline (Events on the pool's /scale target). ``nodes`` as this round left them."""
        for r in replacements_from_annotations(self._state()):
            pool = pools.get(r.pool)
            if pool is None or r.gave_up_at is not None:
                continue
            if r.node in nodes:
                running = record_from_json(nodes[r.node].annotations.get(c.ANNOTATION_REPAIR)).running
                view = ReplacementView(
                    node_present=True,
                    attempt_running=running is not None and running.number == r.attempt,
                )
            else:
                view = await self._view(r, pool)
            target = pool.target
            about = ObjectRef(target.kind, target.name, "", target.namespace, target.api_version)
            plan = follow_replacement(r, view, now=now, about=about)
            if plan.event is not None:
                await self._recorder.record(plan.event)
            if plan.ending is Ending.SUCCEEDED:
                self._metrics.repairs.labels(LadderStep.REPLACE.value, "succeeded").inc()
                self._metrics.repairs.labels(LadderStep.DONE.value, "done").inc()
            elif plan.ending is Ending.GAVE_UP:
                self._metrics.repairs.labels(LadderStep.REPLACE.value, "timed_out").inc()
                self._metrics.repairs.labels(LadderStep.GIVE_UP.value, "gave_up").inc()
            if plan.ending is Ending.DROP:
                await self._end_request(r.node)
            if plan.ending in (Ending.SUCCEEDED, Ending.DROP):
                await self._annotate_state({r.key: None})
            elif plan.record is not None:
                await self._annotate_state(dict([replacement_to_annotation(plan.record)]))

    async def _health_check(self, owner: NodeOwner) -> HealthCheckCover | None:
        """The MachineHealthCheck covering a Machine; a refused list raises (and nothing is
        deleted: gpumon cannot tell that no check would remediate the same Machine)."""
        if owner.kind != "Machine" or owner.namespace is None:
            return None
        machine = await read_owner(self._api, owner.path)
        if machine is None:
            return None
        return covering_health_check(machine, await health_checks(self._api, owner.namespace))

    async def _ask_health_check(
        self, node: str, owner: NodeOwner, cover: HealthCheckCover, attempt: int
    ) -> None:
        message = (
            f"gpumon's repair ladder asks MachineHealthCheck {cover.name} to replace this node "
            f"(attempt {attempt})"
        )
        await patch_node_status(
            self._api, node, replacement_condition(True, at=to_rfc3339(self._wall()), message=message)
        )
        self._answered()
        self._asked[node] = attempt
        for event in health_check_events(node, owner.name, cover, attempt):
            await self._recorder.record(event)
        log.info(
            "replacement asked of a MachineHealthCheck",
            extra={"node": node, "health_check": cover.name, "watches": cover.watches},
        )

    async def _end_request(self, node: str) -> None:
        """The ladder ended with the Node still there: a GpuReplacementRequested=True left on it
        would have a MachineHealthCheck replace a node that no longer needs it."""
        self._asked.pop(node, None)
        try:
            obj = await read_node(self._api, node)
            conditions = ((obj or {}).get("status") or {}).get("conditions") or ()
            if any(
                x.get("type") == c.REPLACEMENT_CONDITION_TYPE and x.get("status") == "True"
                for x in conditions
            ):
                message = "gpumon's repair ladder ended with the node in place: no replacement wanted"
                patch = replacement_condition(False, at=to_rfc3339(self._wall()), message=message)
                await patch_node_status(self._api, node, patch)
        except KubeError as e:
            self._metrics.errors.labels("replacement_condition", type(e).__name__).inc()
            log.warning("replacement request not withdrawn", extra={"node": node, "error": str(e)})

    async def _annotate_state(self, annotations: Mapping[str, str | None]) -> bool:
        try:
            await annotate_state(self._api, self._namespace, self._state_configmap, annotations)
        except KubeError as e:
            self._metrics.errors.labels("replacement_record", type(e).__name__).inc()
            log.warning("replacement record not written; next round", extra={"error": str(e)})
            return False
        return True

    async def _view(self, r: Replacement, pool: Pool) -> ReplacementView:
        """A recorded replacement whose Node is gone: its owner gone, and the pool's new nodes."""
        try:
            owner = await read_owner(self._api, r.owner)
        except KubeError as e:
            self._metrics.errors.labels("read_owner", type(e).__name__).inc()
            return ReplacementView(node_present=False)
        if owner is not None:
            return ReplacementView(node_present=False, owner_gone=False)
        try:
            listed = await pool_nodes(self._api, pool.node_selector)
        except KubeError as e:
            self._metrics.errors.labels("list_nodes", type(e).__name__).inc()
            return ReplacementView(node_present=False)
        before = set(r.before)
        joined = tuple(
            sorted(
                name
                for obj in listed
                if (name := str(obj["metadata"]["name"])) not in before and _serving(obj, pool)
            )
        )
        return ReplacementView(node_present=False, owner_gone=True, joined=joined)

    async def _refused(self, node: str, owner: NodeOwner, what: str, e: KubeError) -> None:
        self._metrics.errors.labels(what, type(e).__name__).inc()
        if not self._access.failed(self._wall()):
            return
        message = (
            f"the API refuses gpumon the {owner.kind} {owner.name} ({e}): no replacement can run; "
            "with RBAC missing, apply deploy/rbac/controller-repair.yaml. Retrying with backoff"
        )
        log.error("repair replacement unavailable", extra={"kind": owner.kind, "error": str(e)})
        about = ObjectRef("Node", node)
        reason = "GpuRepairReplaceUnavailable"
        await self._recorder.record(Event(about, reason, message, warning=True, key=reason))

    def _answered(self) -> None:
        if self._access.succeeded():
            log.info("repair replacement available again")


def _serving(obj: Mapping[str, Any], pool: Pool) -> bool:
    """A node that replaces another: Ready, the GPU resources of the pool's template allocatable,
    and not quarantined by gpumon (its GPUs judged like any node's)."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    if c.LABEL_STATE in (meta.get("labels") or {}) or meta.get("deletionTimestamp"):
        return False
    ready = any(
        x.get("type") == "Ready" and x.get("status") == "True" for x in status.get("conditions") or ()
    )
    allocatable = status.get("allocatable") or {}
    return ready and all(r in allocatable for r in pool.template.gpu_resources)
