"""Each ``/api/v1/watch`` subscriber's queue of watch events, bounded so a slow reader costs
the exporter a fixed amount of memory: one that falls behind is told to re-read the whole state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gpumon.exporter.watch_events import WatchEvent

WATCH_QUEUE_SIZE = 256


class Watcher:
    """One subscriber's queue of watch events. ``None`` in the queue means "events were lost
    because you fell behind: re-send the whole state"."""

    def __init__(self, maxsize: int = WATCH_QUEUE_SIZE) -> None:
        self.queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue(maxsize)

    def push(self, events: Sequence[WatchEvent]) -> None:
        for ev in events:
            try:
                self.queue.put_nowait(ev)
            except asyncio.QueueFull:
                while not self.queue.empty():
                    self.queue.get_nowait()
                self.queue.put_nowait(None)
                return
