from __future__ import annotations

import pytest
from controller_fakes import FakeKube, finding, gpu_verdict, verdict

from gpumon.controller.act.evict import EvictionResult, Evictor
from gpumon.controller.act.retry import RetryPolicy
from gpumon.controller.core.backoff import Backoff
from gpumon.controller.core.contract import NodePhase
from gpumon.controller.core.drain_plan import DrainPolicy, needs_drain, plan_drain
from gpumon.controller.core.objects import GpuResources, PdbView, PodView, pdb_from_json, pod_from_json
from gpumon.controller.core.plans import DrainTarget
from gpumon.controller.core.signals import GpuReading, NodeReading
from gpumon.gpu.health import Severity
from gpumon.gpu.model import PodRef
from gpumon.k8s.selectors import LabelSelector
from gpumon.k8s.sharing import CardRef
from gpumon.kube.client import KubeError, TooManyRequests


def pod(name: str, *, uses_gpu: bool = True, phase: str = "Running", **kw) -> PodView:
    return PodView("ml", name, f"uid-{name}", "n1", phase=phase, uses_gpu=uses_gpu, **kw)


def reading(attributed: bool = True, **pods_by_gpu: list[str]) -> NodeReading:
    gpus = tuple(
        GpuReading(
            f"GPU-{i}", i, 1.0, pods=tuple(PodRef("ml", p, "main") for p in pods_by_gpu.get(f"g{i}", ()))
        )
        for i in range(4)
    )
    return NodeReading("n1", 1.0, gpus, pods_attributed=attributed)


def plan(v, r, pods, pdbs=(), now=10.0, started_at=0.0, policy=None):
    return plan_drain(v, r, pods, pdbs, now=now, started_at=started_at, policy=policy or DrainPolicy())


PODS = [pod("a"), pod("b"), pod("c"), pod("web", uses_gpu=False)]


def names(p) -> list[str]:
    return [t.pod.name for t in p.targets]


def test_partial_drain_takes_only_the_pods_on_the_bad_gpu():
    p = plan(verdict(gpu_verdict(1)), reading(g0=["a"], g1=["b"], g2=["c"]), PODS)
    assert p.partial and names(p) == ["b"]
    assert p.targets[0].why == "uses GPU 1 (GPU-1)"
    assert p.phase is NodePhase.DRAINING and not p.overdue


def test_pod_spanning_good_and_bad_gpus_goes_once():
    p = plan(verdict(gpu_verdict(1), gpu_verdict(2)), reading(g1=["b"], g2=["b"], g0=["a"]), PODS[:2])
    assert names(p) == ["b"]
    assert p.targets[0].why == "uses GPU 1 (GPU-1), GPU 2 (GPU-2)"


def test_unplaced_gpu_pods_go_too_because_they_might_be_on_the_bad_gpu():
    p = plan(verdict(gpu_verdict(1)), reading(g0=["a"], g1=["b"]), PODS)
    assert names(p) == ["b", "c"]
    assert "places on a GPU" in p.targets[1].why


@pytest.mark.parametrize(
    "case",
    ["no attribution", "no reading", "node finding"],
)
def test_full_drain_without_a_trustworthy_mapping(case):
    v = verdict(gpu_verdict(1))
    r = reading(g0=["a"], g1=["b"], g2=["c"])
    if case == "no attribution":
        r = reading(False, g1=["b"])
    elif case == "no reading":
        r = None
    else:
        v = verdict(gpu_verdict(1), node_findings=(finding("nv", reason="Custom"),))
    p = plan(v, r, PODS)
    assert not p.partial and names(p) == ["a", "b", "c"]
    assert p.targets[0].why == "GPU pod on a node with unhealthy GPUs"


def test_daemonset_mirror_terminating_and_finished_pods_are_left():
    pods = [
        pod("ds", owner_kind="DaemonSet"),
        pod("static", mirror=True),
        pod("leaving", terminating=True),
        pod("done", phase="Succeeded"),
        pod("rs", owner_kind="ReplicaSet"),
    ]
    p = plan(verdict(gpu_verdict(1)), None, pods)
    assert names(p) == ["rs"]
    assert {(s.name, why) for s, why in p.skipped} == {
        ("ds", "DaemonSet pod"),
        ("static", "mirror pod (owned by the kubelet)"),
    }


