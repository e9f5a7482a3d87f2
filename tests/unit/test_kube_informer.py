"""gpumon's one informer against recorded API answers: paging, events, bookmarks, 410 Gone,
transport errors, the guard that keeps its own writes from being undone by a lagging watch, and
several views sharing one list and one watch (tests/unit/test_pod_watch.py runs it over HTTP)."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest

from gpumon.kube.client import Gone, KubeError, Unreachable
from gpumon.kube.informer import Informer, MalformedObject, Selection, View, failure_kind, object_key
from gpumon.kube.registry import Informers


def obj(name: str, rv: int, ns: str | None = None, **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": str(rv), "labels": labels}
    if ns:
        meta["namespace"] = ns
    return {"metadata": meta}


def line(kind: str, o: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": o}).encode() + b"\n"


class Recorded:
    """Answers lists from ``pages`` (consumed in order) and watches from ``streams``."""

    def __init__(
        self, pages: list[dict[str, Any] | Exception], streams: list[list[bytes] | Exception]
    ) -> None:
        self.pages = pages
        self.streams = streams
        self.lists: list[Mapping[str, str]] = []
        self.watches: list[Mapping[str, str]] = []
        self.done = asyncio.Event()
        self.gate = asyncio.Event()  # watches wait for it
        self.gate.set()

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        self.lists.append(dict(params or {}))
        if not self.pages:
            raise Unreachable("no more pages")
        answer = self.pages.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def lines(
        self, path: str, params: Mapping[str, str], *, opened: Callable[[], None] | None = None
    ) -> AsyncIterator[bytes]:
        self.watches.append(dict(params))
        await self.gate.wait()
        if not self.streams:
            self.done.set()
            await asyncio.Event().wait()  # a quiet watch, until cancelled
        script = self.streams.pop(0)
        if isinstance(script, Exception):
            raise script
        if opened is not None:
            opened()
        for item in script:
            yield item


def page(items: list[dict[str, Any]], rv: int, cont: str = "") -> dict[str, Any]:
    return {"items": items, "metadata": {"resourceVersion": str(rv), "continue": cont}}


def informer(path: str = "/x", **options: Any) -> Informer:
    # Watches follow each other at once: the recorded streams end at once.
    return Informer(Selection(path), min_watch_interval_seconds=0, **options)


async def run_until_done(informer: Informer, api: Recorded) -> None:
    task = asyncio.create_task(informer.run(api))
    try:
        async with asyncio.timeout(10):
            await api.done.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def names(view: View[Any]) -> dict[str, str]:
    return {k: v["metadata"]["resourceVersion"] for k, v in view.items().items()}


async def test_pages_then_events_then_bookmarks_with_changes_reported():
    api = Recorded(
        pages=[page([obj("a", 1, "ns")], 5, cont="tok"), page([obj("b", 2, "ns")], 5)],
        streams=[
            [
                line("ADDED", obj("c", 6, "ns")),
                line("MODIFIED", obj("a", 7, "ns", x="1")),
                line("BOOKMARK", {"metadata": {"resourceVersion": "9"}}),
                b"not json\n",  # ends the watch, as client-go's does: the next resumes at 9
                line("MODIFIED", obj("a", 11, "ns", x="2")),
            ],
            [line("DELETED", obj("b", 10, "ns"))],
        ],
    )
    changes: list[tuple[str, bool, bool]] = []
    errors: list[str] = []
    shared = informer(on_error=lambda name, e: errors.append(type(e).__name__))
    inf = shared.view(
        dict, name="t", on_change=lambda k, old, new: changes.append((k, old is None, new is None))
    )
    await run_until_done(shared, api)
    assert api.lists[1]["continue"] == "tok" and api.lists[0]["limit"] == "500"
    assert names(inf) == {"ns/a": "7", "ns/c": "6"}
    assert inf.synced.is_set()
    assert changes == [
        ("ns/a", True, False),
        ("ns/b", True, False),
        ("ns/c", True, False),
        ("ns/a", False, False),
        ("ns/b", False, True),
    ]
    # Each watch resumes where the last one ended (after the bookmark, after the deletion).
    assert [w["resourceVersion"] for w in api.watches] == ["5", "9", "10"]
    assert api.watches[0]["allowWatchBookmarks"] == "true" and api.watches[0]["watch"] == "true"
    assert errors == ["JSONDecodeError"]


async def test_410_relists_and_reports_the_difference():
    api = Recorded(
        pages=[page([obj("a", 1), obj("b", 1)], 5), page([obj("b", 8), obj("c", 8)], 8)],
        streams=[
            [line("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})],
        ],
    )
    changes: list[tuple[str, str]] = []

    def record(k: str, old: Any, new: Any) -> None:
        changes.append((k, "add" if old is None else "del" if new is None else "mod"))

    shared = informer()
    inf = shared.view(dict, name="t", on_change=record)
    await run_until_done(shared, api)
    assert names(inf) == {"b": "8", "c": "8"}
    assert shared.relists == 2
    assert changes[2:] == [("a", "del"), ("b", "mod"), ("c", "add")]
    assert api.watches[-1]["resourceVersion"] == "8"


EXPIRED = Gone(410, "Expired", "The provided continue parameter is too old to display a consistent list ...")


async def test_a_continue_token_expired_mid_list_is_finished_by_one_list_without_paging():
    api = Recorded(
        pages=[
            page([obj("a", 1), obj("b", 2)], 5, cont="t1"),
            page([obj("c", 3)], 5, cont="t2"),
            EXPIRED,
            # The list without paging: b was deleted since the first page, d added.
            page([obj("a", 1), obj("c", 3), obj("d", 9)], 9),
        ],
        streams=[],
    )
    errors: list[str] = []
    changes: list[str] = []
    shared = informer(page_size=2, on_error=lambda name, e: errors.append(f"{name}:{type(e).__name__}"))
    inf = shared.view(dict, name="t", on_change=lambda k, o, n: changes.append(k))
    await run_until_done(shared, api)
    assert [(p.get("limit"), p.get("continue")) for p in api.lists] == [
        ("2", None),
        ("2", "t1"),
        ("2", "t2"),
        (None, None),  # no page one again
    ]
    assert names(inf) == {"a": "1", "c": "3", "d": "9"} and changes == ["a", "c", "d"]
    assert shared.full_lists == 1 and shared.relists == 1 and errors == ["t:Gone"]
    assert api.watches[0]["resourceVersion"] == "9"


async def test_an_expired_first_page_lists_again_from_page_one():
    api = Recorded(pages=[EXPIRED, page([obj("a", 1)], 5)], streams=[])
    shared = informer()
    inf = shared.view(dict, name="t")
    await run_until_done(shared, api)
    assert [p.get("limit") for p in api.lists] == ["500", "500"] and names(inf) == {"a": "1"}
    assert shared.full_lists == 0


async def test_transport_errors_back_off_and_keep_the_cache():
    errors: list[str] = []
    api = Recorded(
        pages=[page([obj("a", 1)], 5)],
        streams=[Unreachable("connection refused"), KubeError(500, "InternalError"), []],
    )
    waits: list[tuple[int, str]] = []

    def backoff(attempt: int, name: str) -> float:
        waits.append((attempt, name))
        return 0.001

    shared = informer(backoff=backoff, on_error=lambda name, e: errors.append(f"{name}:{type(e).__name__}"))
    inf = shared.view(dict, name="t")
    await run_until_done(shared, api)
    assert names(inf) == {"a": "1"} and errors == ["t:Unreachable", "t:KubeError"]
    assert shared.up and shared.failure is None  # the last watch was answered
    # A failed watch is tried again from the version it had, later each time, without a list.
    assert waits == [(1, "t"), (2, "t")]
    assert [w["resourceVersion"] for w in api.watches] == ["5", "5", "5", "5"] and len(api.lists) == 1


async def test_a_malformed_event_lists_again():
    api = Recorded(
        pages=[page([obj("a", 1)], 5), page([obj("a", 7)], 7)],
        streams=[[line("MODIFIED", obj("a", 6)), b'{"no": "type"}\n']],
    )
    shared = informer(backoff=lambda attempt, name: 0.001)
    inf = shared.view(dict, name="t")
    await run_until_done(shared, api)
    assert names(inf) == {"a": "7"} and shared.relists == 2 and shared.failure is None
    assert [w["resourceVersion"] for w in api.watches] == ["5", "7"]


async def test_own_writes_are_not_undone_by_a_lagging_watch():
    api = Recorded(
        pages=[page([obj("a", 1)], 1)],
        streams=[[line("MODIFIED", obj("a", 3)), line("MODIFIED", obj("a", 6))]],
    )
    seen: list[str] = []
    shared = informer()
    inf = shared.view(
        dict, name="t", on_change=lambda k, o, n: seen.append(n["metadata"]["resourceVersion"] if n else "-")
    )
    api.gate.clear()
    task = asyncio.create_task(shared.run(api))
    await inf.synced.wait()
    inf.update_local("a", obj("a", 5), "5")  # written by this process after the list: answer rv 5
    api.gate.set()
    async with asyncio.timeout(10):
        await api.done.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert seen == ["1", "5", "6"]  # the older event (rv 3) was skipped
    assert names(inf) == {"a": "6"}


async def test_unchanged_views_are_stored_quietly_and_index_follows_moves():
    api = Recorded(
        pages=[page([obj("p", 1, "ns", node="n1")], 1)],
        streams=[
            [line("MODIFIED", obj("p", 2, "ns", node="n1")), line("MODIFIED", obj("p", 3, "ns", node="n2"))]
        ],
    )
    changes: list[str] = []

    def labels(o: Mapping[str, Any]) -> dict[str, str]:
        return dict(o["metadata"]["labels"])

    shared = informer()
    inf = shared.view(
        labels, name="t", index=lambda v: v["node"], on_change=lambda k, o, n: changes.append(k)
    )
    await run_until_done(shared, api)
    assert changes == ["ns/p", "ns/p"]  # the rv-only change was quiet
    assert inf.indexed("n1") == [] and inf.indexed("n2") == [{"node": "n2"}]
    assert inf.generation == 2


def test_object_keys():
    assert object_key(obj("a", 1)) == "a" and object_key(obj("a", 1, "ns")) == "ns/a"


async def test_a_listed_page_is_converted_with_the_collector_held_off():
    enabled_during: list[bool] = []

    def convert(o: Mapping[str, Any]) -> Mapping[str, Any]:
        enabled_during.append(gc.isenabled())
        return o

    api = Recorded(pages=[page([obj("a", 1), obj("b", 2)], 5, cont="t"), page([obj("c", 3)], 5)], streams=[])
    shared = informer()
    view = shared.view(convert, name="x")
    await run_until_done(shared, api)
    assert enabled_during == [False, False, False] and gc.isenabled()
    assert sorted(view.items()) == ["a", "b", "c"]


async def test_views_of_one_selection_share_one_list_and_one_watch():
    api = Recorded(
        pages=[page([obj("a", 1, "ns", size="1"), obj("b", 2, "ns")], 5)],
        streams=[[line("MODIFIED", obj("a", 6, "ns", size="2")), line("DELETED", obj("b", 7, "ns"))]],
    )
    errors: list[tuple[str, str]] = []
    informers = Informers(min_watch_interval_seconds=0, on_error=lambda n, e: errors.append((n, repr(e))))
    names_of = informers.informer(Selection("/pods")).view(lambda o: o["metadata"]["name"], name="names")
    sizes = informers.informer(Selection("/pods")).view(
        lambda o: int(o["metadata"]["labels"]["size"]), name="sizes"
    )
    pending = informers.informer(Selection("/pods", field_selector="spec.nodeName=")).view(
        dict, name="pending"
    )
    assert informers.informers == [names_of.informer, pending.informer]
    assert names_of.informer is sizes.informer and names_of.informer.name == "names+sizes"
    await run_until_done(names_of.informer, api)
    assert len(api.lists) == 1 and len(api.watches) == 2  # one list, then watches, for both views
    assert dict(names_of.items()) == {"ns/a": "a"} and dict(sizes.items()) == {"ns/a": 2}
    # A view that cannot convert an object leaves it out and says so; the other view keeps it.
    assert [(n, "MalformedObject(\"sizes: KeyError('size')\")") for n, _ in errors] == errors
    with pytest.raises(RuntimeError, match="after the informer started"):
        names_of.informer.view(dict, name="late")


def test_failures_are_named_for_the_error_metric():
    assert failure_kind(MalformedObject("x")) == "malformed_object"
    assert failure_kind(KubeError(403, "Forbidden")) == "forbidden"
    assert failure_kind(Unreachable("x", timed_out=True)) == "timeout"
