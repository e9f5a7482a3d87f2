"""``gpumon status`` and ``gpumon status node NAME``: read the cluster, show it, and with
``--watch`` again every ``--interval`` seconds until interrupted."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiohttp
    from rich.console import RenderableType
    from rich.live import Live

    from gpumon.config.controller import ControllerConfig, DirectSignalsConfig
    from gpumon.controller.core.policy import Policy
    from gpumon.kube.client import KubeApi
    from gpumon.status.allocation import AllocationView
    from gpumon.status.model import Explanation, FleetStatus
    from gpumon.status.read import Sources

    View = FleetStatus | Explanation | AllocationView

HELP = (
    "show the fleet's GPU health and what the controller did; `status node NAME` explains one node; "
    "`status allocation` shows what each GPU card is given and to whom"
)

DEFAULT_INTERVAL_SECONDS = 5.0


class TargetsFileError(Exception):
    """The controller's config names a targets file that cannot be read or is refused."""


class Failed(Exception):
    """A round that has nothing to show; the message is for people."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        nargs="*",
        metavar="node NAME | allocation",
        help="explain one node, or show the GPU allocation, instead of the fleet",
    )
    parser.add_argument(
        "--node",
        dest="allocation_node",
        metavar="NAME",
        help="with `allocation`: only this node",
    )
    parser.add_argument(
        "--no-usage",
        dest="usage",
        action="store_false",
        help="with `allocation`: do not ask the exporters what the pods use",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="the controller's YAML configuration (its namespace, rules, pool label, exporters)",
    )
    parser.add_argument(
        "--kubeconfig", dest="kubeconfig", metavar="FILE", default=argparse.SUPPRESS, help="kubeconfig to use"
    )
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (default: its current one)")
    parser.add_argument(
        "--namespace",
        dest="namespace",
        metavar="NS",
        default=argparse.SUPPRESS,
        help="the controller's namespace (default: gpumon-system)",
    )
    parser.add_argument(
        "--selector",
        dest="node_selector",
        metavar="SELECTOR",
        default=argparse.SUPPRESS,
        help="label selector of the nodes to show (default: the controller's node_selector)",
    )
    parser.add_argument(
        "--controller-url",
        metavar="URL",
        help="the controller's base URL for /metrics (default: its Service, through the API server)",
    )
    parser.add_argument(
        "--controller-service",
        default="gpumon-controller",
        metavar="NAME",
        help="the controller's Service, in its namespace (default: gpumon-controller)",
    )
    parser.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    parser.add_argument("--watch", action="store_true", help="show again every --interval until Ctrl-C")
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_SECONDS,
        metavar="SECONDS",
        help=f"seconds between rounds with --watch (default: {DEFAULT_INTERVAL_SECONDS:g})",
    )


ALLOCATION = "allocation"


def node_argument(target: list[str]) -> str | None:
    """None for the fleet, a node's name for ``node NAME``, :data:`ALLOCATION` for the view."""
    if not target:
        return None
    if len(target) == 2 and target[0] == "node":
        return target[1]
    if target == [ALLOCATION]:
        return ALLOCATION
    raise Failed(f"expected nothing, `node NAME` or `allocation`, got {' '.join(target)!r}")


def load_config(args: argparse.Namespace) -> ControllerConfig:
    from gpumon.config import load
    from gpumon.config.controller import ControllerConfig

    given = vars(args)
    flags: dict[str, Any] = {k: given[k] for k in ("kubeconfig", "namespace", "node_selector") if k in given}
    return load(ControllerConfig, flags=flags, config_file=given.get("config"))


def sources(config: ControllerConfig, args: argparse.Namespace) -> Sources:
    from gpumon.controller.configure import pool_from_config
    from gpumon.controller.core.objects import GpuResources
    from gpumon.status.read import Sources

    d = config.signals.direct
    return Sources(
        namespace=config.namespace,
        state_configmap=config.state_configmap,
        resources=GpuResources(
            frozenset(config.drain.gpu_resource_names), tuple(config.drain.gpu_resource_prefixes)
        ),
        node_selector=config.node_selector,
        controller_service=args.controller_service,
        controller_url=args.controller_url,
        exporter_namespace=d.namespace,
        exporter_selector=d.label_selector,
        exporter_port=d.port,
        exporter_scheme=d.scheme,
        exporter_endpoints=exporter_endpoints(d),
        pools=tuple(pool_from_config(p) for p in config.pools),
    )


def exporter_endpoints(d: DirectSignalsConfig) -> dict[str, str]:
    """The exporters the controller's config lists, in its map or its targets file (read once:
    a status round is short); none listed means they are found as pods."""
    from gpumon.wire import file_sd

    if d.targets_file is None:
        return dict(d.endpoints)
    try:
        return file_sd.read_exporter_urls(
            d.targets_file.read_bytes(),
            filename=d.targets_file.name,
            node_label=d.targets_node_label,
            scheme=d.scheme,
        )
    except OSError as e:
        raise TargetsFileError(f"signals.direct.targets_file {d.targets_file}: {e.strerror}") from None
    except file_sd.FileSdError as e:
        raise TargetsFileError(f"signals.direct.targets_file {d.targets_file}: {e}") from None


