"""Signals straight from the exporters, no Prometheus: pushed health, pulled detail.

Each exporter is subscribed to once, at ``/api/v1/watch`` (newline-delimited JSON, see
docs/exporter.md): the current verdict of every GPU on connect, then each transition, and a
heartbeat when nothing changes. That costs next to nothing for the healthy majority of a fleet.
Nodes that need more (a GPU the exporter does not call healthy, or a node the controller is
watching: pending, quarantined, recovering) also have their ``/api/v1/snapshot`` fetched every
poll interval, with a bounded pool, for raw fields (temperature, ECC, row remapping, Xid
counters) and for which pods use which GPU. An exporter without the watch endpoint is polled
the same way. Xid codes come as the exporter's structured ``recent_xids`` (every code seen within
its ``health.xid_window_seconds``), which the controller classifies with its own Xid classes.

Freshness: a node counts as observed when its exporter last spoke (a heartbeat says "no
change"); an exporter whose device backend is down, or that cannot be reached, yields no reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Protocol

import aiohttp

from gpumon.controller.core.backoff import Backoff
from gpumon.controller.core.signals import ChangeCallback, FleetSignals, GpuReading, NodeReading
from gpumon.devices.model import HealthReason, HealthState, HealthVerdict, PodRef

log = logging.getLogger(__name__)

_ECC_DETAIL = re.compile(r"^(\d+) uncorrectable ECC")
_TEMP_DETAIL = re.compile(r"^temperature (\d+(?:\.\d+)?) C")


# ---------------------------------------------------------------------------------------------
# What the controller knows about one exporter (pure)


def verdict_from_json(doc: Mapping[str, Any]) -> HealthVerdict:
    state = HealthState(doc.get("state", "healthy"))
    reasons = tuple(
        HealthReason(
            str(r.get("code", "")), str(r.get("detail", "")), HealthState(r.get("state", state.value))
        )
        for r in doc.get("reasons") or ()
    )
    return HealthVerdict(state, reasons)


def xids_from_json(doc: Mapping[str, Any]) -> frozenset[int] | None:
    """The exporter's ``recent_xids``; None (cannot tell) when it does not send them."""
    codes = doc.get("recent_xids")
    return frozenset(int(c) for c in codes) if isinstance(codes, list) else None


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """One GPU as a watch line tells it: the exporter's verdict and its recent Xid codes."""

    index: int
    verdict: HealthVerdict
    recent_xids: frozenset[int] | None


def health_from_json(doc: Mapping[str, Any], index: int) -> GpuHealth:
    return GpuHealth(index, verdict_from_json(doc), xids_from_json(doc))


def gpu_from_verdict(uuid: str, health: GpuHealth, at: float) -> GpuReading:
    """What a verdict alone tells: the exporter flags any uncorrectable ECC error, row-remap
    failure or lost GPU, so their absence from the reasons means "none"; a temperature is known
    only when the verdict quotes one."""
    v = health.verdict
    codes = {r.code for r in v.reasons}
    ecc = next((int(m.group(1)) for r in v.reasons if (m := _ECC_DETAIL.match(r.detail))), 0)
    temp = next((float(m.group(1)) for r in v.reasons if (m := _TEMP_DETAIL.match(r.detail))), None)
    return GpuReading(
        uuid=uuid,
        index=health.index,
        observed_at=at,
        temperature_celsius=temp,
        ecc_uncorrectable=ecc,
        row_remap_failure="RowRemapFailure" in codes,
        lost=v.state is HealthState.LOST,
        health=v,
        recent_xids=health.recent_xids,
    )


_NO_VERDICTS: Mapping[str, GpuHealth] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ExporterView:
    node: str
    heard_at: float | None = None
    backend_up: bool = True
    verdicts: Mapping[str, GpuHealth] = field(default_factory=lambda: _NO_VERDICTS)
    verdicts_at: float = 0.0
    # From the latest /api/v1/snapshot, while the node is of interest.
    snapshot: tuple[GpuReading, ...] | None = None
    snapshot_at: float = 0.0
    pods_attributed: bool = False

    @property
    def troubled(self) -> bool:
        """The exporter calls some GPU not healthy, or reports a transition newer than the
        snapshot: detail is worth fetching."""
        bad = any(h.verdict.state is not HealthState.HEALTHY for h in self.verdicts.values())
        return bad or (self.snapshot is not None and self.verdicts_at > self.snapshot_at)


