import asyncio

import pytest

from gpumon.tasks import cancel_and_wait


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
