"""An API that refuses gpumon (its RBAC not applied, say): counted every time, logged and told
once per outage, and asked again only with backoff. The repair ladder keeps one for the Jobs API
and one for the Machines and NodeClaims it replaces."""

from __future__ import annotations

import math

from gpumon.controller.core.backoff import Backoff

# Asked again after 5 s, then 10, 20 ... up to 5 minutes.
REFUSAL_BACKOFF = Backoff(initial_seconds=5.0, max_seconds=300.0)


class ApiAccess:
    def __init__(self, backoff: Backoff = REFUSAL_BACKOFF) -> None:
        self._backoff = backoff
        self.failures = 0
        self._retry_at = -math.inf

    def allowed(self, now: float) -> bool:
        return now >= self._retry_at

    def failed(self, now: float) -> bool:
        """Back off; True for the outage's first failure."""
        self.failures += 1
        self._retry_at = now + self._backoff.delay(self.failures)
        return self.failures == 1

    def succeeded(self) -> bool:
        """True when this ends an outage."""
        ended, self.failures, self._retry_at = self.failures > 0, 0, -math.inf
        return ended
