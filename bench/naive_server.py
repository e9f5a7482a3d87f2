"""The naive design the exporter replaces: a prometheus_client custom collector that reads every
device on every scrape, served by prometheus_client's stock threaded HTTP server.

    python -m bench.naive_server --port 9843 --gpus 8 --pods 64

It reads the same simulated GPUs (fast and slow fields of each, in turn), judges health, puts
the same bench pods on them and yields the same metric families as gpumon's native profile
(:func:`gpumon.exporter.exposition.snapshot_families`), so both servers answer with the same
series; only where and when the work happens differs.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import Metric

from bench.pods import BenchPods
from gpumon.config import HealthConfig
from gpumon.devices.backend import GpuLostError
from gpumon.devices.simulated import SimulatedBackend
from gpumon.exporter.exposition import snapshot_families
from gpumon.exporter.sampler import GpuState, to_sample, with_fast, with_lost, with_slow
from gpumon.gpu.model import Snapshot


class NaiveCollector:
    """Reads the devices inside ``collect``, i.e. on the scrape's own thread."""

    def __init__(self, backend: SimulatedBackend, pods: BenchPods, node: str) -> None:
        self._backend = backend
        self._pods = pods
        self._node = node
        self._policy = HealthConfig().policy()
        self._driver = backend.open()
        self._identities = backend.devices()

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        gpus = []
        for ident in self._identities:
            state = GpuState(ident)
            try:
                state = with_slow(
                    with_fast(state, self._backend.read_fast(ident.index), now),
                    self._backend.read_slow(ident.index),
                )
            except GpuLostError:
                state = with_lost(state)
            gpus.append(to_sample(state, now=now, policy=self._policy))
        snapshot = Snapshot(
            node=self._node,
            driver=self._driver,
            gpus=tuple(gpus),
            pods=self._pods.attribute(gpus),
            taken_at=now,
            backend_up=True,
            complete=True,
        )
        yield from snapshot_families(snapshot, "native")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.naive_server", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=64)
    parser.add_argument("--node-name", default="bench-node")
    args = parser.parse_args(argv)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NaiveCollector(SimulatedBackend(args.gpus), BenchPods(args.pods), args.node_name))
    start_http_server(args.port, addr="127.0.0.1", registry=registry)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
