"""Signals from the Prometheus HTTP API: a few instant queries per evaluation, in two steps.

Never one query per node. The first step asks the whole fleet for one sample per node (when it
was last scraped, whether pods run on its GPUs) and, per built-in signal the rules use, for the
GPUs some rule could hold for (gpumon.controller.core.promql), and runs each PromQL rule. The
second step reads GPU by GPU only the nodes of interest: those the first answers named, and those
the reconciler holds state on (``held``), in chunks of :data:`DETAIL_CHUNK` names. Every other
node gets a summary reading (``gpus_read=False``). The answers, and the controller's CPU and
memory for a round, then follow what is wrong, not the size of the fleet: at 65,000 nodes, every
GPU read every round cost the controller 32 s of CPU and 2.1 GiB a round (bench/RESULTS.md).

Queries go by POST (a chunk's node matcher outgrows a URL), concurrently within a step, each
with a timeout and retries. A failed round keeps the previous readings, which then age into
"stale" on their own. :meth:`PrometheusSource.poll_once` is one such round, usable on its own
(the benches).

Freshness comes from ``timestamp(gpumon_gpu_info)``: the time Prometheus last scraped each
exporter, so a dead exporter's last values (which Prometheus keeps returning for its lookback
window) are recognised as old.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import aiohttp

from gpumon.controller.core.backoff import Backoff
from gpumon.controller.core.policy import Rule
from gpumon.controller.core.promql import (
    BUSY,
    FRESHNESS,
    HEALTH_INFO,
    MISSING,
    NODES,
    PODS,
    SERIES,
    detail_queries,
    left_out,
    queries_for,
)
from gpumon.controller.core.signals import (
    EMPTY_FLEET,
    ChangeCallback,
    FleetSignals,
    GpuReading,
    NodeReading,
    XidSeen,
    is_news,
)
from gpumon.gpu.health import Scope, Signal
from gpumon.gpu.model import HealthReason, HealthState, HealthVerdict, PodRef, RecoveryAction

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Sample:
    labels: Mapping[str, str]
    value: float


def parse_vector(doc: Mapping[str, Any]) -> list[Sample]:
    """The samples of an instant-vector answer; raises ValueError for anything else.

    A sample that is not ``{"metric": {label: text}, "value": [time, number]}`` is skipped: one
    odd series must not cost the round (the fuzz tier found a ``result`` that is no list, and a
    value too large for a float, each escaping as another exception)."""
    if doc.get("status") != "success":
        raise ValueError(f"query failed: {doc.get('errorType', '')} {doc.get('error', '')}".strip())
    data = doc.get("data")
    if not isinstance(data, Mapping) or data.get("resultType") != "vector":
        kind = data.get("resultType") if isinstance(data, Mapping) else type(data).__name__
        raise ValueError(f"expected a vector, got {kind!r}")
    result = data.get("result") or []
    if not isinstance(result, list):
        raise ValueError(f"expected a list of samples, got {type(result).__name__}")
    out = []
    for item in result:
        try:
            metric, value = item["metric"], float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError, OverflowError):
            continue
        # A JSON object's keys are strings already, and the decoded dict is the sample's own:
        # wrapped, not copied (65,000 samples an answer at 65,000 nodes; a copy doubled the cost).
        if type(metric) is dict and all(type(v) is str for v in metric.values()):
            out.append(Sample(MappingProxyType(metric), value))
    return out


def _number(label: str) -> int | None:
    """A label that holds a GPU index or an Xid code. ASCII digits only: str.isdigit accepts
    "²" and "٣", which int() then refuses (found by the fuzz tier)."""
    return int(label) if label.isascii() and label.isdigit() else None


@dataclass
class _GpuSeries:
    uuid: str
    index: int
    at: float
    fields: dict[str, Any]


def readings_from_results(
    results: Mapping[str, Sequence[Sample]],
    rules: Sequence[Rule],
    *,
    node_label: str = "node",
    now: float,
) -> dict[str, NodeReading]:
    """Fold one round's answers into a reading per node (pure)."""
    gpus: dict[tuple[str, str], _GpuSeries] = {}
    by_index: dict[tuple[str, int], str] = {}
    for s in results.get(FRESHNESS, ()):
        node, uuid, index = s.labels.get(node_label), s.labels.get("uuid"), _number(s.labels.get("gpu", ""))
        if not node or not uuid or index is None:
            continue
        gpus[(node, uuid)] = _GpuSeries(uuid, index, min(s.value, now), {})
        by_index[(node, index)] = uuid

    def target(labels: Mapping[str, str]) -> _GpuSeries | None:
        node = labels.get(node_label, "")
        uuid = labels.get("uuid")
        if uuid is None and (index := _number(labels.get("gpu", ""))) is not None:
            uuid = by_index.get((node, index))
        return gpus.get((node, uuid)) if uuid else None

    # Only GPUs Prometheus scrapes (they have a freshness sample) get readings. A series a GPU
    # lacks stays None (unknown), except Xids and pods, whose absence means "none".
    for each in gpus.values():
        each.fields.update(xids=set(), pods=[], custom={}, quiet=set())
    for sig, series in SERIES.items():
        if sig.value not in results:
            continue
        field = _FIELDS[sig]
        lacking = _lacking(results.get(MISSING + sig.value, ()), node_label)
        # A GPU absent from the answer (which holds only values some rule could hold for) but not
        # lacking the series has the value the answer leaves out, or for a number: quiet.
        skip = left_out(sig, rules)
        numeric = series.one_hot is None and not series.boolean
        for (node, uuid), each in gpus.items():
            if (node, uuid) in lacking:
                continue
            if numeric:
                each.fields["quiet"].add(sig)
            elif skip is not None:
                each.fields[field] = _convert(sig, skip)
        for s in results.get(sig.value, ()):
            g = target(s.labels)
            if g is None:
                continue
            g.fields["quiet"].discard(sig)
            raw = s.labels.get(series.one_hot.label, "") if series.one_hot is not None else s.value
            try:
                g.fields[field] = _convert(sig, raw)
            except (ValueError, OverflowError):
                g.fields[field] = None  # a newer exporter's action or state: unknown, never a guess
    reasons: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for s in results.get(HEALTH_INFO, ()):
        key = (s.labels.get(node_label, ""), s.labels.get("uuid", ""))
        reasons.setdefault(key, []).append((s.labels.get("reason", ""), s.labels.get("detail", "")))
    for (node, uuid), each in gpus.items():
        state = each.fields.get("health")
        if state is not None:
            why = tuple(HealthReason(code, d, state) for code, d in reasons.get((node, uuid), []))
            each.fields["health"] = HealthVerdict(state, why)
    for s in results.get(Signal.XID.value, ()):
        g = target(s.labels)
        # xid="other" (undocumented codes, gpumon.gpu.model.XID_OTHER) names no code to judge.
        code = _number(s.labels.get("xid", ""))
        if g is not None and code is not None:
            g.fields["xids"].add(code)
    attributed: set[str] = set()
    for s in results.get(PODS, ()):
        g = target(s.labels)
        if g is not None and s.labels.get("pod"):
            ref = PodRef(s.labels.get("namespace", ""), s.labels["pod"], s.labels.get("container", ""))
            g.fields["pods"].append(ref)
            attributed.add(s.labels.get(node_label, ""))
    node_custom: dict[str, dict[str, float]] = {}
    for r in rules:
        if r.signal is not Signal.PROMQL:
            continue
        for s in results.get(f"rule:{r.name}", ()):
            if r.scope is Scope.NODE:
                node_custom.setdefault(s.labels.get(node_label, ""), {})[r.name] = s.value
            else:
                g = target(s.labels)
                if g is not None:
                    g.fields["custom"][r.name] = s.value

    nodes: dict[str, list[GpuReading]] = {}
    for (node, _), g in sorted(gpus.items(), key=lambda kv: (kv[0][0], kv[1].index)):
        f = g.fields
        nodes.setdefault(node, []).append(
            GpuReading(
                uuid=g.uuid,
                index=g.index,
                observed_at=g.at,
                temperature_celsius=f.get("temperature_celsius"),
                memory_utilization_ratio=f.get("memory_utilization_ratio"),
                ecc_uncorrectable=f.get("ecc_uncorrectable"),
                row_remap_failure=f.get("row_remap_failure"),
                lost=f.get("lost"),
                recovery_action=f.get("recovery_action"),
                health=f.get("health"),
                xids=_seen(f["xids"], g.at) if Signal.XID.value in results else None,
                pods=tuple(f["pods"]),
                custom=MappingProxyType(dict(f["custom"])),
                quiet=frozenset(f["quiet"]),
            )
        )
    out = {
        node: NodeReading(
            node=node,
            observed_at=max(g.observed_at for g in gs),
            gpus=tuple(gs),
            pods_attributed=node in attributed,
            custom=MappingProxyType(node_custom.get(node, {})),
            busy=node in attributed,
        )
        for node, gs in nodes.items()
    }
    busy = {s.labels.get(node_label, "") for s in results.get(BUSY, ())}
    for s in results.get(NODES, ()):
        node = s.labels.get(node_label)
        if node and node not in out:
            out[node] = NodeReading(
                node=node,
                observed_at=min(s.value, now),
                gpus=(),
                custom=MappingProxyType(node_custom.get(node, {})),
                busy=node in busy,
                gpus_read=False,
            )
    return out


