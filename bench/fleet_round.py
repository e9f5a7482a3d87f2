"""The controller's Prometheus query round in a process of its own, so that its CPU and memory
are the round's: ``python -m bench.fleet_round URL AT TIMEOUT [AT ...]``.

The source is built as ``gpumon controller`` builds it (:func:`gpumon.controller.app._signals`
on a default config with ``signals.source: prometheus`` and a ``stale_after`` that fits the
fleet's scrape interval), with its clock set to each AT in turn
(the TSDB's data are minutes old by the time it is queried); one ``poll_once`` per AT. Prints
one JSON line: the process's RSS after start-up, and per round its wall and CPU seconds, RSS
after it and peak RSS so far, whether it succeeded, the nodes read and the nodes it reported
changed (what the reconciler is then told to evaluate).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import time
from typing import Any

from prometheus_client import CollectorRegistry

from bench.fleet_model import SCRAPE_SECONDS
from bench.procs import memory
from gpumon.config.controller import ControllerConfig
from gpumon.controller.app import _signals
from gpumon.controller.configure import build_policy
from gpumon.controller.shell.metrics import ControllerMetrics


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def rounds(url: str, timeout_seconds: float, times: list[float]) -> dict[str, Any]:
    # The fleet is scraped every SCRAPE_SECONDS (its TSDB stays small), so its readings are
    # allowed to age as long as such a fleet's config would allow them: with the default (60 s),
    # every reading would go stale between two scrapes, and each round would be news for all.
    signals = {
        "source": "prometheus",
        "stale_after_seconds": 2 * SCRAPE_SECONDS,
        "prometheus": {"url": url, "timeout_seconds": timeout_seconds},
    }
    config = ControllerConfig.model_validate({"signals": signals})
    policy = build_policy(config)
    clock = [times[0]]
    source, session = _signals(config, policy, None, ControllerMetrics(CollectorRegistry()), lambda: clock[0])
    out: dict[str, Any] = {"rss_start": memory(os.getpid())[0], "rounds": []}
    try:
        for at in times:
            clock[0] = at
            cpu, wall = _cpu(), time.perf_counter()
            changed = await source.poll_once()
            wall, cpu = time.perf_counter() - wall, _cpu() - cpu
            rss, hwm = memory(os.getpid())
            fleet = source.current()
            out["rounds"].append(
                dict(
                    at=at, wall=wall, cpu=cpu, rss=rss, hwm=hwm, ok=fleet.source_up,
                    nodes=len(fleet.nodes), changed=len(set(changed)),
                )
            )  # fmt: skip
    finally:
        await session.close()
    return out


def main(argv: list[str]) -> int:
    url, timeout, *times = argv
    print(json.dumps(asyncio.run(rounds(url, float(timeout), [float(t) for t in times]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