def on_message(view: ExporterView, msg: Mapping[str, Any], now: float) -> tuple[ExporterView, bool]:
    """Fold one watch line in; also says whether anything but the time changed."""
    kind = msg.get("type")
    if kind == "heartbeat":
        return replace(view, heard_at=now), False
    if kind == "backend":
        up = bool(msg.get("up"))
        return replace(view, heard_at=now, backend_up=up, verdicts_at=now), up != view.backend_up
    if kind == "state":
        verdicts = {
            str(g["uuid"]): health_from_json(g, int(g["gpu"])) for g in msg.get("gpus") or () if "uuid" in g
        }
        changed = verdicts != dict(view.verdicts) or bool(msg.get("backend_up", True)) != view.backend_up
        return (
            replace(
                view,
                heard_at=now,
                backend_up=bool(msg.get("backend_up", True)),
                verdicts=MappingProxyType(verdicts),
                verdicts_at=now if changed else view.verdicts_at,
            ),
            changed,
        )
    if kind == "health" and "uuid" in msg:
        verdicts = dict(view.verdicts)
        verdicts[str(msg["uuid"])] = health_from_json(msg, int(msg.get("gpu", -1)))
        return replace(view, heard_at=now, verdicts=MappingProxyType(verdicts), verdicts_at=now), True
    return replace(view, heard_at=now), False


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def on_snapshot(view: ExporterView, doc: Mapping[str, Any], now: float) -> ExporterView:
    """Fold an /api/v1/snapshot document in (raw fields, recent Xids, pods per GPU)."""
    pods: dict[str, list[PodRef]] = {}
    for p in doc.get("pods") or ():
        ref = p.get("ref") or {}
        if ref.get("pod"):
            pods.setdefault(str(p.get("gpu_uuid")), []).append(
                PodRef(
                    str(ref.get("namespace", "")),
                    str(ref["pod"]),
                    str(ref.get("container", "")),
                    str(ref.get("uid", "")),
                )
            )
    gpus: list[GpuReading] = []
    verdicts: dict[str, GpuHealth] = {}
    for g in doc.get("gpus") or ():
        ident = g.get("identity") or {}
        uuid, index = str(ident.get("uuid", "")), int(ident.get("index", -1))
        fast, slow = g.get("fast") or {}, g.get("slow") or {}
        health = GpuHealth(index, verdict_from_json(g.get("health") or {}), xids_from_json(g))
        verdicts[uuid] = health
        sampled = _num(g.get("sampled_at")) or 0.0
        remap = slow.get("row_remap_failure")
        ecc = slow.get("ecc_uncorrected")
        gpus.append(
            GpuReading(
                uuid=uuid,
                index=index,
                observed_at=min(sampled, now),
                temperature_celsius=_num(fast.get("temperature_gpu_celsius")),
                memory_utilization_ratio=_num(fast.get("memory_utilization_ratio")),
                ecc_uncorrectable=int(ecc) if isinstance(ecc, int) else None,
                row_remap_failure=bool(remap) if isinstance(remap, bool) else None,
                lost=bool(g.get("lost", False)),
                health=health.verdict,
                recent_xids=health.recent_xids,
                pods=tuple(pods.get(uuid, ())),
            )
        )
    return replace(
        view,
        heard_at=now,
        backend_up=bool(doc.get("backend_up", True)),
        verdicts=MappingProxyType(verdicts),
        verdicts_at=view.verdicts_at if verdicts == dict(view.verdicts) else now,
        snapshot=tuple(gpus),
        snapshot_at=now,
        pods_attributed=bool(pods),
    )


