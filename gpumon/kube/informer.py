"""The one list-then-watch cache (an informer) of gpumon, for both programs, and the views that
read it.

An :class:`Informer` lists one :class:`Selection` (a resource's path and its label and field
selectors) page by page, then watches it from the list's resourceVersion with bookmarks, and
hands every object to its :class:`View`\\s. A view is one reader's cache: it converts each object
with its own function into a slim value (objects are never kept whole: the converted views are
what memory holds), keyed by namespace/name or the reader's own key, indexed if asked, and tells
its ``on_change`` about every change that matters. Several readers of one selection share one
informer, and so one list and one watch (:class:`gpumon.kube.registry.Informers`).

When a watch ends, or fails (refused, unreachable), the informer watches again from the last
resourceVersion it saw; when the server answers 410 Gone (that version was compacted away), or
an answer is malformed, it lists again, and each view reports the differences. A list whose
``continue`` token expires between pages is finished by one list without paging rather than
started again from page one (:attr:`Informer.full_lists` counts them). Failures (API
unreachable, RBAC refusal, an API the server does not serve, a malformed answer) go to
``on_error``, are logged once per outage and retried with backoff; the views keep their last
contents meanwhile, and :attr:`Informer.synced` says whether they were ever filled. An object a
view cannot convert (KeyError, TypeError, AttributeError, ValueError) is left out of that view
and reported as :class:`MalformedObject`. Watches start at least ``min_watch_interval_seconds``
apart: a server (or proxy) that ends every watch at once would otherwise be watched again in a
tight loop, which cost 25-45 % of a core against a stand-in API server (issue #19).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gpumon.kube.client import Gone, KubeApi, KubeError, error_kind
from gpumon.runtime.gcpause import gc_paused

log = logging.getLogger(__name__)

T = TypeVar("T")


class MalformedObject(ValueError):
    """An object a view could not convert: left out of that view."""


def failure_kind(exc: BaseException) -> str:
    """The error-metric kind of a list or watch failure (:func:`gpumon.kube.client.error_kind`),
    ``malformed_object`` for an object a view could not convert."""
    return "malformed_object" if isinstance(exc, MalformedObject) else error_kind(exc)


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def uid_key(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"]["uid"])


def doubling(attempt: int, informer: str = "") -> float:
    """1, 2, 4 ... seconds, at most 30: the default wait before retry ``attempt`` (1-based)."""
    return min(30.0, 2.0 ** (attempt - 1))


def watch_wait(last_start: float | None, now: float, min_interval: float) -> float:
    """Seconds to wait before the next watch so that watches start ``min_interval`` apart."""
    if last_start is None:
        return 0.0
    return max(0.0, last_start + min_interval - now)


@dataclass(frozen=True, slots=True)
class Selection:
    """What one informer lists and watches, and the key of the registry: one per process."""

    path: str
    label_selector: str = ""
    field_selector: str = ""

    def params(self) -> dict[str, str]:
        out = {}
        if self.label_selector:
            out["labelSelector"] = self.label_selector
        if self.field_selector:
            out["fieldSelector"] = self.field_selector
        return out


class View(Generic[T]):
    """One reader's converted cache of an informer's objects; made by :meth:`Informer.view`."""

    def __init__(
        self,
        informer: Informer,
        convert: Callable[[Mapping[str, Any]], T | None],
        *,
        name: str,
        key: Callable[[Mapping[str, Any]], str],
        # Called as on_change(key, old, new): old None when added, new None when removed.
        on_change: Callable[[str, T | None, T | None], None] | None,
        same: Callable[[T, T], bool] | None,
        index: Callable[[T], str] | None,
    ) -> None:
        self.informer = informer
        self.name = name
        self.on_change = on_change
        self._convert = convert
        self._key = key
        self._same = same or (lambda a, b: a == b)
        self._index_of = index
        self._items: dict[str, T] = {}
        self._index: dict[str, set[str]] = {}
        # Versions this process wrote itself (see update_local).
        self._written: dict[str, int] = {}
        # Moves whenever the view changes: a reader compares it to rebuild only then.
        self.generation = 0

    @property
    def synced(self) -> asyncio.Event:
        return self.informer.synced

    # -- reading ------------------------------------------------------------------------------

    def get(self, key: str) -> T | None:
        return self._items.get(key)

    def items(self) -> Mapping[str, T]:
        return self._items

    def indexed(self, value: str) -> list[T]:
        return [self._items[k] for k in self._index.get(value, ())]

    def update_local(self, key: str, view: T, resource_version: str) -> None:
        """Take in an object this process just wrote (the API's answer), ahead of the watch.

        Until the watch catches up with that version, older events for the key are ignored in
        this view, so a reconcile never sees its own write undone by a lagging cache.
        resourceVersions are opaque by contract but etcd revisions in practice; a non-numeric
        one disables this."""
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

    # -- kept current by the informer -----------------------------------------------------------

    def _converted(self, obj: Mapping[str, Any], *, key_only: bool = False) -> tuple[str, T | None]:
        try:
            return self._key(obj), None if key_only else self._convert(obj)
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise MalformedObject(f"{self.name}: {e!r}") from None

    def _put(self, key: str, new: T | None) -> bool:
        old = self._items.get(key)
        if new is None:
            if old is None:
                return False
            del self._items[key]
        else:
            if old is not None and self._same(old, new):
                self._items[key] = new  # keep the newest (its resourceVersion), quietly
                return False
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
        self.generation += 1
        if self.on_change is not None:
            self.on_change(key, old, new)
        return True

    def _event(self, kind: str, obj: Mapping[str, Any], resource_version: str) -> None:
        key, new = self._converted(obj, key_only=kind == "DELETED")
        if kind == "DELETED" or not self._stale(key, resource_version):
            self._put(key, new)

    def _listed(self, seen: Mapping[str, T | None]) -> None:
        self._written.clear()  # a list is at least as new as anything written before it
        for key in [k for k in self._items if k not in seen]:
            self._put(key, None)
        for key, view in seen.items():
            self._put(key, view)


class Informer:
    """Lists and watches one :class:`Selection` for its views, for ever (:meth:`run`).

    ``on_error(name, exc)`` hears of every failure: a list or watch that failed, 410 Gone, an
    object a view could not convert (:class:`MalformedObject`). ``backoff(attempt, name)`` is the
    wait before retry ``attempt`` (the name, to spread informers' retries apart); ``sleep`` and
    ``clock`` are the loop's, replaceable in tests."""

    def __init__(
        self,
        selection: Selection,
        *,
        page_size: int = 500,
        watch_timeout_seconds: int = 300,
        backoff: Callable[[int, str], float] = doubling,
        min_watch_interval_seconds: float = 1.0,
        on_error: Callable[[str, Exception], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.selection = selection
        self._page_size = page_size
        self._watch_timeout = watch_timeout_seconds
        self._backoff = backoff
        self._min_watch_interval = min_watch_interval_seconds
        self._on_error = on_error
        self._sleep = sleep
        self._clock = clock
        self._views: list[View[Any]] = []
        self._started = False
        self._last_watch: float | None = None
        self.synced = asyncio.Event()
        # False from a failed list or watch until the next one answers.
        self.up = False
        # The error kind of the failure that ended the last list or watch; None once one answers.
        self.failure: str | None = None
        self.relists = 0
        # Lists whose continue token expired mid-way, finished by one list without paging.
        self.full_lists = 0
        self.watches = 0  # watches started

    @property
    def name(self) -> str:
        """Its views' names: what logs, task names and error metrics call it."""
        return "+".join(v.name for v in self._views) or self.selection.path

    @property
    def views(self) -> tuple[View[Any], ...]:
        return tuple(self._views)

    def view(
        self,
        convert: Callable[[Mapping[str, Any]], T | None],
        *,
        name: str,
        key: Callable[[Mapping[str, Any]], str] = object_key,
        on_change: Callable[[str, T | None, T | None], None] | None = None,
        same: Callable[[T, T], bool] | None = None,
        index: Callable[[T], str] | None = None,
    ) -> View[T]:
        """A new view of this informer's objects. Views are made before :meth:`run` starts: the
        informer keeps no objects to fill a late one with."""
        if self._started:
            raise RuntimeError(f"view {name!r} of {self.name!r} asked for after the informer started")
        made: View[T] = View(self, convert, name=name, key=key, on_change=on_change, same=same, index=index)
        self._views.append(made)
        return made

    def _report(self, exc: Exception) -> None:
        if self._on_error is not None:
            self._on_error(self.name, exc)

    async def run(self, api: KubeApi) -> None:
        """List, then watch from the list's resourceVersion, for ever; list again on 410 or a
        malformed answer, back off on errors."""
        self._started = True
        attempt = 0
        version = ""
        while True:
            try:
                if not version:
                    version = await self._list(api)
                    attempt = 0
                version = await self._watch(api, version)
                attempt = 0
            except Gone as e:
                log.info("watch expired; listing again", extra={"informer": self.name})
                self._report(e)
                version = ""
            except (KubeError, ValueError, KeyError, TypeError, AttributeError) as e:
                attempt += 1
                if not isinstance(e, KubeError):
                    # A malformed answer: watching from the same version would replay it.
                    version = ""
                kind = failure_kind(e)
                # Logged once per outage; on_error hears of every failure.
                log.log(
                    logging.DEBUG if self.failure is not None else logging.WARNING,
                    "%s failed; retrying with backoff",
                    self.name,
                    extra={"kind": kind, "error": str(e)[:200]},
                )
                self.up = False
                self.failure = kind
                self._report(e)
                await self._sleep(self._backoff(attempt, self.name))
                self._last_watch = None  # the backoff spaced this watch from the last one

    async def _list(self, api: KubeApi) -> str:
        seen: list[dict[str, Any]] = [{} for _ in self._views]
        cont = ""
        while True:
            params = {**self.selection.params(), "limit": str(self._page_size)}
            if cont:
                params["continue"] = cont
            try:
                doc = await api.get(self.selection.path, params)
            except Gone as e:
                if not cont:
                    raise
                # etcd compacted the revision of the list's first page away while it was being
                # paged. Starting again from page one could expire again, list after list, when
                # paging a large selection takes longer than the compaction interval; as
                # client-go's pager (FullListIfExpired, k8s.io/client-go/tools/pager/pager.go),
                # the whole selection is listed once without paging instead, and that list
                # replaces the pages converted so far: objects deleted since must not stay.
                log.info("list expired while paging; listing all at once", extra={"informer": self.name})
                self._report(e)
                self.full_lists += 1
                seen = [{} for _ in self._views]
                doc = await api.get(self.selection.path, self.selection.params())
            meta = doc["metadata"]
            with gc_paused():
                for obj in doc.get("items") or ():
                    for view, views_seen in zip(self._views, seen, strict=True):
                        self._convert_into(view, obj, views_seen)
                del doc  # the page is freed here, by reference counting
            version = str(meta["resourceVersion"])
            cont = str(meta.get("continue") or "")
            if not cont:
                break
        for view, views_seen in zip(self._views, seen, strict=True):
            view._listed(views_seen)
        self.relists += 1
        self.up = True
        self.failure = None
        self.synced.set()
        return version

    def _convert_into(self, view: View[Any], obj: Mapping[str, Any], seen: dict[str, Any]) -> None:
        try:
            key, value = view._converted(obj)
        except MalformedObject as e:
            self._report(e)
            return
        seen[key] = value

    async def _watch(self, api: KubeApi, version: str) -> str:
        params = {
            **self.selection.params(),
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self._watch_timeout),
        }
        wait = watch_wait(self._last_watch, self._clock(), self._min_watch_interval)
        if wait > 0:
            await self._sleep(wait)
        self._last_watch = self._clock()
        self.watches += 1
        async for line in api.lines(self.selection.path, params, opened=self._opened):
            try:
                event = json.loads(line)
            except ValueError as e:
                # As client-go's stream watcher: the watch ends, and the next one resumes from
                # the last version seen (nothing after it was applied).
                self._report(e)
                return version
            version = self._apply(event) or version
        return version

    def _opened(self) -> None:
        self.up = True
        self.failure = None

    def _apply(self, event: Mapping[str, Any]) -> str | None:
        """Apply one watch event to every view; returns the resourceVersion it carries."""
        kind = event["type"]
        obj = event.get("object") or {}
        if kind == "ERROR":
            code, reason, message = (
                int(obj.get("code") or 0),
                str(obj.get("reason", "")),
                str(obj.get("message", "")),
            )
            raise Gone(code, reason, message) if code == 410 else KubeError(code, reason, message)
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if kind == "BOOKMARK":
            return version or None
        for view in self._views:
            try:
                view._event(kind, obj, version)
            except MalformedObject as e:
                self._report(e)
        return version or None
