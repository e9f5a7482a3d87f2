"""This node's pods, kept current by one list+watch (``fieldSelector=spec.nodeName=<node>``).
The requests go through gpumon.kubeclient (plain aiohttp), not the generated client.

Only a slim projection of each pod is kept (:class:`PodMeta`): what attribution needs to name a
container and read its shared-GPU allocation. Objects are read as raw JSON, never deserialised
into the client's model classes, which would cost far more than the watch itself.

The watch resumes from the last resourceVersion it saw (bookmarks included) and relists when
the server answers 410 Gone. Failures (API unreachable, RBAC refusal, malformed objects) are
counted through the error sink and retried with capped exponential backoff; the last good view
stays in place meanwhile. Watches start at least ``min_watch_interval_seconds`` apart: a server
(or proxy) that ends every watch at once would otherwise be re-watched in a tight loop, which
cost 25-45 % of a core against a stand-in API server (issue #19).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from gpumon import sharing
from gpumon.devices.backend import ErrorSink
from gpumon.kubeclient import ApiStatusError

log = logging.getLogger(__name__)

SOURCE = "api"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class PodMeta:
    uid: str
    namespace: str
    name: str
    init_containers: tuple[sharing.ContainerLimits, ...]
    containers: tuple[sharing.ContainerLimits, ...]
    # Runtime container ID (bare, without "containerd://") -> container name, for every
    # container, init and ephemeral container that has started.
    container_ids: Mapping[str, str]
    # Only the annotations sharing.py reads.
    annotations: Mapping[str, str]
    # A static pod runs under the UID of its manifest hash, which its API mirror carries in
    # this annotation while having a UID of its own.
    mirror_uid: str = ""


def project_pod(obj: Mapping[str, Any]) -> PodMeta | None:
    """The slim view of a raw Pod object, or None for a pod that holds no GPU any more
    (terminal phase). Raises KeyError/TypeError/AttributeError on an object of the wrong shape."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if status.get("phase") in _TERMINAL_PHASES:
        return None
    annotations = meta.get("annotations") or {}
    ids: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or ():
            _, sep, bare = (cs.get("containerID") or "").partition("://")
            if sep and bare:
                ids[bare] = cs["name"]
    return PodMeta(
        uid=meta["uid"],
        namespace=meta["namespace"],
        name=meta["name"],
        init_containers=tuple(sharing.container_limits(c) for c in spec.get("initContainers") or ()),
        containers=tuple(sharing.container_limits(c) for c in spec.get("containers") or ()),
        container_ids=ids,
        annotations={k: str(v) for k, v in annotations.items() if k in sharing.ANNOTATIONS},
        mirror_uid=str(annotations.get(MIRROR_ANNOTATION, "")),
    )


class _Expired(Exception):
    """The watch's resourceVersion is gone (410): relist."""


def error_kind(exc: BaseException) -> str:
    """A short error-metric kind for a failed list or watch."""
    if isinstance(exc, ApiStatusError):
        return {401: "unauthorized", 403: "forbidden", 404: "not_found"}.get(exc.status, f"http_{exc.status}")
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientError | OSError):
        return "unreachable"
    if isinstance(exc, ValueError | KeyError | TypeError | AttributeError):
        return "malformed_response"
    return "error"


PODS = "/api/v1/pods"


class PodsApi(Protocol):
    """GET on the API server, the raw response streamed (:class:`gpumon.kubeclient.KubeClient`)."""

    def get(
        self, path: str, params: Mapping[str, str], timeout: aiohttp.ClientTimeout
    ) -> AbstractAsyncContextManager[aiohttp.ClientResponse]: ...


def watch_wait(last_start: float | None, now: float, min_interval: float) -> float:
    """Seconds to wait before the next watch so that watches start ``min_interval`` apart."""
    if last_start is None:
        return 0.0
    return max(0.0, last_start + min_interval - now)


class PodMetadataWatch:
    """The pods of one node by UID; ``generation`` moves whenever the view changes."""

    def __init__(
        self,
        node: str,
        errors: ErrorSink,
        *,
        watch_timeout_seconds: int = 300,
        request_timeout_seconds: float = 30.0,
        max_backoff_seconds: float = 30.0,
        min_watch_interval_seconds: float = 1.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._selector = f"spec.nodeName={node}"
        self._errors = errors
        self._watch_timeout = watch_timeout_seconds
        self._request_timeout = request_timeout_seconds
        self._max_backoff = max_backoff_seconds
        self._min_watch_interval = min_watch_interval_seconds
        self._sleep = sleep
        self._clock = clock
        self._last_watch: float | None = None
        self.pods: dict[str, PodMeta] = {}
        self.generation = 0
        self.up = False
        self.synced = False

    async def run(self, api: PodsApi) -> None:
        """List, then watch from the list's resourceVersion, forever."""
        backoff = 1.0
        while True:
            try:
                version = await self._list(api)
                backoff = 1.0
                while True:
                    version = await self._watch(api, version)
            except _Expired:
                self._errors(SOURCE, "expired")
            except Exception as e:
                kind = error_kind(e)
                self.up = False
                self._errors(SOURCE, kind)
                log.warning("pod watch failed; retrying", extra={"kind": kind, "error": str(e)[:200]})
                await self._sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)

    async def _list(self, api: PodsApi) -> str:
        params = {"fieldSelector": self._selector}
        async with api.get(PODS, params, aiohttp.ClientTimeout(total=self._request_timeout)) as resp:
            _check(resp)
            body = await resp.json(content_type=None)
        pods: dict[str, PodMeta] = {}
        for obj in body.get("items") or ():
            pod = self._project(obj)
            if pod is not None:
                pods[pod.uid] = pod
        if pods != self.pods:
            self.pods = pods
            self.generation += 1
        self.up = self.synced = True
        return str(body["metadata"]["resourceVersion"])

    async def _watch(self, api: PodsApi, version: str) -> str:
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
        timeout = aiohttp.ClientTimeout(
            sock_connect=self._request_timeout, sock_read=self._watch_timeout + 30
        )
        async with api.get(PODS, params, timeout) as resp:
            if resp.status == 410:
                raise _Expired
            _check(resp)
            self.up = True
            async for line in _lines(resp.content):
                version = self._apply(json.loads(line)) or version
        return version

    def _apply(self, event: Mapping[str, Any]) -> str | None:
        """Apply one watch event; returns the resourceVersion it carries."""
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Expired
            raise ApiStatusError(int(obj.get("code") or 0))
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED"):
            pod = self._project(obj)
            uid = obj["metadata"]["uid"]
            if pod is None:
                self._remove(uid)
            elif self.pods.get(uid) != pod:
                self.pods[uid] = pod
                self.generation += 1
        elif kind == "DELETED":
            self._remove(obj["metadata"]["uid"])
        return str(version) if version else None

    def _project(self, obj: Mapping[str, Any]) -> PodMeta | None:
        try:
            return project_pod(obj)
        except (KeyError, TypeError, AttributeError):
            self._errors(SOURCE, "malformed_object")
            return None

    def _remove(self, uid: str) -> None:
        if self.pods.pop(uid, None) is not None:
            self.generation += 1


def _check(resp: aiohttp.ClientResponse) -> None:
    if not 200 <= resp.status < 300:
        raise ApiStatusError(resp.status)


async def _lines(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Newline-delimited JSON of any line length (``readline`` caps lines at 128 KiB)."""
    pending = b""
    async for chunk in stream.iter_any():
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if line.strip():
                yield line
    if pending.strip():
        yield pending
