"""The controller's one retry policy: capped exponential backoff with deterministic jitter."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    initial_seconds: float = 1.0
    max_seconds: float = 60.0
    factor: float = 2.0
    # Spread retries by up to this fraction so many clients do not retry in step.
    jitter: float = 0.1

    def delay(self, attempt: int, salt: int = 0) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        base = min(self.max_seconds, self.initial_seconds * self.factor ** max(0, attempt - 1))
        # A cheap deterministic hash of (attempt, salt) in [0, 1): reproducible in tests.
        spread = ((attempt * 2654435761 + salt * 40503) % 1000) / 1000.0
        return min(self.max_seconds, base * (1.0 + self.jitter * spread))
