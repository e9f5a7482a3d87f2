"""Records :class:`plans.Event` values as core/v1 Events, once per (object, reason, key).

A plan is recomputed on every evaluation, so the same refusal or dry-run decision comes back
again and again; a repeat within ``repeat_after`` is dropped here instead of flooding the API.
Only an Event the API took counts. One it did not take (API server restarting) is kept and sent
again by :meth:`EventRecorder.retry` (the reconciler calls it every round it leads), a few times
at most: its decision may never come back, because the write it announced went through meanwhile.
Events about a Node live in the ``default`` namespace with the node's name as involved UID,
which is where ``kubectl describe node`` looks (the kubelet does the same).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from gpumon.controller.core.objects import to_rfc3339
from gpumon.controller.core.plans import Event
from gpumon.kube.client import KubeApi, KubeError

log = logging.getLogger(__name__)

COMPONENT = "gpumon-controller"
MAX_TRIES = 12  # per Event, as client-go's event broadcaster

_Key = tuple[str, str, str, str, str]


@dataclass(frozen=True, slots=True)
class _Pending:
    event: Event
    prefix: str
    at: float  # when it was decided: the Event's timestamp, however late it is sent
    tries: int


class EventRecorder:
    def __init__(
        self,
        api: KubeApi,
        *,
        instance: str,
        repeat_after_seconds: float = 3600.0,
        wall_clock: Callable[[], float] = time.time,
        on_result: Callable[[bool], None] | None = None,
    ) -> None:
        self._api = api
        self._instance = instance
        self._repeat_after = repeat_after_seconds
        self._wall = wall_clock
        self._on_result = on_result
        self._last: dict[_Key, float] = {}
        self._pending: dict[_Key, _Pending] = {}

    @staticmethod
    def _key(ev: Event) -> _Key:
        return (ev.about.kind, ev.about.namespace, ev.about.name, ev.reason, ev.key or ev.message)

    def _due(self, ev: Event, now: float) -> bool:
        last = self._last.get(self._key(ev))
        return last is None or now - last >= self._repeat_after

    def _sent(self, ev: Event, now: float) -> None:
        self._last[self._key(ev)] = now
        if len(self._last) > 50_000:  # forget the oldest half rather than grow for ever
            for k, _ in sorted(self._last.items(), key=lambda kv: kv[1])[: len(self._last) // 2]:
                del self._last[k]

    async def record(self, ev: Event, *, prefix: str = "") -> bool:
        """Create the Event unless it repeats a recent one; never raises."""
        now = self._wall()
        if not self._due(ev, now):
            return False
        waiting = self._pending.get(self._key(ev))
        return await self._post(waiting or _Pending(ev, prefix, now, 0), now)

    async def retry(self) -> None:
        """Send again what the API did not take; never raises."""
        now = self._wall()
        for key, waiting in list(self._pending.items()):
            if self._due(waiting.event, now):
                await self._post(waiting, now)
            else:  # taken meanwhile
                del self._pending[key]

    async def _post(self, pending: _Pending, now: float) -> bool:
        ev, prefix = pending.event, pending.prefix
        node = ev.about.kind == "Node"
        namespace = "default" if node else ev.about.namespace
        stamp = to_rfc3339(pending.at)
        body = {
            "metadata": {"generateName": f"{ev.about.name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": ev.about.api_version,
                "kind": ev.about.kind,
                "name": ev.about.name,
                "namespace": ev.about.namespace or None,
                "uid": ev.about.name if node else ev.about.uid,
            },
            "reason": ev.reason,
            "message": (prefix + ev.message)[:1024],
            "type": "Warning" if ev.warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        log.info(
            "event",
            extra={
                "object": f"{ev.about.kind}/{ev.about.name}",
                "reason": ev.reason,
                "text": prefix + ev.message,
            },
        )
        key = self._key(ev)
        try:
            await self._api.post(f"/api/v1/namespaces/{namespace}/events", body)
        except KubeError as e:
            tries = pending.tries + 1
            if tries < MAX_TRIES:
                self._pending[key] = replace(pending, tries=tries)
            else:
                self._pending.pop(key, None)
            log.warning(
                "could not record an event",
                extra={"reason": ev.reason, "error": str(e), "will_retry": tries < MAX_TRIES},
            )
            if self._on_result:
                self._on_result(False)
            return False
        self._pending.pop(key, None)
        self._sent(ev, now)
        if self._on_result:
            self._on_result(True)
        return True
