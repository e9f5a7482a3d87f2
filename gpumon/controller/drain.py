"""Which pods leave a quarantined node (pure), and the Eviction API calls that move them.

Partial drain: when the exporter says which pods use which GPU, only the pods on the bad GPUs
go, plus any GPU pod the exporter cannot place (it might be on a bad GPU). Otherwise every GPU
pod on the node goes. DaemonSet pods (they belong to the node) and mirror pods (the kubelet
owns them) are never evicted. Evictions go through the Eviction API so PodDisruptionBudgets
hold; a 429 is retried with backoff until the node's deadline, then the configured escalation
applies: ``report`` (an Event, nothing forced; the default) or ``delete``.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from gpumon.controller.backoff import Backoff
from gpumon.controller.contract import NodeState
from gpumon.controller.kube import KubeApi, KubeError, NotFound, TooManyRequests
from gpumon.controller.objects import PdbView, PodView, pdbs_covering
from gpumon.controller.plans import DrainPlan, DrainTarget
from gpumon.controller.signals import NodeReading
from gpumon.controller.verdicts import NodeVerdict, Severity

log = logging.getLogger(__name__)


class Escalation(enum.StrEnum):
    REPORT = "report"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class DrainPolicy:
    enabled: bool = True
    # Degraded GPUs get a PreferNoSchedule taint; evicting their pods too is opt-in.
    on_degraded: bool = False
    deadline_seconds: float = 600.0
    escalation: Escalation = Escalation.REPORT


def needs_drain(verdict: NodeVerdict, policy: DrainPolicy) -> bool:
    severity = verdict.severity
    if not policy.enabled or severity is None:
        return False
    return severity is Severity.UNHEALTHY or policy.on_degraded


def _skip_reason(pod: PodView) -> str | None:
    if pod.mirror:
        return "mirror pod (owned by the kubelet)"
    if pod.owner_kind == "DaemonSet":
        return "DaemonSet pod"
    return None


def plan_drain(
    verdict: NodeVerdict,
    reading: NodeReading | None,
    pods: Sequence[PodView],
    pdbs: Sequence[PdbView],
    *,
    now: float,
    started_at: float,
    policy: DrainPolicy,
) -> DrainPlan:
    """The pods to evict from a quarantined node now (``pods`` are the node's pods)."""
    deadline = started_at + policy.deadline_seconds
    if not verdict.whole_node and reading is not None and reading.pods_attributed is None:
        # Which pod holds the bad GPU is being fetched: wait for it rather than evict them all.
        return DrainPlan(NodeState.DRAINING, (), partial=True, deadline_at=deadline, overdue=False)
    drain_severities = {Severity.UNHEALTHY} | ({Severity.DEGRADED} if policy.on_degraded else set())
    bad = {g.uuid: g for g in verdict.gpus if g.severity in drain_severities}
    partial = not verdict.whole_node and reading is not None and reading.pods_attributed is True
    placed: dict[tuple[str, str], list[int]] = {}
    bad_users: dict[tuple[str, str], list[str]] = {}
    if partial and reading is not None:
        for g in reading.gpus:
            for ref in g.pods:
                placed.setdefault((ref.namespace, ref.pod), []).append(g.index)
                if g.uuid in bad:
                    bad_users.setdefault((ref.namespace, ref.pod), []).append(f"GPU {g.index} ({g.uuid})")
    targets: list[DrainTarget] = []
    skipped: list[tuple[PodView, str]] = []
    for pod in sorted(pods, key=lambda p: p.key):
        if not pod.uses_gpu or pod.terminating or pod.finished:
            continue
        why_not = _skip_reason(pod)
        if why_not is not None:
            skipped.append((pod, why_not))
            continue
        if not partial:
            why = "GPU pod on a node with unhealthy GPUs"
        elif pod.key in bad_users:
            why = "uses " + ", ".join(dict.fromkeys(bad_users[pod.key]))
        elif pod.key not in placed:
            why = "GPU pod the exporter does not place on any GPU"
        else:
            continue
        targets.append(DrainTarget(pod, why, pdbs_covering(pod, pdbs)))
    return DrainPlan(
        phase=NodeState.DRAINING if targets else NodeState.DRAINED,
        targets=tuple(targets),
        partial=partial,
        deadline_at=deadline,
        overdue=bool(targets) and now >= deadline,
        skipped=tuple(skipped),
    )


# ---------------------------------------------------------------------------------------------
# Actuator


class EvictionResult(enum.StrEnum):
    EVICTED = "evicted"
    BLOCKED = "blocked"  # 429: a PDB (or the API's rate limit) says not now
    GONE = "gone"  # already deleted
    DELETED = "deleted"  # escalation
    ERROR = "error"
    DRY_RUN = "dry_run"
    WAITING = "waiting"  # not tried now: backing off, or already evicted and on its way out


@dataclass(frozen=True, slots=True)
class EvictionOutcome:
    target: DrainTarget
    result: EvictionResult
    detail: str = ""


class Evictor:
    """Evicts (or, escalating, deletes) pods; remembers per pod when to try again after a 429,
    and which pods it already evicted or deleted."""

    def __init__(self, api: KubeApi, backoff: Backoff) -> None:
        self._api = api
        self._backoff = backoff
        self._attempts: dict[str, int] = {}
        self._next_try: dict[str, float] = {}
        # Until the pod cache sees these pods go (forget), they are not evicted again: a cache
        # that lags behind (its watch reconnecting after an API server restart) still shows
        # them running, and the Eviction API accepts a second eviction of a terminating pod.
        self._done: set[str] = set()

    def next_try_at(self, targets: Sequence[DrainTarget]) -> float | None:
        times = [self._next_try[t.pod.uid] for t in targets if t.pod.uid in self._next_try]
        return min(times) if times else None

    def forget(self, uid: str) -> None:
        """Drop what is remembered about a pod that is gone."""
        self._attempts.pop(uid, None)
        self._next_try.pop(uid, None)
        self._done.discard(uid)

    async def run(self, target: DrainTarget, *, now: float, delete: bool, dry_run: bool) -> EvictionOutcome:
        pod = target.pod
        if dry_run:
            return EvictionOutcome(target, EvictionResult.DRY_RUN)
        if pod.uid in self._done or (not delete and now < self._next_try.get(pod.uid, 0.0)):
            return EvictionOutcome(target, EvictionResult.WAITING)
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
        # Preconditions: never act on a same-named successor of the pod we planned for.
        preconditions = {"uid": pod.uid} if pod.uid else None
        try:
            if delete:
                await self._api.delete(path, {"preconditions": preconditions} if preconditions else None)
                result = EvictionResult.DELETED
            else:
                body = {
                    "apiVersion": "policy/v1",
                    "kind": "Eviction",
                    "metadata": {"name": pod.name, "namespace": pod.namespace},
                    "deleteOptions": {"preconditions": preconditions} if preconditions else {},
                }
                await self._api.post(path + "/eviction", body)
                result = EvictionResult.EVICTED
        except NotFound:
            result = EvictionResult.GONE
        except TooManyRequests as e:
            attempts = self._attempts.get(pod.uid, 0) + 1
            self._attempts[pod.uid] = attempts
            self._next_try[pod.uid] = now + self._backoff.delay(attempts)
            return EvictionOutcome(target, EvictionResult.BLOCKED, e.message)
        except KubeError as e:
            if e.status == 409:  # precondition failed: the pod was replaced
                result = EvictionResult.GONE
            else:
                log.warning("eviction failed", extra={"pod": f"{pod.namespace}/{pod.name}", "error": str(e)})
                attempts = self._attempts.get(pod.uid, 0) + 1
                self._attempts[pod.uid] = attempts
                self._next_try[pod.uid] = now + self._backoff.delay(attempts)
                return EvictionOutcome(target, EvictionResult.ERROR, str(e))
        self._attempts.pop(pod.uid, None)
        self._next_try.pop(pod.uid, None)
        if result is not EvictionResult.GONE and pod.uid:
            self._done.add(pod.uid)
        return EvictionOutcome(target, result)
