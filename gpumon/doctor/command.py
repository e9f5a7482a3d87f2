"""``gpumon doctor``: every check family against this node, within a deadline per check.

It takes the exporter's own flags, environment and configuration file, so it looks where the
exporter looks (NVML library, pod-resources socket, host /proc, port, credentials).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpumon.config import ExporterConfig
    from gpumon.doctor.result import CheckResult
    from gpumon.doctor.runner import ProbeOutcome

HELP = "check why GPU monitoring does not work on this node (devices, NVML, kubelet, /proc, API, exporter)"

DEFAULT_TIMEOUT_SECONDS = 10.0
# Families in the order they are shown: from the hardware up to the exporter.
ORDER = ("devices", "nvml", "proc", "pod-resources", "kube-api", "exporter")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gpumon.exporter.command import add_arguments as exporter_arguments

    exporter_arguments(parser)
    parser.add_argument(
        "--output", choices=("table", "json"), default="table", help="table for people, json for machines"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help=f"deadline of each check; one that hangs past it fails (default: {DEFAULT_TIMEOUT_SECONDS:g})",
    )
    parser.add_argument(
        "--dev-root",
        type=Path,
        default=Path("/dev"),
        metavar="DIR",
        help="where the NVIDIA device files are (default: /dev)",
    )


def diagnose(
    config: ExporterConfig, *, timeout_seconds: float, dev_root: Path, platform: str
) -> tuple[tuple[CheckResult, ...], bool]:
    """Every check's results in display order, and whether a check is still hung."""
    import os

    from gpumon.doctor import devices, endpoint, kubeapi, nvml, podresources, proc
    from gpumon.doctor.runner import Probe, run
    from gpumon.exporter.attribution import watched_resource

    pods = config.pods
    uses_nvml = config.backend == "nvml"
    first: list[Probe[Any]] = []
    if uses_nvml:
        first.append(
            Probe(
                devices.FAMILY,
                "device files",
                lambda: devices.gather(dev_root, platform),
                devices.judge,
                devices.MAP_DEVICES_FIX,
            )
        )
    first += [
        Probe(
            nvml.FAMILY,
            "NVML",
            lambda: nvml.gather(config.nvml_library, used=uses_nvml),
            nvml.judge,
            "an NVML call hangs: the driver is wedged; read dmesg and drain the node",
        ),
        Probe(
            podresources.FAMILY,
            podresources.NAME,
            # The client's own deadline ends first, so a silent kubelet is reported by name.
            lambda: podresources.gather(
                pods.pod_resources_socket, timeout_seconds=0.8 * timeout_seconds, used=pods.enabled
            ),
            lambda facts: podresources.judge(facts, watched_resource(pods)),
            "the kubelet never answers on its pod-resources socket: check the kubelet on the node",
        ),
        Probe(
            kubeapi.FAMILY,
            "Kubernetes API",
            lambda: kubeapi.gather(
                config.node_name,
                node_from_env="NODE_NAME" in os.environ or "node_name" in config.model_fields_set,
                timeout_seconds=0.8 * timeout_seconds,
                used=pods.enabled and pods.api,
            ),
            kubeapi.judge,
            "the API server never answers: check network policies and the API server's health",
        ),
        Probe(
            endpoint.FAMILY,
            endpoint.NAME,
            lambda: endpoint.gather(config, timeout_seconds=0.8 * timeout_seconds),
            lambda facts: endpoint.judge(facts, config.sampling.fast_interval_seconds),
            "the exporter accepts connections but never answers: its event loop is blocked; restart it",
        ),
    ]
    outcomes = run(first, timeout_seconds=timeout_seconds)
    gpu_pids = _gpu_pids(outcomes)
    outcomes += run(
        [
            Probe(
                proc.FAMILY,
                "host /proc",
                lambda: proc.gather(pods.host_proc, gpu_pids),
                proc.judge,
                "reading the host's /proc hangs (a stuck process or NFS mount?)",
            )
        ],
        timeout_seconds=timeout_seconds,
    )
    ordered = sorted(outcomes, key=lambda o: ORDER.index(o.family))
    results = tuple(r for o in ordered for r in o.results)
    return results, any(o.timed_out for o in outcomes)


def _gpu_pids(outcomes: tuple[ProbeOutcome, ...]) -> tuple[int, ...] | None:
    """The GPU processes NVML lists, when it answered; the /proc checks start from them."""
    from gpumon.doctor.nvml import NvmlFacts

    for o in outcomes:
        if isinstance(o.facts, NvmlFacts) and o.facts.used and o.facts.error is None:
            return o.facts.pids
    return None


def run(args: argparse.Namespace) -> int:
    import logging
    import os
    import sys

    from rich.console import Console

    from gpumon.config import ConfigError
    from gpumon.doctor import render
    from gpumon.doctor.result import exit_code
    from gpumon.exporter.command import load_config

    config = load_config(args)
    if not 0 < args.timeout <= 600:
        raise ConfigError(
            f"invalid configuration:\n  --timeout: must be > 0 and <= 600 (got {args.timeout:g})"
        )
    # The clients doctor reuses log their failures; doctor reports them as checks instead.
    logging.disable(logging.ERROR)
    results, hung = diagnose(
        config, timeout_seconds=args.timeout, dev_root=args.dev_root, platform=sys.platform
    )
    if args.output == "json":
        print(render.dumps(results))
    else:
        render.print_table(results, Console())
    code = exit_code(results)
    if hung:
        # A check still blocked in a native call (NVML, gRPC) may keep the interpreter from exiting.
        sys.stdout.flush()
        os._exit(code)
    return code
