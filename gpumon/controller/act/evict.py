"""Evicts a pod through the Eviction API (PodDisruptionBudgets hold), or deletes it when a
drain escalates; remembers per pod when to try again and which pods are already on their way.

Preconditions on the pod's UID make sure a same-named successor of the pod that was planned for
is never touched. What a failure means is :mod:`.retry`'s to say.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gpumon.controller.act.retry import DEFAULT_RETRY, Outcome, RetryPolicy, outcome
from gpumon.controller.core.plans import DrainTarget
from gpumon.kube.client import KubeApi, KubeError

log = logging.getLogger(__name__)


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
    """Evicts (or, escalating, deletes) pods; remembers per pod when to try again after a
    refusal or a failure, and which pods it already evicted or deleted."""

    def __init__(self, api: KubeApi, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self._api = api
        self._retry = retry
        self._attempts: dict[str, int] = {}
        self._next_try: dict[str, float] = {}
        # Until a list of their node no longer shows these pods (settle), they are not evicted
        # again: the Eviction API accepts a second eviction of a terminating pod.
        self._done: set[str] = set()
        # The node of every pod remembered above: a list of the node settles them.
        self._node_of: dict[str, str] = {}

    def next_try_at(self, targets: Sequence[DrainTarget]) -> float | None:
        times = [self._next_try[t.pod.uid] for t in targets if t.pod.uid in self._next_try]
        return min(times) if times else None

    def forget(self, uid: str) -> None:
        """Drop what is remembered about a pod that is gone."""
        self._attempts.pop(uid, None)
        self._next_try.pop(uid, None)
        self._done.discard(uid)
        self._node_of.pop(uid, None)

    def settle(self, node: str, present: Collection[str]) -> None:
        """A list of ``node`` found the pods ``present`` (UIDs): forget the others of that node."""
        for uid in [u for u, n in self._node_of.items() if n == node and u not in present]:
            self.forget(uid)

    async def run(self, target: DrainTarget, *, now: float, delete: bool, dry_run: bool) -> EvictionOutcome:
        pod = target.pod
        if dry_run:
            return EvictionOutcome(target, EvictionResult.DRY_RUN)
        if pod.uid in self._done or (not delete and now < self._next_try.get(pod.uid, 0.0)):
            return EvictionOutcome(target, EvictionResult.WAITING)
        if pod.uid:
            self._node_of[pod.uid] = pod.node_name
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
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
        except KubeError as e:
            match outcome(e):
                # A failed UID precondition answers 409: the pod was replaced, ours is gone.
                case Outcome.GONE | Outcome.REPLAN:
                    result = EvictionResult.GONE
                case Outcome.BLOCKED:
                    self._back_off(pod.uid, now)
                    return EvictionOutcome(target, EvictionResult.BLOCKED, e.message)
                case Outcome.LATER:
                    log.warning(
                        "eviction failed", extra={"pod": f"{pod.namespace}/{pod.name}", "error": str(e)}
                    )
                    self._back_off(pod.uid, now)
                    return EvictionOutcome(target, EvictionResult.ERROR, str(e))
        self._attempts.pop(pod.uid, None)
        self._next_try.pop(pod.uid, None)
        if result is EvictionResult.GONE:
            self._node_of.pop(pod.uid, None)
        elif pod.uid:
            self._done.add(pod.uid)
        return EvictionOutcome(target, result)

    def _back_off(self, uid: str, now: float) -> None:
        attempts = self._attempts.get(uid, 0) + 1
        self._attempts[uid] = attempts
        self._next_try[uid] = now + self._retry.delay(attempts)
