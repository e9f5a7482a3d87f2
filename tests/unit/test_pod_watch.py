"""The pod list+watch: projection, and the loop against recorded API responses served over HTTP
to gpumon's own API client (tests/cluster has it against the real API server)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from api_stand_in import until

from gpumon.exporter.pod_metadata import pod_watch, project_pod
from gpumon.k8s import sharing
from gpumon.kube.client import KubeClient
from gpumon.kube.credentials import Credentials
from gpumon.kube.informer import watch_wait

NODE = "gpu-node-1"


def pod(
    name: str,
    uid: str,
    *,
    phase: str = "Running",
    rv: str = "1",
    annotations: dict[str, str] | None = None,
    ready: bool = True,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": uid,
            "resourceVersion": rv,
            "annotations": {"unrelated": "x" * 100, **(annotations or {})},
        },
        "spec": {
            "nodeName": NODE,
            "initContainers": [{"name": "fetch", "resources": {}}],
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "limits": {sharing.GPUSHARE_MEMORY_RESOURCE: "4", "cpu": "2"},
                        "requests": {sharing.CGPU_CORE_RESOURCE: "25", "memory": "1Gi"},
                    },
                },
                {"name": "sidecar"},
            ],
        },
        "status": {
            "phase": phase,
            "initContainerStatuses": [{"name": "fetch", "containerID": f"containerd://{'0' * 63}1"}],
            "containerStatuses": [
                {"name": "main", "containerID": f"containerd://{'a' * 64}", "ready": ready},
                {"name": "sidecar"},  # not started yet: no ID
            ],
        },
    }


def test_projection_keeps_only_what_attribution_needs() -> None:
    p = project_pod(
        pod("a", "u1", annotations={sharing.GPUSHARE_INDEX: "0", "kubernetes.io/config.mirror": "h"})
    )
    assert p is not None
    assert (p.uid, p.namespace, p.name, p.mirror_uid) == ("u1", "ml", "a", "h")
    assert p.annotations == {sharing.GPUSHARE_INDEX: "0"}
    assert p.init_containers == (sharing.ContainerLimits("fetch", {}),)
    assert p.containers == (
        sharing.ContainerLimits(
            "main", {sharing.GPUSHARE_MEMORY_RESOURCE: "4", sharing.CGPU_CORE_RESOURCE: "25"}
        ),
        sharing.ContainerLimits("sidecar", {}),
    )
    assert p.container_ids == {"0" * 63 + "1": "fetch", "a" * 64: "main"}


def test_finished_pods_hold_nothing() -> None:
    assert project_pod(pod("a", "u1", phase="Succeeded")) is None
    assert project_pod(pod("a", "u1", phase="Failed")) is None


def test_status_churn_does_not_change_the_projection() -> None:
    assert project_pod(pod("a", "u1", rv="5", ready=False)) == project_pod(pod("a", "u1", rv="9"))


class FakeApi:
    """Serves scripted answers to GET /api/v1/pods, one per request, and records the requests."""

    def __init__(self, script: list[Callable[[web.Request], Awaitable[web.StreamResponse]]]) -> None:
        self.script = script
        self.requests: list[dict[str, str]] = []
        self.auth: list[str] = []
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(dict(request.query))
        self.auth.append(request.headers.get("Authorization", ""))
        if not self.script:
            await self.release.wait()
            return web.Response(status=503)
        return await self.script.pop(0)(request)


def listing(rv: str, *items: dict[str, Any]) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {"kind": "PodList", "metadata": {"resourceVersion": rv}, "items": list(items)}
        )

    return answer


def events(*evs: dict[str, Any]) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def answer(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for e in evs:
            data = json.dumps(e).encode() + b"\n"
            # Split events across writes, as chunked transfer does.
            await resp.write(data[:7])
            await resp.write(data[7:])
        await resp.write_eof()
        return resp

    return answer


def status(code: int) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.json_response({"kind": "Status", "code": code}, status=code)

    return answer


class Errors(list[tuple[str, str]]):
    def __call__(self, source: str, kind: str) -> None:
        self.append((source, kind))


class Delays(list[float]):
    """A fake sleep that records each delay and returns at once, until ``park_after`` delays:
    that one never returns, which parks the loop."""

    def __init__(self, park_after: int = 0) -> None:
        super().__init__()
        self.park_after = park_after
        self.parked = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.append(seconds)
        if len(self) == self.park_after:
            await self.parked.wait()


async def test_list_watch_resume_bookmark_and_relist_on_410(api_stand_in: Any) -> None:
    api = FakeApi(
        [
            listing("10", pod("a", "u1"), pod("done", "u0", phase="Succeeded")),
            events(
                {"type": "ADDED", "object": pod("b", "u2", rv="11")},
                {"type": "MODIFIED", "object": pod("a", "u1", rv="12", ready=False)},
                {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "15"}}},
            ),
            events({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}),
            listing("20", pod("a", "u1"), pod("b", "u2"), pod("c", "u3")),
            events({"type": "DELETED", "object": pod("a", "u1", rv="21")}),
        ]
    )
    core = await api_stand_in(api)
    errors = Errors()
    watch = pod_watch(NODE, errors, sleep=Delays().sleep)
    generations = []
    task = asyncio.create_task(watch.informer.run(core))
    try:
        await until(lambda: len(api.requests) == 6)
        generations.append(watch.generation)
    finally:
        api.release.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert [r.get("resourceVersion") for r in api.requests] == [None, "10", "15", None, "20", "21"]
    assert all(r["fieldSelector"] == f"spec.nodeName={NODE}" for r in api.requests)
    assert [r.get("watch", "") for r in api.requests] == ["", "true", "true", "", "true", "true"]
    assert api.requests[1]["allowWatchBookmarks"] == "true"
    assert set(api.auth) == {"Bearer t0ken"}
    assert sorted(p.name for p in watch.items().values()) == ["b", "c"]
    # list, ADDED b, (MODIFIED a changed nothing), relist adds c, DELETED a
    assert generations == [4]
    assert errors == [("api", "expired")]
    assert watch.synced.is_set()


class Warnings(logging.Handler):
    """The messages of the list+watch's own logger at WARNING and above, whatever another test
    left behind (``gpumon doctor`` and ``gpumon status`` call ``logging.disable`` for the process)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.logger = logging.getLogger("gpumon.kube.informer")

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self) -> Warnings:
        self.before = (self.logger.level, logging.root.manager.disable)
        self.logger.setLevel(logging.DEBUG)
        logging.disable(logging.NOTSET)
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.before[0])
        logging.disable(self.before[1])


