"""The ``gpumon`` command: one sub-command per program, each defined in its own package.

A command module exposes ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``
and imports its heavy dependencies inside ``run``, so ``gpumon --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gpumon.config import ConfigError
from gpumon.runtime import build

COMMANDS: dict[str, str] = {
    "exporter": "gpumon.exporter.command",
    "controller": "gpumon.controller.command",
    "simulate": "gpumon.exporter.simulate_command",
    "devcluster": "gpumon.devcluster.command",
    "doctor": "gpumon.doctor.command",
    "status": "gpumon.status.command",
    "demo": "gpumon.demo.command",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser, or only the one named: a command module imports what its flags
    need (the exporter's, its configuration), and a process keeps every module it imported, so
    the exporter on each GPU node would otherwise carry the demo's, the test cluster's and the
    controller's imports in its memory (bench/RESULTS.md, "Exporter footprint")."""
    parser = argparse.ArgumentParser(
        prog="gpumon",
        description="GPU fleet monitor and remediation controller for Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=build.current().describe())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, path in COMMANDS.items():
        if only is not None and name != only:
            continue
        mod = importlib.import_module(path)
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    v = sub.add_parser("version", help="print the version and exit")
    v.set_defaults(_run=lambda _args: print(build.current().describe()) or 0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    only = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(only).parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except ConfigError as e:
        print(f"gpumon {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
