"""Leader election on a coordination.k8s.io/v1 Lease (the client-go algorithm, small).

kubernetes_asyncio ships a leaderelection package, but it keeps time with naive local
datetimes and cannot tell its caller when leadership is about to lapse; the controller needs
that to fence its writes. So: :func:`decide` is the pure rule, :class:`LeaderElector` the loop,
which the controller runs on a thread and connection of its own
(:mod:`gpumon.controller.shell.lease_thread`): a busy main loop must never cost the lease.

- A candidate never trusts other machines' clocks: it takes over only after the lease record
  has stayed unchanged for ``lease_duration`` by its *own* monotonic clock.
- The leader renews every ``retry_period``; it considers itself leader only until
  ``renew_deadline`` after its last successful renewal. ``renew_deadline < lease_duration``,
  so the old leader has stopped acting before anyone else may start: no double actions.
- Writes carry the record's resourceVersion: of two racing candidates one gets 409 and waits.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpumon.kube.client import Conflict, KubeApi, KubeError, NotFound

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LeaderSettings:
    lease_duration_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    holder: str
    duration_seconds: float
    acquire_time: str | None
    renew_time: str | None
    transitions: int
    resource_version: str

    @property
    def version(self) -> tuple[str, str | None, str]:
        return (self.holder, self.renew_time, self.resource_version)


class Step(enum.StrEnum):
    CREATE = "create"
    RENEW = "renew"
    ACQUIRE = "acquire"
    WAIT = "wait"


def decide(
    record: LeaseRecord | None,
    me: str,
    *,
    observed_at: float,
    now: float,
    settings: LeaderSettings,
) -> Step:
    """What to do with the lease; ``observed_at`` is when (our monotonic clock) the record's
    current version was first seen."""
    if record is None:
        return Step.CREATE
    if record.holder == me:
        return Step.RENEW
    if not record.holder:
        return Step.ACQUIRE  # released on purpose
    duration = record.duration_seconds or settings.lease_duration_seconds
    return Step.ACQUIRE if now - observed_at >= duration else Step.WAIT


def _micro_time(wall: float) -> str:
    return dt.datetime.fromtimestamp(wall, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def record_from_json(obj: Mapping[str, Any]) -> LeaseRecord:
    spec = obj.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_seconds=float(spec.get("leaseDurationSeconds") or 0),
        acquire_time=spec.get("acquireTime"),
        renew_time=spec.get("renewTime"),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str((obj.get("metadata") or {}).get("resourceVersion", "")),
    )


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        *,
        namespace: str,
        name: str,
        identity: str,
        settings: LeaderSettings,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self._api = api
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self._collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._name = name
        self.identity = identity
        self._s = settings
        self._clock = clock
        self._wall = wall_clock
        self._on_change = on_change
        self._seen: tuple[tuple[str, str | None, str], float] | None = None
        self._leading_until = float("-inf")
        self._was_leader = False
        self._slow_logged = False  # the last round was slower than the renew deadline, and said so
        self._holds = False  # the last round that settled anything wrote the lease as ours

    def is_leader(self) -> bool:
        """True while a renewal younger than the renew deadline backs this replica."""
        return self._clock() < self._leading_until

    def _notify(self) -> None:
        leading = self.is_leader()
        if leading != self._was_leader:
            self._was_leader = leading
            log.info("leadership " + ("acquired" if leading else "lost"), extra={"identity": self.identity})
            if self._on_change is not None:
                self._on_change(leading)

    def _spec(self, record: LeaseRecord | None, *, acquiring: bool) -> dict[str, Any]:
        now = _micro_time(self._wall())
        transitions = record.transitions if record is not None else 0
        if acquiring and record is not None and record.holder != self.identity:
            transitions += 1
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self._s.lease_duration_seconds)),
            "acquireTime": now if acquiring or record is None else record.acquire_time,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    async def try_once(self) -> bool:
        """One round of the algorithm; True when this replica holds the lease afterwards."""
        started = self._clock()
        try:
            try:
                record: LeaseRecord | None = record_from_json(await self._api.get(self._path))
            except NotFound:
                record = None
            if record is not None and (self._seen is None or self._seen[0] != record.version):
                self._seen = (record.version, started)
            observed = self._seen[1] if self._seen is not None else started
            step = decide(record, self.identity, observed_at=observed, now=started, settings=self._s)
            if step is Step.WAIT:
                self._holds = False
                return False
            meta: dict[str, Any] = {"name": self._name}
            if step is Step.CREATE:
                await self._api.post(
                    self._collection, {"metadata": meta, "spec": self._spec(None, acquiring=True)}
                )
            else:
                assert record is not None
                meta["resourceVersion"] = record.resource_version
                body = {"metadata": meta, "spec": self._spec(record, acquiring=step is Step.ACQUIRE)}
                await self._api.put(self._path, body)
        except Conflict:
            self._holds = False
            return False  # someone else wrote first
        except KubeError as e:
            log.warning("lease round failed", extra={"error": str(e)})
            return False
        self._leading_until = started + self._s.renew_deadline_seconds
        self._holds = True
        took = self._clock() - started
        slow = took >= self._s.renew_deadline_seconds
        if slow and not self._slow_logged:
            # The lease is written and ours, yet its renewal is already older than the deadline
            # when the write returns: this replica holds the lease and never acts. Only a loop
            # or an API server this slow does it, and without this line only the leader gauge
            # at 0 would show it.
            log.warning(
                "lease round slower than the renew deadline: holding the lease without acting",
                extra={"seconds": round(took, 1), "renew_deadline_seconds": self._s.renew_deadline_seconds},
            )
        self._slow_logged = slow
        return True

    async def run(self) -> None:
        try:
            while True:
                try:
                    await self.try_once()
                except Exception:
                    # A bug, or an answer no Lease gives: said with its traceback and tried again
                    # next round; leadership lapses at its deadline as after any failed round.
                    log.exception("lease round failed unexpectedly", extra={"identity": self.identity})
                self._notify()
                # Wake when leadership would lapse, if that is sooner than the next round.
                wait = self._s.retry_period_seconds
                if self.is_leader():
                    wait = min(wait, max(0.0, self._leading_until - self._clock()))
                await asyncio.sleep(wait)
                self._notify()
        finally:
            self._leading_until = float("-inf")
            self._notify()

    async def release(self) -> None:
        """Give the lease up on a clean shutdown, so a standby takes over at once. Also after
        :meth:`run` has stopped (which already ended leadership): the record may still be ours."""
        self._leading_until = float("-inf")
        self._notify()
        if not self._holds:
            return
        self._holds = False
        try:
            record = record_from_json(await self._api.get(self._path))
            if record.holder != self.identity:
                return
            spec = {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "acquireTime": record.acquire_time,
                "renewTime": _micro_time(self._wall()),
                "leaseTransitions": record.transitions,
            }
            body = {
                "metadata": {"name": self._name, "resourceVersion": record.resource_version},
                "spec": spec,
            }
            await self._api.put(self._path, body)
        except KubeError as e:
            log.info("could not release the lease; it will expire", extra={"error": str(e)})
