"""The nodes due for a look, in the order the reconciler's rounds take them.

A round acts only once it has looked at all of its nodes. A restart, a new leader's first
rounds and the periodic resync mark every node: at 10,000 nodes that whole-fleet round took
26 s beside the exporter streams' setup, and the node that broke while the controller was down
was tainted only at its end, 50 s from the restart (docs/benchmarks.md). So a round takes
``ROUND_NODES`` at most, and the nodes with something wrong go ahead of the rest, a node that
goes wrong while waiting its turn included.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterable

ROUND_NODES = 512
# Nodes looked at between two turns of the event loop, in a round and in judging marks. A
# round over a whole fleet is 10,000 evaluations at 0.35 ms each: held for the whole round, the
# loop starved the exporter streams and, before it had a thread of its own, the lease renewal
# (15-28 s rounds against the 10 s renew deadline; docs/benchmarks.md).
NODES_BETWEEN_YIELDS = 64


class DueQueue:
    def __init__(self, round_nodes: int = ROUND_NODES) -> None:
        self._round_nodes = round_nodes
        # A node moved ahead also keeps its place further back, skipped there once taken.
        self._order: collections.deque[str] = collections.deque()
        self._due: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self._due)

    async def add(self, nodes: Iterable[str], wrong: Callable[[str], bool]) -> None:
        """Queue ``nodes`` (in name order); those ``wrong`` says have something wrong go first,
        already queued or not."""
        names = sorted(nodes)
        ahead: list[str] = []
        for i, node in enumerate(names):
            if i and i % NODES_BETWEEN_YIELDS == 0:
                await asyncio.sleep(0)  # a reading is built on first access: 10,000 take a second
            if wrong(node):
                ahead.append(node)
        self._order.extendleft(reversed(ahead))
        first = set(ahead)
        self._order.extend(n for n in names if n not in first and n not in self._due)
        self._due.update(names)

    def take(self) -> list[str]:
        """The next round's nodes."""
        names: list[str] = []
        while self._order and len(names) < self._round_nodes:
            node = self._order.popleft()
            if node in self._due:
                self._due.discard(node)
                names.append(node)
        return names
