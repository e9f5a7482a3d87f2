"""``python -m bench fleet-65k``: the controller's cost at 65,000 and 100,000 nodes on a 2-core
machine that cannot hold such a fleet's API side (issue #29, section 2).

- The pure parts in-process on a generated fleet (:mod:`bench.fleet_pure`), at ``--pure-sizes``.
- The signal side (:mod:`bench.fleet_prometheus`): a real Prometheus TSDB holding the fleet's
  series, built with promtool, and the checkout's Prometheus source's query round against it
  in a process of its own, beside main's fleet-wide query set (the named baseline), at
  ``--prometheus-sizes``. Sizes not run there are derived by a least-squares line over the
  sizes that were, and labelled so.

Figures go to bench/fleet-65k.json (a run replaces the sizes it ran and keeps the others), then
to their own section of bench/RESULTS.md; ``--render`` rewrites the section from the JSON alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.fleet_model import Fleet, marks
from bench.fleet_report import section
from bench.report import splice

RESULTS = Path(__file__).with_name("RESULTS.md")
FIGURES = Path(__file__).with_name("fleet-65k.json")


def _sizes(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s]


def _merge(old: list[dict[str, Any]], new: dict[str, Any], key: str) -> list[dict[str, Any]]:
    kept = [e for e in old if e[key]["nodes"] != new[key]["nodes"]]
    return sorted([*kept, new], key=lambda e: e[key]["nodes"])


def _log(message: str) -> None:
    print(f"fleet-65k: {message}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench fleet-65k", description=__doc__)
    parser.add_argument("--pure-sizes", type=_sizes, default=[10_000, 65_000, 100_000])
    parser.add_argument("--prometheus-sizes", type=_sizes, default=[2_000, 10_000, 65_000])
    parser.add_argument("--part-nodes", type=int, default=5_000, help="nodes per promtool input")
    parser.add_argument("--workdir", type=Path, help="for the TSDB (default: a temporary directory)")
    parser.add_argument("--render", action="store_true", help="only rewrite the section from the JSON")
    parser.add_argument("--quick", action="store_true", help="2,000 nodes each side; print, write nothing")
    args = parser.parse_args(argv)
    doc: dict[str, Any] = {"pure": [], "signal": [], "runs": []}
    if FIGURES.exists() and not args.quick:
        doc = json.loads(FIGURES.read_text())
    if not args.render:
        pure_sizes, prom_sizes = (
            ([2_000], [2_000]) if args.quick else (args.pure_sizes, args.prometheus_sizes)
        )
        for n in pure_sizes:
            from bench.fleet_pure import pure_side

            _log(f"pure parts at {n:,} nodes")
            doc["pure"] = _merge(doc["pure"], {"pure": dataclasses.asdict(pure_side(Fleet(n)))}, "pure")
            _save(doc, args.quick)
        for n in prom_sizes:
            _log(f"signal side at {n:,} nodes")
            entry = {"signal": _signal(Fleet(n), args.part_nodes, args.workdir), "machine": _machine()}
            doc["signal"] = _merge(doc["signal"], entry, "signal")
            _save(doc, args.quick)
        doc["runs"] = [*doc["runs"], _machine()][-10:]
        _save(doc, args.quick)
    text = section(doc)
    if args.quick:
        print(text)
    else:
        RESULTS.write_text(splice(RESULTS.read_text(), text))
        _log(f"wrote the fleet-65k section of {RESULTS}")
    return 0


def _signal(fleet: Fleet, part_nodes: int, workdir: Path | None) -> dict[str, Any]:
    from bench.fleet_prometheus import signal_side

    base = workdir or Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"gpumon-fleet-{fleet.nodes}-", dir=base))
    try:
        # The data are minutes old when queried: the source's clock is set to this time.
        at = float(int(time.time()))
        figures = dataclasses.asdict(signal_side(fleet, marks(fleet), at, work, part_nodes))
        figures["nodes"] = fleet.nodes
        return figures
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _machine() -> dict[str, Any]:
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "memory_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
        "load": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def _save(doc: dict[str, Any], quick: bool) -> None:
    if not quick:
        FIGURES.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
