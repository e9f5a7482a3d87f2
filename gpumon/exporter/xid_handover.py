"""When the Xid thread hands its events to the event loop: at once after a quiet spell, then at
most once per interval while they keep coming.

Each hand-over wakes the loop and takes the GIL from whoever holds it: in a storm, a hand-over
per NVML wait (or per simulator poll, 100 a second) kept scrapes waiting for the interpreter
although each cost a fraction of a millisecond (bench/RESULTS.md, "Xid storm"). Holding a storm's
events for up to one interval costs nothing a reader sees: during a storm the sampler renders
them at its next tick anyway.

Pure: events and ``now`` in, the new state and what to hand over out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpumon.gpu.model import XidEvent

# At most this often while a storm lasts; well under the fast tick, which renders them.
HANDOVER_INTERVAL_SECONDS = 0.1


@dataclass(frozen=True, slots=True)
class Handover:
    held: tuple[XidEvent, ...] = ()
    last_at: float = float("-inf")

    def add(
        self, events: Sequence[XidEvent], now: float, interval: float = HANDOVER_INTERVAL_SECONDS
    ) -> tuple[Handover, tuple[XidEvent, ...]]:
        """The state after ``events`` arrive at ``now``, and the events to hand over now."""
        held = self.held + tuple(events)
        if held and now - self.last_at >= interval:
            return Handover((), now), held
        return Handover(held, self.last_at), ()

    def wait_seconds(self, now: float, idle: float, interval: float = HANDOVER_INTERVAL_SECONDS) -> float:
        """How long the thread may block for more events: ``idle`` with nothing held, else until
        the held events are due."""
        return idle if not self.held else max(0.0, min(idle, self.last_at + interval - now))
