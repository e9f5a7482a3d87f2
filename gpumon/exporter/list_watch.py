"""One collection of API objects kept current by list+watch, the exporter's only informer: its
node's pods (:mod:`pod_metadata`) and its node's ResourceSlices (:mod:`dra_slices`) each run one.
The requests go through gpumon.kube.client (plain aiohttp), not the generated client.

Only a projection of each object is kept, made by a function the caller passes in; objects are
read as raw JSON, never deserialised into the client's model classes, which would cost far more
than the watch itself.

The watch resumes from the last resourceVersion it saw (bookmarks included) and relists when
the server answers 410 Gone. Failures (API unreachable, RBAC refusal, an API the server does
not serve, malformed objects) are counted through the error sink, logged once per outage and
retried with capped exponential backoff; the last good view stays in place meanwhile. Watches
start at least ``min_watch_interval_seconds`` apart: a server (or proxy) that ends every watch at
once would otherwise be re-watched in a tight loop, which cost 25-45 % of a core against a
stand-in API server (issue #19).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, TypeVar

from gpumon.devices.backend import ErrorSink
from gpumon.kube.client import Gone, KubeApi, KubeError, error_kind

log = logging.getLogger(__name__)

T = TypeVar("T")


class _Expired(Exception):
    """The watch's resourceVersion is gone (410): relist."""


def watch_wait(last_start: float | None, now: float, min_interval: float) -> float:
    """Seconds to wait before the next watch so that watches start ``min_interval`` apart."""
    if last_start is None:
        return 0.0
    return max(0.0, last_start + min_interval - now)


class ListWatch(Generic[T]):
    """The objects of ``path`` matching ``field_selector``, projected, by UID; ``generation``
    moves whenever the view changes. ``project`` returns None for an object to leave out and
    raises KeyError/TypeError/AttributeError on one of the wrong shape (counted
    ``malformed_object``)."""

    def __init__(
        self,
        path: str,
        field_selector: str,
        project: Callable[[Mapping[str, Any]], T | None],
        errors: ErrorSink,
        *,
        source: str,
        what: str,
        watch_timeout_seconds: int = 300,
        max_backoff_seconds: float = 30.0,
        min_watch_interval_seconds: float = 1.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path = path
        self._selector = field_selector
        self._projection = project
        self._errors = errors
        self._source = source
        self._what = what
        self._watch_timeout = watch_timeout_seconds
        self._max_backoff = max_backoff_seconds
        self._min_watch_interval = min_watch_interval_seconds
        self._sleep = sleep
        self._clock = clock
        self._last_watch: float | None = None
        self.items: dict[str, T] = {}
        self.generation = 0
        self.up = False
        self.synced = False
        # The error kind of the failure that ended the last list or watch; None once one succeeds.
        self.failure: str | None = None

    async def run(self, api: KubeApi) -> None:
        """List, then watch from the list's resourceVersion, forever."""
        backoff = 1.0
        while True:
            try:
                version = await self._list(api)
                backoff = 1.0
                while True:
                    version = await self._watch(api, version)
            except _Expired:
                self._errors(self._source, "expired")
            except Exception as e:
                kind = error_kind(e)
                # Logged once per outage; the error metric counts every failure.
                log.log(
                    logging.DEBUG if self.failure is not None else logging.WARNING,
                    "%s failed; retrying with backoff",
                    self._what,
                    extra={"kind": kind, "error": str(e)[:200]},
                )
                self.up = False
                self.failure = kind
                self._errors(self._source, kind)
                await self._sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)

    async def _list(self, api: KubeApi) -> str:
        body = await api.get(self._path, {"fieldSelector": self._selector})
        items: dict[str, T] = {}
        for obj in body.get("items") or ():
            item = self._project(obj)
            if item is not None:
                items[obj["metadata"]["uid"]] = item
        if items != self.items:
            self.items = items
            self.generation += 1
        self.up = self.synced = True
        self.failure = None
        return str(body["metadata"]["resourceVersion"])

    async def _watch(self, api: KubeApi, version: str) -> str:
        params = {
            "fieldSelector": self._selector,
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self._watch_timeout),
        }
        wait = watch_wait(self._last_watch, self._clock(), self._min_watch_interval)
        if wait > 0:
            await self._sleep(wait)
        self._last_watch = self._clock()
        self.up = True
        try:
            async for line in api.lines(self._path, params):
                version = self._apply(json.loads(line)) or version
        except Gone:
            raise _Expired from None
        return version

    def _apply(self, event: Mapping[str, Any]) -> str | None:
        """Apply one watch event; returns the resourceVersion it carries."""
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Expired
            raise KubeError(int(obj.get("code") or 0), str(obj.get("reason", "")))
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED"):
            item = self._project(obj)
            uid = obj["metadata"]["uid"]
            if item is None:
                self._remove(uid)
            elif self.items.get(uid) != item:
                self.items[uid] = item
                self.generation += 1
        elif kind == "DELETED":
            self._remove(obj["metadata"]["uid"])
        return str(version) if version else None

    def _project(self, obj: Mapping[str, Any]) -> T | None:
        try:
            obj["metadata"]["uid"]
            return self._projection(obj)
        except (KeyError, TypeError, AttributeError):
            self._errors(self._source, "malformed_object")
            return None

    def _remove(self, uid: str) -> None:
        if self.items.pop(uid, None) is not None:
            self.generation += 1
