"""Reading what the controller wrote on Nodes (docs/architecture.md, "The node-health
contract"): its taint, its Events, and every change of the taint as a watch reports it, so that
a test can count exactly how often a node was tainted and untainted."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from kubernetes_asyncio import client, watch
from prometheus_client.parser import text_string_to_metric_families

TAINT_KEY = "gpumon.io/gpu-unhealthy"
NODE_EVENTS_NAMESPACE = "default"  # where the controller records a Node's Events


def our_taint(node: client.V1Node) -> str | None:
    """The effect of gpumon's taint on ``node``, None without it."""
    return next((t.effect for t in node.spec.taints or () if t.key == TAINT_KEY), None)


async def tainted(core: client.CoreV1Api, name: str) -> bool:
    return our_taint(await core.read_node(name)) is not None


async def node_events(
    core: client.CoreV1Api, node: str, reason: str | None = None
) -> list[client.CoreV1Event]:
    found = await core.list_namespaced_event(
        NODE_EVENTS_NAMESPACE, field_selector=f"involvedObject.name={node}"
    )
    return [e for e in found.items if reason is None or e.reason == reason]


def metric(text: bytes, name: str, **labels: str) -> float | None:
    """One sample of a Prometheus text exposition, None when absent."""
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.name == name and labels.items() <= s.labels.items():
                return float(s.value)
    return None


@dataclass
class TaintHistory:
    """Every change of gpumon's taint on some nodes: (seconds since start, node, effect or None)."""

    core: client.CoreV1Api
    nodes: tuple[str, ...]
    changes: list[tuple[float, str, str | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.started = time.monotonic()
        self._last: dict[str, str | None] = {}

    def of(self, node: str) -> list[str | None]:
        return [effect for _, n, effect in self.changes if n == node]

    def _see(self, node: client.V1Node) -> None:
        name, effect = node.metadata.name, our_taint(node)
        if name in self.nodes and self._last.get(name, None) != effect:
            self._last[name] = effect
            self.changes.append((round(time.monotonic() - self.started, 2), name, effect))

    async def _follow(self) -> None:
        listed = await self.core.list_node()
        for n in listed.items:
            self._see(n)
        version = listed.metadata.resource_version
        while True:
            async with watch.Watch() as w:
                events = w.stream(self.core.list_node, resource_version=version, timeout_seconds=60)
                async for event in events:
                    obj = event["object"]
                    version = obj.metadata.resource_version
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._see(obj)

    @contextlib.asynccontextmanager
    async def recording(self) -> AsyncIterator[TaintHistory]:
        task = asyncio.create_task(self._follow(), name="taint-history")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
