"""The CLI's state file and the polling helper."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from gpumon.devcluster import state
from gpumon.devcluster.components import HealthCheck
from gpumon.devcluster.waiting import NotReached, eventually


def test_state_round_trips_and_is_forgotten(tmp_path: Path) -> None:
    s = state.State(
        supervisor_pid=1,
        server="https://127.0.0.1:1",
        kubeconfig="/k",
        ca_cert="/ca",
        client_cert="/c",
        client_key="/k",
        components=(state.ComponentState("etcd", 2, "/l", HealthCheck("http://x/readyz", False)),),
    )
    assert state.load(tmp_path) is None
    state.save(s, tmp_path)
    assert state.load(tmp_path) == s
    state.forget(tmp_path)
    assert state.load(tmp_path) is None


def test_alive() -> None:
    assert state.alive(os.getpid())
    assert not state.alive(2**22 + 1)  # above PID_MAX_LIMIT: never a pid


async def test_eventually_returns_the_first_value_that_is_not_none() -> None:
    answers = iter([None, None, "ready"])

    async def check() -> str | None:
        return next(answers)

    assert await eventually(check, what="x", interval_seconds=0) == "ready"


async def test_eventually_names_what_it_waited_for_and_the_last_value() -> None:
    async def never() -> None:
        return None

    with pytest.raises(NotReached, match="the thing: not reached"):
        await eventually(never, what="the thing", timeout_seconds=0, interval_seconds=0)


async def test_eventually_abandons_a_check_that_outlives_the_deadline_and_says_what_it_saw() -> None:
    seen: list[str] = []

    async def hangs() -> None:
        seen.append("asked")
        await asyncio.Event().wait()  # a request nobody answers

    with pytest.raises(NotReached, match=r"the thing: not reached in 0s \(a check was still running"):
        await eventually(hangs, what="the thing", timeout_seconds=0.2, seen=lambda: seen[-1])
    with pytest.raises(NotReached, match="last seen: 'asked'"):
        await eventually(hangs, what="the thing", timeout_seconds=0.2, seen=lambda: seen[-1])


async def test_a_timeout_of_the_check_itself_is_not_the_deadline() -> None:
    async def times_out() -> None:
        raise TimeoutError("the check's own")

    with pytest.raises(TimeoutError, match="the check's own"):
        await eventually(times_out, what="x", timeout_seconds=5)