def test_nothing_left_means_drained():
    p = plan(verdict(gpu_verdict(1)), reading(g0=["a"]), [pod("a")])
    assert p.targets == () and p.phase is NodePhase.DRAINED and not p.overdue


def test_deadline_and_overdue():
    p = plan(verdict(gpu_verdict(1)), None, PODS, now=600.0, started_at=0.0)
    assert p.deadline_at == 600.0 and p.overdue
    assert not plan(verdict(gpu_verdict(1)), None, PODS, now=599.0).overdue


def test_pdbs_covering_each_target_are_named():
    pdb = PdbView("ml", "keep-one", LabelSelector({"app": "x"}), 0)
    other_ns = PdbView("other", "p", LabelSelector({"app": "x"}), 0)
    pods = [pod("a", labels={"app": "x"}), pod("b", labels={"app": "y"})]
    p = plan(verdict(gpu_verdict(1)), None, pods, pdbs=[pdb, other_ns])
    assert [t.pdbs for t in p.targets] == [(pdb,), ()]


def test_degraded_drains_only_when_asked():
    deg = verdict(gpu_verdict(1, finding(severity=Severity.DEGRADED, reason="Thermal")))
    assert not needs_drain(deg, DrainPolicy())
    assert needs_drain(deg, DrainPolicy(on_degraded=True))
    assert needs_drain(verdict(gpu_verdict(1)), DrainPolicy())
    assert not needs_drain(verdict(gpu_verdict(1)), DrainPolicy(enabled=False))
    # With on_degraded, degraded GPUs' pods are targets too.
    mixed = verdict(gpu_verdict(1), gpu_verdict(2, finding(severity=Severity.DEGRADED, reason="Thermal")))
    r = reading(g1=["a"], g2=["b"], g0=["c"])
    assert names(plan(mixed, r, PODS)) == ["a"]
    assert names(plan(mixed, r, PODS, policy=DrainPolicy(on_degraded=True))) == ["a", "b"]


def test_shared_pods_are_placed_by_their_annotations_without_the_exporter():
    # gpushare names the card by index, HAMi by UUID; the exporter attributes nothing here.
    pods = [
        pod("a", cards=(CardRef(None, 0),)),
        pod("b", cards=(CardRef(None, 1),)),
        pod("c", cards=(CardRef(None, 1),)),
        pod("h", cards=(CardRef("GPU-1", None),)),
        pod("h0", cards=(CardRef("GPU-0", None),)),
    ]
    p = plan(verdict(gpu_verdict(1)), reading(False), pods)
    assert p.partial and names(p) == ["b", "c", "h"]
    assert p.targets[0].why == "uses GPU 1 (GPU-1)"
    # Without a reading at all the annotations still place them.
    assert names(plan(verdict(gpu_verdict(1)), None, pods)) == ["b", "c", "h"]
    # A node-scoped finding takes every GPU pod, placed or not.
    whole = verdict(gpu_verdict(1), node_findings=(finding("nv", reason="Custom"),))
    assert not plan(whole, None, pods).partial and len(plan(whole, None, pods).targets) == 5


def test_a_pod_the_annotations_place_nowhere_goes_with_the_shared_ones():
    # A DirectX pod names no card; beside pods the annotations place, it might be on the bad one.
    pods = [pod("a", cards=(CardRef(None, 0),)), pod("dx")]
    p = plan(verdict(gpu_verdict(1)), reading(False), pods)
    assert names(p) == ["dx"] and "places on a GPU" in p.targets[0].why


def test_exporter_attribution_and_annotations_add_up():
    # The exporter sees "a" use GPU 1 although its annotation says GPU 0: it goes too.
    pods = [pod("a", cards=(CardRef(None, 0),)), pod("b", cards=(CardRef(None, 1),))]
    p = plan(verdict(gpu_verdict(1)), reading(g1=["a"]), pods)
    assert names(p) == ["a", "b"]


@pytest.mark.parametrize(
    "limits",
    [
        {"aliyun.com/gpu-mem": "4"},
        {"aliyun.com/gpu-core.percentage": "30"},
        {"windows.alibabacloud.com/directx": "1"},
        {"nvidia.com/gpumem": "1024"},
        {"nvidia.com/gpu.shared": "1"},
    ],
)
def test_every_gpu_resource_gpumon_knows_makes_a_gpu_pod_by_default(limits):
    container = {"name": "c", "resources": {"limits": limits}}
    raw = {"metadata": {"name": "p"}, "spec": {"containers": [container]}}
    assert pod_from_json(raw, GpuResources()).uses_gpu
    # A cluster that narrows the list gets what it asked for.
    assert not pod_from_json(raw, GpuResources(frozenset({"nvidia.com/gpu"}), ())).uses_gpu


