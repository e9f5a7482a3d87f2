from __future__ import annotations

import asyncio
import time

import pytest
from controller_fakes import FAST_LEASE, FakeKube, lease_thread
from direct_harness import wait_for
from prometheus_client import CollectorRegistry

from gpumon.controller.app import _lease_client
from gpumon.controller.shell.leader import LeaderElector, LeaderSettings, LeaseRecord, Step, decide
from gpumon.controller.shell.metrics import ControllerMetrics
from gpumon.kube.client import Conflict, KubeClient, Unreachable
from gpumon.kube.credentials import Credentials

S = LeaderSettings(lease_duration_seconds=15, renew_deadline_seconds=10, retry_period_seconds=2)
NS = "/apis/coordination.k8s.io/v1/namespaces/gpumon/leases"
LEASE = f"{NS}/gpumon-controller"


def rec(holder: str, duration: float = 15) -> LeaseRecord:
    return LeaseRecord(holder, duration, "a", "r", 0, "1")


@pytest.mark.parametrize(
    ("record", "observed", "now", "step"),
    [
        (None, 0, 0, Step.CREATE),
        (rec("me"), 0, 100, Step.RENEW),
        (rec(""), 99, 100, Step.ACQUIRE),  # released
        (rec("other"), 90, 100, Step.WAIT),
        (rec("other"), 85, 100, Step.ACQUIRE),  # unchanged for a full lease duration
        (rec("other", duration=0), 90, 100, Step.WAIT),  # no duration recorded: ours
    ],
)
def test_decide(record, observed, now, step):
    assert decide(record, "me", observed_at=observed, now=now, settings=S) is step


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def elector(api: FakeKube, me: str, clock: Clock, settings: LeaderSettings = S) -> LeaderElector:
    return LeaderElector(
        api,
        namespace="gpumon",
        name="gpumon-controller",
        identity=me,
        settings=settings,
        clock=clock,
        wall_clock=clock,
    )


async def test_first_candidate_creates_the_lease_and_leads_until_its_renew_deadline():
    api, clock = FakeKube(), Clock()
    api.creatable.add(NS)
    a = elector(api, "a", clock)
    assert await a.try_once() and a.is_leader()
    spec = api.objects[LEASE]["spec"]
    assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 15
    assert spec["renewTime"].endswith("Z") and spec["leaseTransitions"] == 0
    clock.t += 9.9
    assert a.is_leader()
    clock.t += 0.2  # no renewal for the renew deadline: stop acting
    assert not a.is_leader()
    assert await a.try_once() and a.is_leader()  # renewing brings it back
    assert api.objects[LEASE]["spec"]["acquireTime"] == spec["acquireTime"]


class SlowKube(FakeKube):
    """An API server (or an event loop) that answers a GET ``delay`` seconds late."""

    def __init__(self, clock: Clock, delay: float) -> None:
        super().__init__()
        self.clock, self.delay = clock, delay

    async def get(self, path: str, params=None):
        self.clock.t += self.delay
        return await super().get(path, params)


async def test_a_round_slower_than_the_renew_deadline_holds_the_lease_without_acting_and_says_so(caplog):
    clock = Clock()
    api = SlowKube(clock, delay=0.0)
    api.creatable.add(NS)
    a = elector(api, "a", clock)
    assert await a.try_once() and a.is_leader()
    api.delay = 11.0  # past the 10 s renew deadline
    with caplog.at_level("WARNING", logger="gpumon.controller.shell.leader"):
        assert await a.try_once()  # the lease is written, and ours
        assert not a.is_leader()
        assert await a.try_once() and not a.is_leader()
    assert api.objects[LEASE]["spec"]["holderIdentity"] == "a"
    slow = [r for r in caplog.records if "slower than the renew deadline" in r.getMessage()]
    assert len(slow) == 1  # once per slow spell, not every round
    api.delay = 0.0
    assert await a.try_once() and a.is_leader()


