from __future__ import annotations

from controller_fakes import FakeKube

from gpumon.controller.events import EventRecorder
from gpumon.controller.kube import KubeError
from gpumon.controller.plans import Event, ObjectRef


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