async def test_rbac_refusal_backs_off_and_keeps_the_last_view(api_stand_in: Any) -> None:
    api = FakeApi([listing("10", pod("a", "u1")), status(403), status(403), status(403)])
    core = await api_stand_in(api)
    errors = Errors()
    delays = Delays(park_after=3)
    watch = pod_watch(NODE, errors, sleep=delays.sleep)
    with Warnings() as warnings:
        task = asyncio.create_task(watch.informer.run(core))
        try:
            await until(lambda: len(delays) == 3)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    # The watch is refused, then each watch again: forbidden each time, 1 s, 2 s, 4 s apart.
    assert errors == [("api", "forbidden")] * 3
    assert delays == [1.0, 2.0, 4.0]
    assert not watch.informer.up and watch.informer.failure == "forbidden"
    # One warning for the outage, not one per retry.
    assert warnings.messages == ["pod watch failed; retrying with backoff"]
    assert list(watch.items()) == ["u1"]


async def test_unreachable_api_is_counted() -> None:
    errors = Errors()
    delays: list[float] = []
    parked = asyncio.Event()

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        await parked.wait()

    async with KubeClient(Credentials("http://127.0.0.1:9", None)) as api:
        watch = pod_watch(NODE, errors, sleep=sleep)
        task = asyncio.create_task(watch.informer.run(api))
        try:
            await until(lambda: len(delays) == 1)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert errors == [("api", "unreachable")]
    assert not watch.synced.is_set() and watch.items() == {}


async def test_malformed_objects_are_skipped(api_stand_in: Any) -> None:
    api = FakeApi([listing("10", pod("a", "u1"), {"metadata": {"name": "no-uid"}})])
    core = await api_stand_in(api)
    errors = Errors()
    watch = pod_watch(NODE, errors)
    task = asyncio.create_task(watch.informer.run(core))
    try:
        await until(lambda: len(api.requests) == 2)
    finally:
        api.release.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert list(watch.items()) == ["u1"]
    assert errors == [("api", "malformed_object")]


def test_watches_start_a_minimum_interval_apart() -> None:
    assert watch_wait(None, 100.0, 1.0) == 0.0
    assert watch_wait(100.0, 100.0, 1.0) == 1.0
    assert watch_wait(100.0, 100.25, 1.0) == 0.75
    assert watch_wait(100.0, 101.0, 1.0) == 0.0
    assert watch_wait(100.0, 500.0, 1.0) == 0.0


async def test_a_watch_that_ends_at_once_is_not_rewatched_in_a_tight_loop(api_stand_in: Any) -> None:
    # A server that ends every watch at once, as a stand-in API server did: each new watch
    # waits out the minimum interval (the clock stands still here) instead of starting at once.
    api = FakeApi([listing("10", pod("a", "u1")), events(), events(), events(), events()])
    core = await api_stand_in(api)
    errors = Errors()
    delays = Delays(park_after=3)
    watch = pod_watch(NODE, errors, min_watch_interval_seconds=2.0, sleep=delays.sleep, clock=lambda: 50.0)
    task = asyncio.create_task(watch.informer.run(core))
    try:
        await until(lambda: len(delays) == 3 or len(api.requests) > 4, within=5.0)
    finally:
        api.release.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    # list, watch, then each further watch only after 2 s of (fake) time
    assert [r.get("watch", "") for r in api.requests] == ["", "true", "true", "true"]
    assert delays == [2.0, 2.0, 2.0]
    assert errors == []


async def test_a_watch_answered_again_is_up_before_any_event(api_stand_in: Any) -> None:
    # Refused, then answered but quiet: the pod source is up again without waiting for an event
    # (a quiet node's watch may carry none for minutes).
    api = FakeApi([listing("10", pod("a", "u1")), status(403), events()])
    core = await api_stand_in(api)
    errors = Errors()
    watch = pod_watch(NODE, errors, sleep=Delays().sleep)
    task = asyncio.create_task(watch.informer.run(core))
    try:
        await until(lambda: len(api.requests) == 4)  # the one after the quiet watch hangs
    finally:
        api.release.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert errors == [("api", "forbidden")]
    assert [r.get("resourceVersion") for r in api.requests] == [None, "10", "10", "10"]
    assert watch.informer.up and watch.informer.failure is None
