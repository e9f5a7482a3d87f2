"""The gpumon exporter as the bench runs it: ``gpumon exporter``'s own flags, configuration,
backend, app and sampler, with the bench's pods (:mod:`bench.pods`) as the pod attributor.

    python -m bench.exporter_server --backend simulated --port 9842 --bench-pods 64

Only the attributor differs from ``gpumon exporter``, whose real one needs a kubelet, a host
/proc and the API server. The app is served by aiohttp's ``run_app`` with the access log off,
as the command serves it through ``AppRunner``.
"""

from __future__ import annotations

import argparse
import sys

from aiohttp import web
from prometheus_client import CollectorRegistry

from bench.pods import BenchPods
from gpumon.config import ConfigError
from gpumon.exporter import command
from gpumon.exporter.sampler import SelfMetrics
from gpumon.exporter.server import make_app
from gpumon.runtime import logs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.exporter_server", description=__doc__)
    command.add_arguments(parser)
    parser.add_argument("--bench-pods", type=int, default=64, help="pods on the node (default: 64)")
    parser.add_argument("--bench-churn", type=int, default=0, help="pods replaced per fast tick (default: 0)")
    args = parser.parse_args(argv)
    try:
        config = command.load_config(args)
        metrics = SelfMetrics(CollectorRegistry(auto_describe=True), backend=config.backend)
        backend, routes = command.build_backend(config, metrics)
        pods = BenchPods(args.bench_pods, args.bench_churn)
    except (ConfigError, ValueError) as e:
        print(f"bench exporter: {e}", file=sys.stderr)
        return 2
    app = make_app(config, backend, metrics=metrics, attributor=pods, routes=routes)
    logs.configure(config.log.format, config.log.level)
    web.run_app(
        app,
        host=config.listen_address,
        port=config.port,
        access_log=None,
        print=None,
        shutdown_timeout=5,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