def named(
    results: Mapping[str, Sequence[Sample]], rules: Sequence[Rule], node_label: str = "node"
) -> set[str]:
    """The nodes the first step's answers name as possibly wrong: every node in a built-in
    signal's answer (which holds only values some rule could hold for), and those for which a
    PromQL rule holds (its author's query may answer for every node)."""
    custom = {f"rule:{r.name}": r for r in rules if r.signal is Signal.PROMQL}
    out: set[str] = set()
    for name, samples in results.items():
        if name in (NODES, BUSY):
            continue
        rule = custom.get(name)
        out.update(
            node
            for s in samples
            if (node := s.labels.get(node_label)) and (rule is None or rule.holds(s.value))
        )
    return out


# A Kubernetes node name (a DNS subdomain): what a node matcher may hold unescaped but the dot.
NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


_FIELDS: Mapping[Signal, str] = MappingProxyType(
    {
        Signal.TEMPERATURE: "temperature_celsius",
        Signal.MEMORY_UTILIZATION: "memory_utilization_ratio",
        Signal.ECC_UNCORRECTABLE: "ecc_uncorrectable",
        Signal.ROW_REMAP_FAILURE: "row_remap_failure",
        Signal.GPU_LOST: "lost",
        Signal.RECOVERY_ACTION: "recovery_action",
        Signal.EXPORTER_HEALTH: "health",
    }
)