async def test_standby_takes_over_only_after_a_full_lease_duration_and_never_overlaps():
    api, clock = FakeKube(), Clock()
    api.creatable.add(NS)
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert await a.try_once()
    assert not await b.try_once()  # first sight of a's record
    clock.t += 2
    assert await a.try_once()  # a renews: b sees a new version and restarts its count
    for _ in range(7):
        clock.t += 2
        assert not await b.try_once()
    # a stopped renewing at t=1002; b saw that version at t=1004 and must wait 15 s.
    assert clock.t == 1016
    assert not await b.try_once()
    clock.t = 1019
    assert await b.try_once() and b.is_leader()
    assert not a.is_leader()  # a stopped acting at 1012, long before
    spec = api.objects[LEASE]["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1


async def test_racing_writers_one_wins():
    api, clock = FakeKube(), Clock()
    api.creatable.add(NS)
    a = elector(api, "a", clock)
    await a.try_once()

    def someone_else(body):
        raise Conflict(409, "Conflict", "the object has been modified")

    api.hooks[("PUT", LEASE)] = someone_else
    clock.t += 11
    assert not await a.try_once() and not a.is_leader()


async def test_release_hands_over_at_once():
    api, clock = FakeKube(), Clock()
    api.creatable.add(NS)
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    await a.try_once()
    assert not await b.try_once()
    await a.release()
    assert not a.is_leader()
    assert api.objects[LEASE]["spec"]["holderIdentity"] == ""
    assert await b.try_once()


async def test_a_failed_round_keeps_leadership_until_the_deadline():
    api, clock = FakeKube(), Clock()
    api.creatable.add(NS)
    a = elector(api, "a", clock)
    await a.try_once()
    del api.objects[LEASE]  # gone: the next round creates it again

    def down(body):
        from gpumon.kube.client import Unreachable

        raise Unreachable("connection refused")

    api.hooks[("POST", NS)] = down
    clock.t += 5
    assert not await a.try_once()
    assert a.is_leader()  # still within the renew deadline of the last success
    clock.t += 6
    assert not a.is_leader()


async def test_every_gain_and_loss_is_counted_where_the_gauge_would_miss_them():
    """A lease lost and won back between two scrapes leaves the gauge at 1; the counter keeps
    both. A clean stop hands the lease over, and counts as lost."""
    metrics = ControllerMetrics(CollectorRegistry())
    api = FakeKube()
    lease = lease_thread(api, on_change=metrics.leading)

    def changes() -> tuple[float | None, ...]:
        sample = metrics.registry.get_sample_value
        return tuple(
            sample("gpumon_controller_leadership_changes_total", {"to": to}) for to in ("gained", "lost")
        )

    def down(_: object) -> None:
        raise Unreachable("connection refused")

    assert changes() == (0, 0)  # exported before the first change
    task = asyncio.create_task(lease.run())
    try:
        await wait_for(lambda: changes() == (1, 0), "leadership")
        api.hooks[("GET", LEASE)] = down
        await wait_for(lambda: changes() == (1, 1), "leadership lost past the renew deadline")
        del api.hooks[("GET", LEASE)]
        await wait_for(lambda: changes() == (2, 1), "leadership won back")
        assert metrics.registry.get_sample_value("gpumon_controller_leader") == 1
    finally:
        await lease.release()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert changes() == (2, 2)


async def test_release_after_the_loop_stopped_still_hands_the_lease_over():
    # The app stops the loop, which ends leadership, before it releases: the record is still ours.
    api, clock = FakeKube(), Clock()
    api.creatable.add(NS)
    a = elector(api, "a", clock)
    task = asyncio.create_task(a.run())
    await wait_for(a.is_leader, "a leads")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not a.is_leader()
    await a.release()
    assert api.objects[LEASE]["spec"]["holderIdentity"] == ""


class GarbledOnce(FakeKube):
    """Answers the first GET with something no Lease is."""

    def __init__(self) -> None:
        super().__init__()
        self.garbled = False

    async def get(self, path: str, params=None):
        if not self.garbled:
            self.garbled = True
            return {"spec": {"leaseDurationSeconds": "soon"}}
        return await super().get(path, params)


async def test_a_round_that_fails_unexpectedly_is_logged_and_tried_again(caplog):
    api, clock = GarbledOnce(), Clock()
    api.creatable.add(NS)
    a = elector(api, "a", clock, FAST_LEASE)
    with caplog.at_level("ERROR", logger="gpumon.controller.shell.leader"):
        task = asyncio.create_task(a.run())
        try:
            await wait_for(a.is_leader, "a leads after the bad round")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert any("failed unexpectedly" in r.getMessage() for r in caplog.records)


# -- on its own thread ---------------------------------------------------------------------------


def spin(seconds: float) -> None:
    """A busy loop holding the GIL, as a long synchronous stretch of the main loop does."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.parametrize("block", [time.sleep, spin], ids=["sleeping", "spinning"])
async def test_renewal_goes_on_while_the_main_loop_is_blocked_past_the_renew_deadline(block):
    api = FakeKube()
    lease = lease_thread(api)
    task = asyncio.create_task(lease.run())
    try:
        await wait_for(lease.is_leader, "leadership")
        before = len(api.writes("PUT"))
        # Blocking the loop is the test: three renew deadlines without one await.
        block(3 * FAST_LEASE.renew_deadline_seconds)
        assert lease.is_leader()
        renewals = len(api.writes("PUT")) - before
        assert renewals >= 5, renewals  # one every retry period (0.1 s) of the 1.5 s
    finally:
        await lease.release()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert api.objects[LEASE]["spec"]["holderIdentity"] == ""  # the clean stop handed it over


async def test_cancelled_the_thread_stops_dead_and_releases_nothing():
    api = FakeKube()
    lease = lease_thread(api)
    task = asyncio.create_task(lease.run())
    await wait_for(lease.is_leader, "leadership")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not lease.is_leader()
    await lease.release()  # as the app's stop does after a crash: nothing left to release
    assert api.objects[LEASE]["spec"]["holderIdentity"] == "a"


async def test_a_thread_that_dies_is_not_leader_and_its_task_says_so(caplog):
    api = FakeKube()
    lease = lease_thread(api)

    class Broken:
        async def __aenter__(self):
            raise OSError("no client")

        async def __aexit__(self, *exc):
            return None

    lease._client = Broken  # the thread's client cannot be made
    with (
        caplog.at_level("ERROR", logger="gpumon.controller.shell.lease_thread"),
        pytest.raises(RuntimeError, match="lease renewal thread stopped"),
    ):
        async with asyncio.timeout(10):
            await lease.run()
    assert not lease.is_leader()
    assert any("thread died" in r.getMessage() for r in caplog.records)


async def test_the_lease_thread_gets_a_client_of_its_own_on_the_same_credentials():
    credentials = Credentials("https://api.example:6443", None, token="t")
    shared = KubeClient(credentials)
    async with _lease_client(shared, 3.0)() as own:
        assert isinstance(own, KubeClient) and own is not shared
        assert own.credentials is credentials
