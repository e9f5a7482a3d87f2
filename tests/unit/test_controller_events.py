from __future__ import annotations

from controller_fakes import FakeKube

from gpumon.controller.act.events import MAX_TRIES, EventRecorder
from gpumon.controller.core.objects import to_rfc3339
from gpumon.controller.core.plans import Event, ObjectRef
from gpumon.kube.client import KubeError, Unreachable


class Clock:
    t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


async def test_node_events_land_where_kubectl_describe_looks_and_repeats_are_dropped():
    api, clock = FakeKube(), Clock()
    rec = EventRecorder(api, instance="pod-a", repeat_after_seconds=60, wall_clock=clock)
    ev = Event(ObjectRef("Node", "n1", "uid-1"), "GpuQuarantined", "tainted", warning=True, key="q")
    assert await rec.record(ev, prefix="[dry-run] ")
    ((_, path, body),) = api.writes()
    assert path == "/api/v1/namespaces/default/events"
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "n1",
        "namespace": None,
        "uid": "n1",
    }
    assert (body["type"], body["reason"], body["message"]) == (
        "Warning",
        "GpuQuarantined",
        "[dry-run] tainted",
    )
    assert body["reportingInstance"] == "pod-a" and body["metadata"]["generateName"] == "n1."
    clock.t += 30
    assert not await rec.record(Event(ev.about, ev.reason, "tainted again", key="q"))  # same key: a repeat
    assert await rec.record(Event(ev.about, ev.reason, "other", key="r"))
    clock.t += 31
    assert await rec.record(ev)  # a repeat after repeat_after is news again
    pod = Event(ObjectRef("Pod", "p", "uid-p", "ml"), "GpuPodEvicted", "evicted")
    assert await rec.record(pod)
    assert api.writes()[-1][1] == "/api/v1/namespaces/ml/events"
    assert api.writes()[-1][2]["involvedObject"]["uid"] == "uid-p"


async def test_a_failed_event_is_reported_not_raised():
    api = FakeKube()
    results: list[bool] = []

    def refuse(body):
        raise KubeError(403, "Forbidden", "no")

    api.hooks[("POST", "/api/v1/namespaces/default/events")] = refuse
    rec = EventRecorder(api, instance="x", on_result=results.append)
    assert not await rec.record(Event(ObjectRef("Node", "n1"), "R", "m"))
    assert results == [False]


class Outage:
    """An API server whose events endpoint is unreachable while ``down``."""

    def __init__(self) -> None:
        self.down = True
        self.api, self.clock = FakeKube(), Clock()
        self.api.hooks[("POST", "/api/v1/namespaces/default/events")] = self._post
        self.recorder = EventRecorder(self.api, instance="x", wall_clock=self.clock)

    def _post(self, body: object) -> object:
        if self.down:
            raise Unreachable("POST events: connection refused")
        return {}


QUARANTINED = Event(ObjectRef("Node", "n1"), "GpuQuarantined", "tainted", key="q")


async def test_an_event_the_api_did_not_take_is_sent_when_its_decision_comes_back():
    o = Outage()
    assert not await o.recorder.record(QUARANTINED)  # the API server is restarting
    o.clock.t += 5
    o.down = False
    assert await o.recorder.record(QUARANTINED), "an outage must not swallow the Event"
    o.clock.t += 5
    assert not await o.recorder.record(QUARANTINED)  # taken once: now a repeat


async def test_an_event_whose_decision_does_not_come_back_is_retried_a_few_times():
    # The write the Event announced went through meanwhile: only retry() sends it.
    o = Outage()
    decided = o.clock.t
    assert not await o.recorder.record(QUARANTINED)
    o.clock.t += 5
    await o.recorder.retry()  # still down
    o.down = False
    o.clock.t += 5
    await o.recorder.retry()
    posts = [body for _, _, body in o.api.writes()]
    assert len(posts) == 3 and posts[-1]["firstTimestamp"] == to_rfc3339(decided)
    await o.recorder.retry()
    assert len(o.api.writes()) == 3, "sent once: nothing left to retry"

    o.down = True
    await o.recorder.record(Event(ObjectRef("Node", "n2"), "GpuQuarantined", "tainted", key="q"))
    for _ in range(MAX_TRIES + 3):
        await o.recorder.retry()
    assert len(o.api.writes()) == 3 + MAX_TRIES, "given up after MAX_TRIES"