def reading_of(view: ExporterView) -> NodeReading | None:
    if view.heard_at is None or not view.backend_up:
        return None
    if view.snapshot is not None and view.snapshot_at >= view.verdicts_at:
        gpus = view.snapshot
        attributed: bool | None = view.pods_attributed
    else:
        gpus = tuple(
            gpu_from_verdict(uuid, health, view.heard_at)
            for uuid, health in sorted(view.verdicts.items(), key=lambda kv: kv[1].index)
        )
        # A troubled node's snapshot (with pod placement) is on its way.
        attributed = None if view.troubled else False
    return NodeReading(view.node, view.heard_at, gpus, pods_attributed=attributed)


# ---------------------------------------------------------------------------------------------
# Where the exporters are


class Endpoints(Protocol):
    changed: asyncio.Event

    def current(self) -> Mapping[str, str]:
        """Node name -> exporter base URL."""


class StaticEndpoints:
    """A fixed node -> URL map from config (tests, demo, or exporters outside the cluster)."""

    def __init__(self, urls: Mapping[str, str]) -> None:
        self._urls = dict(urls)
        self.changed = asyncio.Event()
        self.changed.set()

    def current(self) -> Mapping[str, str]:
        return self._urls


class _LazyReadings(Mapping[str, NodeReading]):
    """Readings built on first access and cached until that exporter's view changes."""

    def __init__(
        self, views: Mapping[str, ExporterView], cache: dict[str, tuple[ExporterView, NodeReading | None]]
    ):
        self._views = views
        self._cache = cache

    def __getitem__(self, node: str) -> NodeReading:
        view = self._views[node]
        hit = self._cache.get(node)
        if hit is None or hit[0] is not view:
            hit = (view, reading_of(view))
            self._cache[node] = hit
        if hit[1] is None:
            raise KeyError(node)
        return hit[1]

    def get(self, node: str, default: Any = None) -> Any:
        try:
            return self[node]
        except KeyError:
            return default

    def __contains__(self, node: object) -> bool:
        return isinstance(node, str) and self.get(node) is not None

    def __iter__(self) -> Iterator[str]:
        return (n for n in list(self._views) if n in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass(frozen=True, slots=True)
class DirectSettings:
    heartbeat_seconds: float = 10.0
    poll_interval_seconds: float = 5.0
    timeout_seconds: float = 5.0
    max_concurrency: int = 32
    bearer_token: str | None = None


RECONNECT_BACKOFF = Backoff(initial_seconds=0.5, max_seconds=30.0)


class DirectSource:
    """A :class:`SignalSource` subscribed to every exporter's watch stream."""

    name = "direct"

    def __init__(
        self,
        settings: DirectSettings,
        endpoints: Endpoints,
        session: aiohttp.ClientSession,
        *,
        wall_clock: Callable[[], float] = time.time,
        backoff: Backoff = RECONNECT_BACKOFF,
    ) -> None:
        self._s = settings
        self._endpoints = endpoints
        self._session = session
        self._clock = wall_clock
        self._backoff = backoff
        self._views: dict[str, ExporterView] = {}
        self._cache: dict[str, tuple[ExporterView, NodeReading | None]] = {}
        self._watchers: dict[str, tuple[str, asyncio.Task[None]]] = {}
        self._polled: set[str] = set()  # exporters without a watch endpoint
        self._focus: set[str] = set()
        self._urgent: set[str] = set()
        self._wake = asyncio.Event()
        self._limit = asyncio.Semaphore(settings.max_concurrency)
        self._on_change: ChangeCallback = lambda nodes: None
        self.errors = 0

    # -- the SignalSource face ----------------------------------------------------------------

    def current(self) -> FleetSignals:
        return FleetSignals(_LazyReadings(self._views, self._cache), source_up=True)

    def focus(self, nodes: Iterable[str]) -> None:
        """Nodes the controller is watching closely: their snapshots are polled too."""
        self._focus = set(nodes)

    @property
    def connected(self) -> int:
        return sum(1 for _, t in self._watchers.values() if not t.done())

    # -- I/O ----------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._s.bearer_token}"} if self._s.bearer_token else {}

    def _update(self, node: str, view: ExporterView, changed: bool) -> None:
        self._views[node] = view
        if view.troubled and node not in self._urgent and (changed or view.snapshot is None):
            self._urgent.add(node)
            self._wake.set()
        if changed:
            self._on_change((node,))

    async def _watch(self, node: str, url: str) -> None:
        attempt = 0
        hb = self._s.heartbeat_seconds
        timeout = aiohttp.ClientTimeout(sock_connect=self._s.timeout_seconds, sock_read=3 * hb + 5)
        while True:
            try:
                async with self._session.get(
                    url.rstrip("/") + "/api/v1/watch",
                    params={"heartbeat": f"{hb:g}"},
                    headers=self._headers(),
                    timeout=timeout,
                ) as resp:
                    if resp.status == 404:
                        log.info("exporter has no watch endpoint; polling it", extra={"node": node})
                        self._polled.add(node)
                        self._wake.set()
                        return
                    resp.raise_for_status()
                    attempt = 0
                    # A (re)connect's first line makes a stale node fresh even when its
                    # verdicts are the same as before: tell the reconciler.
                    reconnected = True
                    async for line in resp.content:
                        if not line.strip():
                            continue
                        view = self._views.get(node) or ExporterView(node)
                        view, changed = on_message(view, json.loads(line), self._clock())
                        self._update(node, view, changed or reconnected)
                        reconnected = False
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as e:
                self.errors += 1
                log.debug("exporter watch ended", extra={"node": node, "error": repr(e)})
            attempt += 1
            await asyncio.sleep(self._backoff.delay(attempt, salt=len(node)))

    async def _fetch_snapshot(self, node: str, url: str) -> None:
        async with self._limit:
            try:
                timeout = aiohttp.ClientTimeout(total=self._s.timeout_seconds)
                async with self._session.get(
                    url.rstrip("/") + "/api/v1/snapshot", headers=self._headers(), timeout=timeout
                ) as resp:
                    resp.raise_for_status()
                    doc = await resp.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                self.errors += 1
                log.debug("snapshot fetch failed", extra={"node": node, "error": repr(e)})
                return
        view = self._views.get(node) or ExporterView(node)
        new = on_snapshot(view, doc, self._clock())
        self._views[node] = new
        if reading_of(new) != reading_of(view):
            self._on_change((node,))

    def _sync_watchers(self) -> None:
        urls = self._endpoints.current()
        for node, (url, task) in list(self._watchers.items()):
            if urls.get(node) != url:
                task.cancel()
                del self._watchers[node]
                self._polled.discard(node)
        for node in [n for n in self._views if n not in urls]:
            del self._views[node]
            self._cache.pop(node, None)
            self._on_change((node,))
        for node, url in urls.items():
            if node not in self._watchers:
                self._watchers[node] = (
                    url,
                    asyncio.create_task(self._watch(node, url), name=f"watch {node}"),
                )

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        next_round = loop.time()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(next_round):
                    await self._wake.wait()
            self._wake.clear()
            urls = self._endpoints.current()
            if loop.time() >= next_round:
                wanted = self._focus | self._polled | {n for n, v in self._views.items() if v.troubled}
                next_round = loop.time() + self._s.poll_interval_seconds
                # Detail no longer needed: back to verdicts, so old detail never goes stale.
                for node, view in list(self._views.items()):
                    if node not in wanted and view.snapshot is not None:
                        self._views[node] = replace(view, snapshot=None, pods_attributed=False)
            else:
                wanted = set(self._urgent)
            self._urgent.clear()
            await asyncio.gather(*(self._fetch_snapshot(n, urls[n]) for n in wanted if n in urls))

    async def run(self, on_change: ChangeCallback) -> None:
        self._on_change = on_change
        poller = asyncio.create_task(self._poll(), name="direct snapshot poller")
        try:
            while True:
                await self._endpoints.changed.wait()
                self._endpoints.changed.clear()
                self._sync_watchers()
        finally:
            poller.cancel()
            for _, task in self._watchers.values():
                task.cancel()
            await asyncio.gather(poller, *(t for _, t in self._watchers.values()), return_exceptions=True)
            self._watchers.clear()