async def rounds(
    build: Callable[[], Awaitable[View]],
    show: Callable[[View | Failed], None],
    *,
    watch: bool,
    interval_seconds: float,
    sleep: Callable[[float], Awaitable[None]],
    stopped: Callable[[], bool] = lambda: False,
) -> int:
    """One round, or with ``watch`` one every interval until ``stopped()``; a failed round is
    shown and, when watching, tried again. Returns the exit code of the last round, or 130 (as
    for Ctrl-C) when a watch was stopped."""
    while True:
        try:
            view: View | Failed = await build()
        except Failed as e:
            view = e
        show(view)
        if not watch:
            return 1 if isinstance(view, Failed) else 0
        await sleep(interval_seconds)
        if stopped():
            return 130


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import sys

    from gpumon.config import ConfigError
    from gpumon.controller.configure import build_policy

    try:
        node = node_argument(args.target)
    except Failed as e:
        print(f"gpumon status: {e}", file=sys.stderr)
        return 2
    if args.allocation_node is not None and node != ALLOCATION:
        print(
            "gpumon status: --node goes with `allocation` (one node's health: `status node NAME`)",
            file=sys.stderr,
        )
        return 2
    config = load_config(args)
    if not 0.1 <= args.interval <= 3600:
        raise ConfigError(
            f"invalid configuration:\n  --interval: must be >= 0.1 and <= 3600 (got {args.interval:g})"
        )
    # Client libraries log what status shows anyway (an unreachable API, a missing kubeconfig).
    logging.disable(logging.WARNING)
    policy = build_policy(config)  # the rules' recoverAfter say what lifts a quarantine
    return asyncio.run(_main(args, config, node, policy))


async def _main(args: argparse.Namespace, config: ControllerConfig, node: str | None, policy: Policy) -> int:
    import asyncio
    import contextlib

    import aiohttp

    from gpumon.config import ConfigError
    from gpumon.kube.client import connect
    from gpumon.runtime.serving import stop_on_signals
    from gpumon.status.explain import build_explanation
    from gpumon.status.fleet import build_fleet
    from gpumon.status.read import read_cluster

    try:
        api = connect(config.kubeconfig, args.context)
    except ConfigError as e:
        return _fail(f"no Kubernetes credentials: {e.brief}")
    try:
        src = sources(config, args)
    except TargetsFileError as e:
        return _fail(str(e))
    show = Shower(args.output, args.watch)
    try:
        async with aiohttp.ClientSession() as session:

            async def build() -> View:
                if node == ALLOCATION:
                    return await allocation(api, src, args, session)
                with read_failures(node):
                    state = await read_cluster(api, src, node=node, session=session)
                if node is None:
                    return build_fleet(state, pool_label=policy.pool_label)
                return build_explanation(state, pool_label=policy.pool_label, policy=policy)

            with stop_on_signals() as stop:

                async def until_stopped(seconds: float) -> None:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(seconds):
                            await stop.wait()

                return await rounds(
                    build,
                    show,
                    watch=args.watch,
                    interval_seconds=args.interval,
                    sleep=until_stopped,
                    stopped=stop.is_set,
                )
    finally:
        show.close()
        await api.close()


@contextlib.contextmanager
def read_failures(node: str | None) -> Iterator[None]:
    """A round's reads failing as people are told: the API server unreachable or refusing, or
    an unknown node."""
    from gpumon.kube.client import KubeError, Unreachable
    from gpumon.status.read import NodeNotFound

    try:
        yield
    except Unreachable as e:
        raise Failed(f"cannot reach the API server: {e.message}") from None
    except NodeNotFound:
        raise Failed(f"no node named {node!r}") from None
    except KubeError as e:
        raise Failed(f"the API server refused: {e}") from None


async def allocation(
    api: KubeApi, src: Sources, args: argparse.Namespace, session: aiohttp.ClientSession
) -> AllocationView:
    import time

    from gpumon.controller.core.objects import to_rfc3339
    from gpumon.status.allocation import build_allocation
    from gpumon.status.read import read_allocation

    with read_failures(args.allocation_node):
        reads = await read_allocation(api, src, node=args.allocation_node, session=session, usage=args.usage)
    if args.allocation_node is not None and not reads.nodes:
        raise Failed(f"node {args.allocation_node!r} has no GPUs")
    return build_allocation(to_rfc3339(time.time()), reads.nodes, reads.pods, reads.snapshots, reads.problems)


def _fail(message: str) -> int:
    import sys

    print(f"gpumon status: {message}", file=sys.stderr)
    return 1


class Shower:
    """How each round is shown: a table (redrawn in place when watching), or one JSON or YAML
    document per round. A failed round goes to stderr, or into the redrawn table."""

    def __init__(self, output: str, watch: bool) -> None:
        from rich.console import Console

        self._output = output
        self._watch = watch
        self._console = Console()
        self._live: Live | None = None

    def __call__(self, view: View | Failed) -> None:
        import sys

        from rich.text import Text

        from gpumon.status import render
        from gpumon.status.allocation import AllocationView
        from gpumon.status.model import Explanation

        if isinstance(view, Failed) and (self._output != "table" or not self._watch):
            print(f"gpumon status: {view}", file=sys.stderr, flush=True)
            return
        if isinstance(view, Failed):
            self._draw(Text(f"gpumon status: {view}", style="bold red"))
        elif self._output != "table":
            print(render.dumps(view, self._output, stream=self._watch), end="", flush=True)
        elif isinstance(view, Explanation):
            self._draw(render.explanation(view))
        elif isinstance(view, AllocationView):
            self._draw(render.allocation(view))
        else:
            self._draw(render.fleet(view))

    def _draw(self, drawn: RenderableType) -> None:
        from rich.live import Live

        if not self._watch:
            self._console.print(drawn)
            return
        if self._live is None:
            self._live = Live(drawn, console=self._console, auto_refresh=False)
            self._live.start()
        self._live.update(drawn, refresh=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