def test_pod_from_json_reads_the_cards_of_a_gpushare_pod():
    raw = {
        "metadata": {"name": "p", "annotations": {"ALIYUN_COM_GPU_MEM_IDX": "1"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": "4"}}}]},
    }
    assert pod_from_json(raw, GpuResources()).cards == (CardRef(None, 1),)


def test_pod_and_pdb_from_json():
    resources = GpuResources()
    raw = {
        "metadata": {
            "name": "p",
            "namespace": "ml",
            "uid": "u1",
            "labels": {"app": "x"},
            "ownerReferences": [{"kind": "ReplicaSet", "controller": True}, {"kind": "Other"}],
            "deletionTimestamp": "2024-01-01T00:00:00Z",
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}],
            "initContainers": [{"name": "i", "resources": {"requests": {"nvidia.com/mig-1g.10gb": "1"}}}],
        },
        "status": {"phase": "Running"},
    }
    p = pod_from_json(raw, resources)
    assert (p.key, p.uid, p.node_name, p.owner_kind, p.terminating, p.uses_gpu) == (
        ("ml", "p"),
        "u1",
        "n1",
        "ReplicaSet",
        True,
        True,
    )
    raw["spec"]["initContainers"] = []
    assert not pod_from_json(raw, resources).uses_gpu
    mirror = pod_from_json({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}}, resources)
    assert mirror.mirror and mirror.phase == "Pending"

    pdb = pdb_from_json(
        {
            "metadata": {"name": "b", "namespace": "ml"},
            "spec": {
                "selector": {
                    "matchLabels": {"app": "x"},
                    "matchExpressions": [
                        {"key": "tier", "operator": "In", "values": ["gpu"]},
                        {"key": "canary", "operator": "DoesNotExist"},
                    ],
                }
            },
            "status": {"disruptionsAllowed": 1},
        }
    )
    assert pdb.disruptions_allowed == 1
    assert pdb.covers(pod("q", labels={"app": "x", "tier": "gpu"}))
    assert not pdb.covers(pod("q", labels={"app": "x", "tier": "cpu"}))
    assert not pdb.covers(pod("q", labels={"app": "x", "tier": "gpu", "canary": "1"}))
    nulled = pdb_from_json({"metadata": {"name": "n", "namespace": "ml"}, "spec": {}})
    assert not nulled.covers(pod("q"))
    everything = pdb_from_json({"metadata": {"name": "e", "namespace": "ml"}, "spec": {"selector": {}}})
    assert everything.covers(pod("q"))


# --- Evictor ----------------------------------------------------------------------------------

EVICT = "/api/v1/namespaces/ml/pods/a/eviction"


def target(name: str = "a") -> DrainTarget:
    return DrainTarget(pod(name), "uses GPU 1")


async def test_eviction_posts_an_eviction_with_uid_precondition():
    api = FakeKube()
    out = await Evictor(api, RetryPolicy(Backoff())).run(target(), now=0.0, delete=False, dry_run=False)
    assert out.result is EvictionResult.EVICTED
    ((method, path, body),) = api.writes()
    assert (method, path) == ("POST", EVICT)
    assert body["kind"] == "Eviction" and body["apiVersion"] == "policy/v1"
    assert body["deleteOptions"] == {"preconditions": {"uid": "uid-a"}}


async def test_429_backs_off_and_retries_later():
    api = FakeKube()
    calls = []

    def blocked(body):
        calls.append(body)
        if len(calls) <= 2:
            raise TooManyRequests(
                429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget."
            )
        return None

    api.hooks[("POST", EVICT)] = blocked
    ev = Evictor(api, RetryPolicy(Backoff(initial_seconds=5, max_seconds=60, jitter=0)))
    out = await ev.run(target(), now=0.0, delete=False, dry_run=False)
    assert out.result is EvictionResult.BLOCKED and "disruption budget" in out.detail
    assert ev.next_try_at([target()]) == 5.0
    assert (await ev.run(target(), now=4.0, delete=False, dry_run=False)).result is EvictionResult.WAITING
    assert len(calls) == 1
    assert (await ev.run(target(), now=5.0, delete=False, dry_run=False)).result is EvictionResult.BLOCKED
    assert ev.next_try_at([target()]) == 15.0  # 5 + 10: exponential
    assert (await ev.run(target(), now=15.0, delete=False, dry_run=False)).result is EvictionResult.EVICTED
    assert ev.next_try_at([target()]) is None