def _convert(sig: Signal, key: float | str) -> Any:
    """A signal's value from its sample's number, or for a one-hot signal its label; raises
    ValueError (or OverflowError) for one it cannot hold."""
    match sig:
        case Signal.ECC_UNCORRECTABLE:
            return int(float(key))
        case Signal.ROW_REMAP_FAILURE | Signal.GPU_LOST:
            return bool(float(key))
        case Signal.RECOVERY_ACTION:
            return RecoveryAction.from_label(str(key))
        case Signal.EXPORTER_HEALTH:
            return HealthState(str(key))
        case _:
            return float(key)


def _lacking(samples: Iterable[Sample], node_label: str) -> set[tuple[str, str]]:
    """(node, uuid) of the GPUs a signal's missing-query names."""
    return {(s.labels.get(node_label, ""), s.labels.get("uuid", "")) for s in samples}


def _seen(codes: Iterable[int], at: float) -> tuple[XidSeen, ...]:
    """The Xid query answers codes that rose within the controller's own Xid window, without
    a time: each counts as seen when the GPU was last scraped, which the policy's window (the
    same setting) then keeps."""
    return tuple(XidSeen(code, at) for code in sorted(codes))


QUERY_BACKOFF = Backoff(initial_seconds=0.5, max_seconds=5.0)
_SECRET = re.compile(r"(?i)(authorization|token)=[^&\s]+")


@dataclass(frozen=True, slots=True)
class PrometheusSettings:
    url: str
    interval_seconds: float = 10.0
    timeout_seconds: float = 5.0
    retries: int = 2
    xid_window_seconds: float = 600.0
    stale_after_seconds: float = 60.0
    node_label: str = "node"
    bearer_token: str | None = None
    # Also read the exporter's verdict of every GPU with no rule on it: the repair ladder waits
    # for a repaired GPU to be judged healthy again, and without this never saw it.
    verdicts: bool = False
    # Also read which nodes run pods on their GPUs, for the autoscaler's scale-down.
    busy: bool = False


# Node names per query of the second step. Prometheus turns a regex matcher into a set lookup in
# its index only up to 256 alternatives (maxSetMatches in model/labels/regexp.go, 2.x and 3.x);
# past that it runs the expression on every value of the label, 65,000 node names at 65,000 nodes.
DETAIL_CHUNK = 256


# Queries in flight at once. A rule that holds on most of a fleet (a hot machine room) names most
# nodes: 254 chunks of nine queries at 65,000 nodes, each a connection of its own without a bound.
# Prometheus itself runs 20 at once by default (--query.max-concurrency) and queues the rest,
# their wait counted against each query's timeout; here the wait comes before the timeout starts.
QUERIES_AT_ONCE = 16


def chunks(names: Sequence[str], size: int) -> list[Sequence[str]]:
    return [names[i : i + size] for i in range(0, len(names), size)]


