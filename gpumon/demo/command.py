"""``gpumon demo``: the whole loop on a local cluster, live in the terminal (docs/demo.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from gpumon.demo.orchestrate import Report
    from gpumon.demo.render import HeaderStatus
    from gpumon.demo.views import ClusterView

HELP = "play a scenario on a local cluster: simulated GPU nodes, exporters, Prometheus, the controller"
DEFAULT_STATE_DIR = Path("~/.gpumon/demo")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario",
        type=Path,
        metavar="FILE",
        help="scenario YAML (default: the embedded one, see docs/demo.md)",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        metavar="N",
        help="whole-GPU nodes the pool starts with (default: the scenario's, 3)",
    )
    parser.add_argument(
        "--no-tui",
        dest="tui",
        action="store_false",
        help="plain log lines instead of the live table (for CI and logs)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="after the scenario, leave everything running until Ctrl-C"
    )
    parser.add_argument(
        "--step-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long a step may take to reach its state (default: 120)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        metavar="DIR",
        help=f"where the demo keeps its kubeconfig, logs and report.json (default: {DEFAULT_STATE_DIR})",
    )


class LogDisplay:
    """Plain lines on stdout, each stamped with seconds since the start."""

    def __init__(self, console: Console, clock_start: float) -> None:
        self._console = console
        self._start = clock_start
        self._title = ""
        self._last: ClusterView | None = None

    def _line(self, text: str) -> None:
        import time

        self._console.print(
            f"[{time.monotonic() - self._start:6.1f}s] {text}", markup=False, highlight=False, soft_wrap=True
        )

    def status(self, status: HeaderStatus) -> None:
        if status.title != self._title:
            self._title = status.title
            self._line(status.title)

    def view(self, view: ClusterView) -> None:
        from gpumon.demo.render import changes

        for line in changes(self._last, view):
            self._line("  " + line)
        self._last = view

    def say(self, line: str) -> None:
        self._line(line)


class LiveDisplay:
    """A rich Live screen redrawn twice a second from the latest view and status."""

    def __init__(self, console: Console) -> None:
        from rich.live import Live

        from gpumon.demo.render import HeaderStatus

        self._live = Live(console=console, refresh_per_second=2, screen=False, transient=False)
        self._status = HeaderStatus("starting")
        self._view: ClusterView | None = None
        self._milestones: list[str] = []

    def __enter__(self) -> LiveDisplay:
        self._live.__enter__()
        self._redraw()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__(None, None, None)

    def _redraw(self) -> None:
        from gpumon.demo.render import table

        self._live.update(table(self._view, self._status, self._milestones[-8:]))

    def status(self, status: HeaderStatus) -> None:
        self._status = status
        self._redraw()

    def view(self, view: ClusterView) -> None:
        self._view = view
        self._redraw()

    def say(self, line: str) -> None:
        self._milestones.append(line)
        self._redraw()


def _print_report(console: Console, report: Report, report_path: Path) -> None:
    from rich.table import Table

    t = Table(title="gpumon demo: measured")
    t.add_column("phase")
    t.add_column("result")
    t.add_column("seconds", justify="right")
    t.add_row(
        "start until ready",
        "ok" if report.ready_seconds is not None else "FAILED",
        f"{report.ready_seconds:.1f}" if report.ready_seconds is not None else "-",
    )
    for s in report.steps:
        t.add_row(f"{s.name} ({s.expect})", "ok" if s.met else "FAILED", f"{s.seconds:.1f}")
    t.add_row("total (including stop)", "ok" if report.ok else "FAILED", f"{report.total_seconds:.1f}")
    console.print(t)
    if report.error:
        console.print(f"gpumon demo: {report.error}", markup=False, highlight=False)
    failed = next((s for s in report.steps if not s.met), None)
    if failed is not None:
        console.print(f"step {failed.name}: {failed.detail}", markup=False, highlight=False)
    console.print(f"report: {report_path}", markup=False, highlight=False)


def run(args: argparse.Namespace) -> int:
    import logging
    import time

    from rich.console import Console

    from gpumon.config import ConfigError
    from gpumon.demo import orchestrate, scenario
    from gpumon.runtime.logs import TextFormatter

    plan = scenario.load(args.scenario)
    if args.nodes is not None:
        if not 1 <= args.nodes <= 20:
            raise ConfigError(f"invalid configuration:\n  --nodes: must be 1..20 (got {args.nodes})")
        plan = plan.with_pool_nodes(args.nodes)
    if args.step_timeout <= 0:
        raise ConfigError(f"invalid configuration:\n  --step-timeout: must be > 0 (got {args.step_timeout})")
    paths = orchestrate.Paths(args.state_dir.expanduser().resolve())
    try:
        orchestrate.claim(paths)
    except orchestrate.DemoError as e:
        print(f"gpumon demo: {e}")
        return 1
    # Our own log and the harness's go to a file: the terminal belongs to the display.
    handler = logging.FileHandler(paths.log)
    handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    for noisy in ("aiohttp.access", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    console = Console()
    options = orchestrate.RunOptions(plan, paths, step_timeout_seconds=args.step_timeout, keep=args.keep)
    try:
        if args.tui and console.is_terminal:
            with LiveDisplay(console) as live:
                report = orchestrate.run(options, live)
        else:
            report = orchestrate.run(options, LogDisplay(console, time.monotonic()))
    except KeyboardInterrupt:
        console.print("gpumon demo: stopped; everything it started is down")
        return 130
    _print_report(console, report, paths.report)
    return 0 if report.ok else 1
