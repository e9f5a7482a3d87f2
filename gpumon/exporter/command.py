"""``gpumon exporter``: flags onto :class:`~gpumon.config.ExporterConfig`, then serve until signalled."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gpumon.config import (
    DEFAULT_EXPORTER_PORT,
    ConfigError,
    ExporterConfig,
    add_config_arguments,
    load_from_args,
)
from gpumon.httpauth.flags import SERVER_FLAGS

if TYPE_CHECKING:
    import ssl

    from aiohttp import web

    from gpumon.devices.backend import DeviceBackend
    from gpumon.exporter.self_metrics import SelfMetrics

HELP = "run the per-node GPU exporter (NVML or simulated GPUs) and serve Prometheus metrics"

# (flag, dotted config key, metavar, help). Flags are only the commonly used knobs; every knob is
# settable in the YAML file and through GPUMON_... environment variables.
_FLAGS: tuple[tuple[str, str, str, str], ...] = (
    (
        "--node-name",
        "node_name",
        "NAME",
        "node name in every series (default: $NODE_NAME, else the host name)",
    ),
    ("--listen-address", "listen_address", "ADDRESS", "address to bind (default: 0.0.0.0)"),
    ("--port", "port", "PORT", f"port to serve on (default: {DEFAULT_EXPORTER_PORT}; 0 picks a free one)"),
    ("--metrics-profile", "metrics_profile", "PROFILE", "native | dcgm | both (default: native)"),
    ("--backend", "backend", "BACKEND", "nvml | simulated (default: nvml)"),
    ("--nvml-library", "nvml_library", "PATH", "path of libnvidia-ml.so (default: the loader's search)"),
    ("--simulate-gpus", "simulation.gpus", "N", "number of simulated GPUs (default: 8)"),
    (
        "--simulate-model",
        "simulation.model",
        "MODEL",
        "simulated GPU model: A100-SXM4-80GB, H100-80GB-HBM3, T4, L40S",
    ),
    ("--simulate-seed", "simulation.seed", "SEED", "seed of the simulated load (default: 0)"),
    ("--scenario", "simulation.scenario", "FILE", "YAML file of timed faults for the simulated GPUs"),
    (
        "--fast-interval",
        "sampling.fast_interval_seconds",
        "SECONDS",
        "seconds between fast samples (default: 1)",
    ),
    (
        "--slow-interval",
        "sampling.slow_interval_seconds",
        "SECONDS",
        "seconds between slow samples (default: 10)",
    ),
    (
        "--call-timeout",
        "sampling.call_timeout_seconds",
        "SECONDS",
        "timeout of one device call, seconds (default: 2)",
    ),
    ("--host-proc", "pods.host_proc", "PATH", "the host's /proc, for per-pod attribution (default: /proc)"),
    *SERVER_FLAGS,
    (
        "--bearer-token-file",
        "auth.bearer_token_file",
        "FILE",
        "require this bearer token (re-read every 30 s)",
    ),
    ("--log-format", "log.format", "FORMAT", "text | json (default: text)"),
    ("--log-level", "log.level", "LEVEL", "debug | info | warning | error (default: info)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(
        parser, _FLAGS, config_help="YAML configuration file (flags > GPUMON_* environment > this file)"
    )


def load_config(args: argparse.Namespace) -> ExporterConfig:
    """The configuration from the flags the user actually passed, the environment and the file."""
    return load_from_args(ExporterConfig, args, _FLAGS)


def build_backend(config: ExporterConfig, metrics: SelfMetrics) -> tuple[DeviceBackend, list[web.RouteDef]]:
    """The configured device backend and the routes it adds to the exporter's app: the
    simulator's fault injection (``/api/v1/faults``) on simulated GPUs, none on NVML."""
    if config.backend == "nvml":
        # Imported here: nvidia-ml-py is only needed on GPU nodes.
        from gpumon.devices.nvml import NvmlBackend

        return NvmlBackend(config.nvml_library, errors=metrics.record_error), []
    from gpumon.devices.simulated import SimulatedBackend, SimulationError, load_scenario, model_spec
    from gpumon.devices.simulated_http import fault_routes

    sim = config.simulation
    try:
        model_spec(sim.model)
    except SimulationError as e:
        raise ConfigError(f"invalid configuration:\n  simulation.model: {e}") from None
    scenario = load_scenario(sim.scenario) if sim.scenario is not None else None
    try:
        backend = SimulatedBackend(sim.gpus, sim.model, seed=sim.seed, scenario=scenario)
    except SimulationError as e:
        raise ConfigError(f"invalid configuration:\n  simulation.scenario: {e}") from None
    return backend, fault_routes(backend)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import os

    from prometheus_client import CollectorRegistry

    from gpumon.exporter.self_metrics import SelfMetrics
    from gpumon.exporter.server import STATE, make_app
    from gpumon.httpauth.tls import server_context
    from gpumon.runtime import logs

    config = load_config(args)
    metrics = SelfMetrics(CollectorRegistry(auto_describe=True), backend=config.backend)
    attributor = None
    if config.pods.enabled:
        from gpumon.exporter.attribution import build_attribution

        timeout = config.sampling.call_timeout_seconds
        attributor = build_attribution(config.pods, config.node_name, call_timeout_seconds=timeout)
        metrics.registry.register(attributor.metrics)
    backend, routes = build_backend(config, metrics)
    app = make_app(config, backend, metrics=metrics, attributor=attributor, routes=routes)
    if attributor is not None:
        app.cleanup_ctx.insert(0, attributor.lifespan)  # stops after the sampler that calls it
    ssl_context = server_context(config.tls)
    # Only now: every configuration error above is reported before anything is logged.
    logs.configure(config.log.format, config.log.level)
    code = asyncio.run(_serve(app, config, ssl_context))
    hung = app[STATE].sampler.hung_calls
    if hung:
        # A device call that never returns holds a thread the interpreter would wait for at exit.
        logging.getLogger(__name__).warning("exiting with %d device call(s) still hung", hung)
        logging.shutdown()
        os._exit(0)
    return code


async def _serve(app: web.Application, config: ExporterConfig, ssl_context: ssl.SSLContext | None) -> int:
    import logging

    from gpumon.runtime.serving import serve_until_signalled

    log = logging.getLogger(__name__)
    return await serve_until_signalled(
        lambda: app,
        config.listen_address,
        config.port,
        limits=config.server,
        ssl_context=ssl_context,
        on_listening=lambda url: log.info("serving metrics at %s", url),
    )
