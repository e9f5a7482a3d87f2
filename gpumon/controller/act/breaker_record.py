"""Records an open circuit breaker on the controller's state ConfigMap.

The breaker stays open until a person removes the annotation, so the record is the breaker:
a restarted or new leader reads it back through its informer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumon.controller.act.state_record import annotate_state
from gpumon.controller.core.contract.breakers import BreakerTrip, breaker_to_annotation
from gpumon.kube.client import KubeApi


async def record_breaker(api: KubeApi, namespace: str, name: str, trip: BreakerTrip) -> Mapping[str, Any]:
    """Annotate the ConfigMap (creating it when missing); returns the object as written."""
    key, value = breaker_to_annotation(trip)
    return await annotate_state(api, namespace, name, {key: value})
