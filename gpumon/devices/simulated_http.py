"""``/api/v1/faults`` on an exporter of simulated GPUs: list, inject and clear faults at run time.

A demo and test feature of the simulator, not of the exporter: the exporter's server knows no
simulator, and the wiring that picks the simulated backend (``gpumon exporter --backend
simulated``, :func:`gpumon.exporter.command.build_backend`) adds these routes to its app. An
exporter reading real GPUs never has them. They sit behind the app's authentication like every
route but the probes; with authentication off, anyone who reaches the port can inject faults.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from gpumon.devices.simulated import FAULT_KINDS, SimulatedBackend, SimulationError, parse_fault

log = logging.getLogger(__name__)

FAULTS_PATH = "/api/v1/faults"


def fault_routes(backend: SimulatedBackend) -> list[web.RouteDef]:
    """``GET`` (status), ``POST`` (inject one fault) and ``DELETE`` (clear all) on :data:`FAULTS_PATH`."""

    async def list_faults(_request: web.Request) -> web.Response:
        return web.json_response(_fault_status(backend))

    async def inject(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": "the body must be a JSON object"}, status=400)
        try:
            spec = parse_fault(body)
            backend.inject(spec)
        except SimulationError as e:
            return web.json_response({"error": str(e)}, status=400)
        log.warning("fault injected", extra={"fault": spec.model_dump(mode="json")})
        return web.json_response({"injected": spec.model_dump(mode="json")})

    async def clear(_request: web.Request) -> web.Response:
        backend.clear_all()
        log.warning("all faults cleared")
        return web.json_response(_fault_status(backend))

    return [web.get(FAULTS_PATH, list_faults), web.post(FAULTS_PATH, inject), web.delete(FAULTS_PATH, clear)]


def _fault_status(backend: SimulatedBackend) -> dict[str, Any]:
    status = backend.status()
    return {
        "gpus": backend.gpu_count,
        "model": backend.spec.name,
        "kinds": list(FAULT_KINDS),
        "unavailable": status.unavailable,
        "active": {str(gpu): list(active) for gpu, active in status.active.items()},
        "injected": [{"at": f.at, **f.spec.model_dump(mode="json")} for f in status.injected],
    }
