"""Rendering off the loop (gpumon/exporter/render_thread.py): while a render runs, the loop goes
on and serves the last payload; snapshots handed over meanwhile are coalesced to the newest."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from gpumon.exporter.exposition import PRERENDER_SECONDS, RenderedMetrics, Variant
from gpumon.exporter.render_thread import RenderThread
from gpumon.gpu.model import Snapshot


def snapshot(at: float) -> Snapshot:
    return Snapshot(node="n", driver=None, gpus=(), pods=(), taken_at=at, backend_up=True, complete=True)


class Gate:
    """A collector that holds the render thread until the test opens it."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()

    def collect(self) -> Iterator[Metric]:
        self.entered.set()
        self.open.wait(10)
        yield GaugeMetricFamily("gate", "held the render", value=1)


async def test_a_running_render_leaves_the_loop_free_and_later_snapshots_are_coalesced() -> None:
    gate = Gate()
    seen: list[float] = []

    def rendered(snap: Snapshot, _: RenderedMetrics) -> None:
        seen.append(snap.taken_at)

    renderer = RenderThread(profile="native", extra=(gate,), on_rendered=rendered, on_failed=lambda: None)
    try:
        renderer.submit(snapshot(1.0))
        first = await renderer.idle()
        assert first is not None and first.rendered_at == 1.0

        gate.open.clear()
        gate.entered.clear()
        renderer.submit(snapshot(2.0))
        await asyncio.to_thread(gate.entered.wait, 10)  # the render of 2.0 is under way, held
        for at in (3.0, 4.0, 5.0):
            renderer.submit(snapshot(at))
            await asyncio.sleep(0)  # the loop runs while the thread renders
        assert renderer.rendered is first, "the last finished payload is served meanwhile"
        gate.open.set()
        latest = await renderer.idle()
        assert latest is not None and latest.rendered_at == 5.0
        assert seen == [1.0, 2.0, 5.0], "3.0 and 4.0 were superseded before the thread was free"
    finally:
        gate.open.set()
        renderer.close()


async def test_a_failed_render_keeps_the_previous_payload_and_renders_the_next() -> None:
    class Failing:
        fail = False

        def collect(self) -> Iterator[Metric]:
            if self.fail:
                raise RuntimeError("collector broke")
            yield GaugeMetricFamily("ok", "ok", value=1)

    failing = Failing()
    failures: list[None] = []
    renderer = RenderThread(
        profile="native",
        extra=(failing,),
        on_rendered=lambda *_: None,
        on_failed=lambda: failures.append(None),
    )
    try:
        renderer.submit(snapshot(1.0))
        first = await renderer.idle()
        failing.fail = True
        renderer.submit(snapshot(2.0))
        assert await renderer.idle() is first and len(failures) == 1
        failing.fail = False
        renderer.submit(snapshot(3.0))
        third = await renderer.idle()
        assert third is not None and third.rendered_at == 3.0
    finally:
        renderer.close()


async def test_the_variants_scraped_lately_are_written_before_the_payload_is_published() -> None:
    now = [1000.0]
    written: list[frozenset[Variant]] = []
    renderer = RenderThread(
        profile="native",
        extra=(),
        on_rendered=lambda _, out: written.append(out.written()),
        on_failed=lambda: None,
        clock=lambda: now[0],
    )
    try:
        renderer.submit(snapshot(1.0))
        await renderer.idle()
        renderer.asked(("openmetrics", True))
        renderer.submit(snapshot(2.0))
        await renderer.idle()
        now[0] += PRERENDER_SECONDS + 1  # nobody has asked for it since
        renderer.submit(snapshot(3.0))
        await renderer.idle()
    finally:
        renderer.close()
    assert written == [frozenset(), {("openmetrics", False), ("openmetrics", True)}, frozenset()]