async def test_escalation_deletes_with_precondition_even_while_backing_off():
    api = FakeKube()
    api.add("/api/v1/namespaces/ml/pods/a", {"metadata": {"name": "a"}})
    ev = Evictor(api, RetryPolicy(Backoff()))
    out = await ev.run(target(), now=0.0, delete=True, dry_run=False)
    assert out.result is EvictionResult.DELETED
    assert api.writes() == [("DELETE", "/api/v1/namespaces/ml/pods/a", {"preconditions": {"uid": "uid-a"}})]


async def test_gone_pods_errors_and_dry_run():
    api = FakeKube()
    ev = Evictor(api, RetryPolicy(Backoff(jitter=0)))
    # Delete of a pod that is already gone.
    assert (await ev.run(target(), now=0.0, delete=True, dry_run=False)).result is EvictionResult.GONE

    def fail(body):
        raise KubeError(500, "InternalError", "boom")

    api.hooks[("POST", EVICT)] = fail
    out = await ev.run(target(), now=0.0, delete=False, dry_run=False)
    assert out.result is EvictionResult.ERROR and ev.next_try_at([target()]) == 1.0

    def replaced(body):
        raise KubeError(409, "Conflict", "Precondition failed: UID in precondition")

    api.hooks[("POST", EVICT)] = replaced
    assert (await ev.run(target(), now=5.0, delete=False, dry_run=False)).result is EvictionResult.GONE
    n = len(api.calls)
    assert (await ev.run(target(), now=5.0, delete=False, dry_run=True)).result is EvictionResult.DRY_RUN
    assert len(api.calls) == n


async def test_forget_drops_retry_state_of_pods_no_longer_drained():
    api = FakeKube()

    def blocked(body):
        raise TooManyRequests(429, "TooManyRequests", "pdb")

    api.hooks[("POST", EVICT)] = blocked
    ev = Evictor(api, RetryPolicy(Backoff()))
    await ev.run(target(), now=0.0, delete=False, dry_run=False)
    ev.forget("uid-a")
    assert ev.next_try_at([target()]) is None


def test_backoff_is_capped_exponential_with_bounded_jitter():
    b = Backoff(initial_seconds=1, max_seconds=30, jitter=0.1)
    delays = [b.delay(n) for n in range(1, 10)]
    for n, d in enumerate(delays, start=1):
        base = min(30, 2 ** (n - 1))
        assert base <= d <= min(30, base * 1.1)
    assert delays[-1] == 30
    assert Backoff(jitter=0).delay(3) == 4.0


async def test_a_pod_evicted_once_is_not_evicted_again_until_a_list_of_its_node_misses_it():
    # A terminating pod is still listed, and the Eviction API accepts a second eviction of it.
    api = FakeKube()
    ev = Evictor(api, RetryPolicy(Backoff()))
    assert (await ev.run(target(), now=0.0, delete=False, dry_run=False)).result is EvictionResult.EVICTED
    for later in (1.0, 100.0):
        assert (
            await ev.run(target(), now=later, delete=False, dry_run=False)
        ).result is EvictionResult.WAITING
    assert (await ev.run(target(), now=700.0, delete=True, dry_run=False)).result is EvictionResult.WAITING
    assert len(api.writes()) == 1
    ev.settle("n1", {"uid-a"})  # still listed (terminating): still remembered
    ev.settle("other", set())  # another node's list says nothing of it
    assert (await ev.run(target(), now=750.0, delete=False, dry_run=False)).result is EvictionResult.WAITING
    ev.settle("n1", set())  # gone from its node's list: nothing is remembered about it any more
    assert (await ev.run(target(), now=800.0, delete=False, dry_run=False)).result is EvictionResult.EVICTED


def test_a_pdb_with_a_null_disruptions_allowed_allows_none() -> None:
    # Found by the fuzz tier: a null status.disruptionsAllowed raised TypeError in the converter.
    pdb = pdb_from_json({"metadata": {"name": "b"}, "status": {"disruptionsAllowed": None}})
    assert pdb.disruptions_allowed == 0