class PrometheusSource:
    """A :class:`SignalSource` polling a few fleet-wide instant queries per round."""

    name = "prometheus"

    def __init__(
        self,
        settings: PrometheusSettings,
        rules: Sequence[Rule],
        session: aiohttp.ClientSession,
        *,
        wall_clock: Callable[[], float] = time.time,
        backoff: Backoff = QUERY_BACKOFF,
        on_round: Callable[[bool, float], None] | None = None,
        held: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        """``held``: the nodes the reconciler holds state on, read at each round: they are
        read GPU by GPU whatever the answers say."""
        self._s = settings
        self._held = held
        self._rules = tuple(rules)
        self._session = session
        self._clock = wall_clock
        self._backoff = backoff
        self._on_round = on_round
        self._fleet = EMPTY_FLEET

    def current(self) -> FleetSignals:
        return self._fleet

    async def _query(self, promql: str, at: float) -> list[Sample]:
        headers = {"Authorization": f"Bearer {self._s.bearer_token}"} if self._s.bearer_token else {}
        url = self._s.url.rstrip("/") + "/api/v1/query"
        last: Exception | None = None
        for attempt in range(self._s.retries + 1):
            if attempt:
                await asyncio.sleep(self._backoff.delay(attempt))
            try:
                timeout = aiohttp.ClientTimeout(total=self._s.timeout_seconds)
                async with self._session.post(
                    url, data={"query": promql, "time": f"{at:.3f}"}, headers=headers, timeout=timeout
                ) as resp:
                    doc = await resp.json(content_type=None)
                    if resp.status >= 500:
                        raise ValueError(f"HTTP {resp.status}")
                    return parse_vector(doc if isinstance(doc, dict) else {})
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                last = e
        raise ConnectionError(_SECRET.sub(r"\1=…", f"{promql[:200]!r}: {last!r}"))

    def queries(self) -> dict[str, str]:
        """Query name -> PromQL of each round's first step."""
        return queries_for(
            self._rules,
            self._s.xid_window_seconds,
            self._s.node_label,
            verdicts=self._s.verdicts,
            busy=self._s.busy,
        )

    async def _answers(self, queries: Sequence[tuple[str, str]], at: float) -> dict[str, list[Sample]]:
        """Each query's samples by name, those sharing a name (a step's chunks) together."""
        gate = asyncio.Semaphore(QUERIES_AT_ONCE)

        async def one(promql: str) -> list[Sample]:
            async with gate:
                return await self._query(promql, at)

        answers = await asyncio.gather(*(one(q) for _, q in queries))
        out: dict[str, list[Sample]] = {}
        for (name, _), samples in zip(queries, answers, strict=True):
            out.setdefault(name, []).extend(samples)
        return out

    def _detail(self, nodes: Collection[str]) -> list[tuple[str, str]]:
        """The second step's queries for ``nodes``, a chunk at a time. A name that is not a
        Kubernetes node's cannot be one gpumon acts on, and would not be matched literally."""
        readable = sorted(n for n in nodes if NODE_NAME.fullmatch(n))
        return [
            item
            for chunk in chunks(readable, DETAIL_CHUNK)
            for item in detail_queries(
                self._rules, chunk, self._s.node_label, verdicts=self._s.verdicts
            ).items()
        ]

    async def poll_once(self) -> Iterable[str]:
        """One round; returns the nodes whose reading changed."""
        now = self._clock()
        started = time.monotonic()
        try:
            results = await self._answers(list(self.queries().items()), now)
            interest = named(results, self._rules, self._s.node_label) | set(self._held())
            results.update(await self._answers(self._detail(interest), now))
        except ConnectionError as e:
            log.warning("prometheus round failed; keeping the last readings", extra={"error": str(e)})
            self._fleet = replace(self._fleet, source_up=False)
            if self._on_round:
                self._on_round(False, time.monotonic() - started)
            return ()
        nodes = readings_from_results(results, self._rules, node_label=self._s.node_label, now=now)
        old = self._fleet.nodes
        # Read after the answers: a staleness check that ran while they came judged `old`.
        at = self._clock()
        stale_after = self._s.stale_after_seconds
        changed = set(nodes) ^ set(old) | {
            n for n in nodes if n in old and is_news(old[n], nodes[n], at, stale_after)
        }
        self._fleet = FleetSignals(MappingProxyType(nodes), source_up=True)
        if self._on_round:
            self._on_round(True, time.monotonic() - started)
        return changed

    async def run(self, on_change: ChangeCallback) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            changed = await self.poll_once()
            # Unchanged readings still age: evaluation tracks that through next_check_at.
            if changed:
                on_change(changed)
            await asyncio.sleep(max(0.0, self._s.interval_seconds - (loop.time() - started)))
