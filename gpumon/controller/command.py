"""``gpumon controller``: flags onto :class:`~gpumon.config.controller.ControllerConfig`, then run until
signalled."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gpumon.config import add_config_arguments, load_from_args
from gpumon.config.controller import DEFAULT_CONTROLLER_PORT, ControllerConfig
from gpumon.httpauth.flags import SERVER_FLAGS

if TYPE_CHECKING:
    import ssl

HELP = "run the controller: judge GPUs, quarantine bad ones and move their pods (dry-run by default)"

# (flag, dotted config key, metavar, help). Every other knob is in the YAML file or GPUMON_... .
_FLAGS: tuple[tuple[str, str, str, str], ...] = (
    ("--kubeconfig", "kubeconfig", "FILE", "kubeconfig to use (default: in-cluster, else ~/.kube/config)"),
    (
        "--namespace",
        "namespace",
        "NS",
        "namespace of the lease and state ConfigMap (default: $POD_NAMESPACE)",
    ),
    (
        "--identity",
        "identity",
        "ID",
        "this replica's lease identity (default: $POD_NAME, else the host name)",
    ),
    (
        "--listen-address",
        "listen_address",
        "ADDRESS",
        "address of /metrics, /healthz, /readyz (default: 0.0.0.0)",
    ),
    ("--port", "port", "PORT", f"port of /metrics (default: {DEFAULT_CONTROLLER_PORT}; 0 picks a free one)"),
    *SERVER_FLAGS,
    ("--signals", "signals.source", "SOURCE", "prometheus | direct (default: prometheus)"),
    ("--prometheus-url", "signals.prometheus.url", "URL", "Prometheus base URL"),
    ("--rules", "policy.rules_file", "FILE", "YAML file of rules (merged over the built-in rules)"),
    ("--node-selector", "node_selector", "SELECTOR", "label selector of the nodes to manage (default: all)"),
    ("--log-format", "log.format", "FORMAT", "text | json (default: text)"),
    ("--log-level", "log.level", "LEVEL", "debug | info | warning | error (default: info)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(
        parser, _FLAGS, config_help="YAML configuration file (flags > GPUMON_* environment > this file)"
    )
    acting = parser.add_mutually_exclusive_group()
    for flag, value, help_text in (
        ("--dry-run", "true", "only report decisions as Events and logs (the default)"),
        ("--act", "false", "carry decisions out: taint, condition, evict"),
    ):
        acting.add_argument(
            flag, dest="dry_run", action="store_const", const=value, default=argparse.SUPPRESS, help=help_text
        )


def load_config(args: argparse.Namespace) -> ControllerConfig:
    return load_from_args(ControllerConfig, args, _FLAGS, extra_keys=("dry_run",))


def run(args: argparse.Namespace) -> int:
    import asyncio

    from gpumon.httpauth.tls import server_context
    from gpumon.runtime import logs

    config = load_config(args)  # reads and validates the rules too: a bad rule stops it here
    ssl_context = server_context(config.tls)
    logs.configure(config.log.format, config.log.level)
    return asyncio.run(_serve(config, ssl_context))


async def _serve(config: ControllerConfig, ssl_context: ssl.SSLContext | None) -> int:
    import logging

    from gpumon.controller.app import make_app
    from gpumon.kube.client import connect
    from gpumon.runtime.serving import serve_until_signalled

    log = logging.getLogger(__name__)
    api = connect(config.kubeconfig)
    try:
        return await serve_until_signalled(
            lambda: make_app(config, api),
            config.listen_address,
            config.port,
            limits=config.server,
            ssl_context=ssl_context,
            on_listening=lambda url: log.info(
                "controller running", extra={"metrics": url, "dry_run": config.dry_run}
            ),
        )
    finally:
        await api.close()
