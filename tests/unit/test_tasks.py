import asyncio
import logging
from collections.abc import Callable

import pytest

from gpumon.runtime.tasks import Supervisor, cancel_and_wait


async def test_cancels_and_waits_for_every_task() -> None:
    stopped: list[str] = []

    async def worker(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.append(name)

    tasks = [asyncio.create_task(worker(n)) for n in ("a", "b")]
    await asyncio.sleep(0)
    await cancel_and_wait(tasks)
    assert sorted(stopped) == ["a", "b"] and all(t.cancelled() for t in tasks)


async def test_a_cancellation_of_the_caller_is_not_swallowed() -> None:
    release = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await release.wait()  # cleanup that takes a while

    async def shutdown() -> str:
        task = asyncio.create_task(slow_to_stop())
        await asyncio.sleep(0)  # let it start, so its cleanup runs
        await cancel_and_wait([task])
        return "finished"

    async def started_then_cancelled() -> str:
        inner = asyncio.create_task(shutdown())
        await asyncio.sleep(0.01)
        inner.cancel()
        release.set()
        return await inner

    with pytest.raises(asyncio.CancelledError):
        await started_then_cancelled()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not predicate():  # noqa: ASYNC110 - the supervisor's restarts are on the loop
            await asyncio.sleep(0)


async def test_a_task_that_dies_is_logged_counted_restarted_and_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="gpumon.runtime.tasks")
    clock = Clock()
    restarts: list[str] = []
    runs: list[int] = []
    healed = asyncio.Event()

    async def flaky() -> None:
        runs.append(len(runs))
        if len(runs) < 3:
            raise RuntimeError(f"bad luck {len(runs)}")
        await healed.wait()
        return  # a long-lived task that returns has stopped working too

    sup = Supervisor(delay=lambda deaths: 0.0, on_restart=restarts.append, clock=clock, crashloop_after=3)
    sup.start("flaky", flaky)
    await _until(lambda: len(runs) == 3)
    assert restarts == ["flaky", "flaky"]
    died = [r for r in caplog.records if getattr(r, "task", None) == "flaky"]
    assert len(died) == 2 and all(r.exc_info for r in died)
    [trouble] = sup.restarting()
    assert (trouble.name, trouble.deaths, trouble.error) == ("flaky", 2, "RuntimeError: bad luck 2")
    assert not sup.crashlooping()
    healed.set()
    await _until(lambda: len(runs) == 4)
    assert sup.crashlooping()[0].error == "returned"  # three deaths in a row, the last recent
    # A quiet minute: neither restarting nor crashlooping any more.
    clock.now = 61.0
    assert not sup.restarting() and not sup.crashlooping()
    await sup.stop()
    assert not sup.tasks


async def test_a_run_that_lasted_resets_the_count_and_backoff() -> None:
    clock = Clock()
    delays: list[int] = []
    fail = asyncio.Event()
    runs: list[None] = []

    async def dies_when_told() -> None:
        runs.append(None)
        await fail.wait()
        fail.clear()
        raise RuntimeError("told")

    def delay(deaths: int) -> float:
        delays.append(deaths)
        return 0.0

    sup = Supervisor(delay=delay, clock=clock, stable_seconds=60.0)
    sup.start("worker", dies_when_told)
    fail.set()
    await _until(lambda: len(delays) == 1 and len(runs) == 2)
    fail.set()
    await _until(lambda: len(delays) == 2)
    await _until(lambda: len(runs) == 3)
    clock.now = 100.0  # this run lasts longer than stable_seconds
    fail.set()
    await _until(lambda: len(delays) == 3)
    assert delays == [1, 2, 1]
    await sup.stop()


async def test_stopping_cancels_and_is_not_a_death() -> None:
    restarts: list[str] = []
    sup = Supervisor(delay=lambda deaths: 0.0, on_restart=restarts.append)
    task = sup.start("idle", lambda: asyncio.Event().wait())  # type: ignore[arg-type,return-value]
    await asyncio.sleep(0)
    await sup.stop()
    assert task.cancelled() and not restarts and not sup.restarting()
