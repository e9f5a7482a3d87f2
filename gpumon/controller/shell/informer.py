"""A small list-then-watch cache (an informer) for one kind of object.

kubernetes_asyncio has ``watch/`` but no informer, so here is one: list (paged), then watch from
the list's resourceVersion with bookmarks, keep slim converted views keyed by namespace/name,
and tell a callback about every change that matters. When the watch ends the informer watches
again from the last resourceVersion it saw; when the server answers 410 Gone (that version is
compacted away) it lists again and reports the differences. Transport errors back off and
retry for ever: the cache keeps its last contents meanwhile, and :attr:`Informer.synced` says
whether it has ever been filled.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from gpumon.controller.core.backoff import Backoff
from gpumon.gcpause import gc_paused
from gpumon.kube.client import Gone, KubeApi, KubeError

log = logging.getLogger(__name__)

T = TypeVar("T")

WATCH_BACKOFF = Backoff(initial_seconds=0.5, max_seconds=30.0)


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


class Informer(Generic[T]):
    def __init__(
        self,
        api: KubeApi,
        path: str,
        convert: Callable[[Mapping[str, Any]], T | None],
        *,
        name: str,
        params: Mapping[str, str] | None = None,
        # Called as on_change(key, old, new): old None when added, new None when removed.
        on_change: Callable[[str, T | None, T | None], None] | None = None,
        same: Callable[[T, T], bool] | None = None,
        index: Callable[[T], str] | None = None,
        backoff: Backoff = WATCH_BACKOFF,
        page_size: int = 500,
        watch_timeout_seconds: int = 300,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.name = name
        self._api = api
        self._path = path
        self._convert = convert
        self._params = dict(params or {})
        self.on_change = on_change
        self._same = same or (lambda a, b: a == b)
        self._index_of = index
        self._backoff = backoff
        self._page_size = page_size
        self._watch_timeout = watch_timeout_seconds
        self._on_error = on_error
        self._items: dict[str, T] = {}
        self._index: dict[str, set[str]] = {}
        # Versions this process wrote itself (see update_local).
        self._written: dict[str, int] = {}
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0

    # -- reading ------------------------------------------------------------------------------

    def get(self, key: str) -> T | None:
        return self._items.get(key)

    def items(self) -> Mapping[str, T]:
        return self._items

    def indexed(self, value: str) -> list[T]:
        return [self._items[k] for k in self._index.get(value, ())]

    def update_local(self, key: str, view: T, resource_version: str) -> None:
        """Take in an object this process just wrote (the API's answer), ahead of the watch.

        Until the watch catches up with that version, older events for the key are ignored, so
        a reconcile never sees its own write undone by a lagging cache. resourceVersions are
        opaque by contract but etcd revisions in practice; a non-numeric one disables this."""
        if resource_version.isdigit():
            self._written[key] = int(resource_version)
        self._put(key, view)

    def _stale(self, key: str, resource_version: str) -> bool:
        mine = self._written.get(key)
        if mine is None or not resource_version.isdigit():
            return False
        if int(resource_version) < mine:
            return True
        del self._written[key]
        return False

    # -- keeping it current -------------------------------------------------------------------

    def _put(self, key: str, new: T | None) -> None:
        old = self._items.get(key)
        if new is None:
            if old is None:
                return
            del self._items[key]
        else:
            if old is not None and self._same(old, new):
                self._items[key] = new  # keep the newest (its resourceVersion), quietly
                return
            self._items[key] = new
        if self._index_of is not None:
            if old is not None:
                keys = self._index.get(self._index_of(old))
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._index[self._index_of(old)]
            if new is not None:
                self._index.setdefault(self._index_of(new), set()).add(key)
        if self.on_change is not None:
            self.on_change(key, old, new)

    async def _list(self) -> str:
        seen: dict[str, T | None] = {}
        cont = ""
        rv = ""
        while True:
            params = {**self._params, "limit": str(self._page_size)}
            if cont:
                params["continue"] = cont
            doc = await self._api.get(self._path, params)
            meta = doc.get("metadata") or {}
            with gc_paused():
                for obj in doc.get("items") or ():
                    seen[object_key(obj)] = self._convert(obj)
                del doc  # the page is freed here, by reference counting
            rv = str(meta.get("resourceVersion", ""))
            cont = str(meta.get("continue") or "")
            if not cont:
                break
        self._written.clear()  # a list is at least as new as anything written before it
        for key in [k for k in self._items if k not in seen]:
            self._put(key, None)
        for key, view in seen.items():
            self._put(key, view)
        self.relists += 1
        return rv

    async def _watch(self, rv: str) -> str:
        params = {
            **self._params,
            "watch": "1",
            "resourceVersion": rv,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self._watch_timeout),
        }
        async for line in self._api.lines(self._path, params):
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            kind = ev.get("type")
            obj = ev.get("object") or {}
            if kind == "ERROR":
                code = obj.get("code")
                if code == 410:
                    raise Gone(410, str(obj.get("reason", "Expired")), str(obj.get("message", "")))
                raise KubeError(int(code or 0), str(obj.get("reason", "")), str(obj.get("message", "")))
            rv = str((obj.get("metadata") or {}).get("resourceVersion", rv))
            if kind == "BOOKMARK":
                continue
            key = object_key(obj)
            if kind != "DELETED" and self._stale(key, rv):
                continue
            self._put(key, None if kind == "DELETED" else self._convert(obj))
        return rv

    async def run(self) -> None:
        """List, then watch for ever; relist on 410, back off on errors."""
        attempt = 0
        rv = ""
        while True:
            try:
                if not rv:
                    rv = await self._list()
                    self.synced.set()
                rv = await self._watch(rv)
                self.resource_version = rv
                attempt = 0
            except Gone:
                log.info("watch expired; listing again", extra={"informer": self.name})
                rv = ""
            except KubeError as e:
                attempt += 1
                if self._on_error is not None:
                    self._on_error(type(e).__name__)
                delay = self._backoff.delay(attempt, salt=sum(map(ord, self.name)))
                log.warning(
                    "list/watch failed; retrying",
                    extra={"informer": self.name, "error": str(e), "retry_in": round(delay, 2)},
                )
                await asyncio.sleep(delay)
