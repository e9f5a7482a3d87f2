"""Combining pod-resources, /proc cgroups and pod metadata into per-container GPU series."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

import pytest
from fake_host_proc import cgroup_file, container_path, write_process
from podresources_server import FakeKubelet, pod_resources, serve, short_socket_dir
from prometheus_client import CollectorRegistry, generate_latest

from gpumon.config import PodsConfig
from gpumon.devices.simulated import FaultScenario, SimulatedBackend, SimulationError
from gpumon.exporter import exposition
from gpumon.exporter.attribution import (
    AttributionView,
    PodAttribution,
    build_attribution,
    build_view,
    cap,
    resolve_grants,
    usages,
    watched_resource,
)
from gpumon.exporter.attribution_metrics import AttributionMetrics, SourceState
from gpumon.exporter.cgroups import ContainerKey
from gpumon.exporter.pod_metadata import PodMeta, pod_watch
from gpumon.exporter.podresources_client import DeviceAssignment, PodResourcesClient
from gpumon.exporter.process_pods import ProcessPods
from gpumon.gpu.model import (
    HEALTHY,
    FastFields,
    GpuIdentity,
    GpuSample,
    MigInstance,
    PodGpuUsage,
    PodRef,
    ProcessSample,
    SlowFields,
    Snapshot,
)
from gpumon.k8s import sharing
from gpumon.k8s.sharing import ContainerLimits
from gpumon.kube.informer import View

GIB = 1 << 30
MIB = 1 << 20
UUIDS = ["GPU-00000000-0000-4000-8000-00000000000" + str(i) for i in range(4)]
MIG0 = "MIG-11111111-2222-4333-8444-555555555555"
UID_A, UID_B, UID_H, UID_X, UID_BAD = (f"00000000-0000-4000-8000-{n:012d}" for n in range(1, 6))


def gpu(
    index: int,
    *procs: ProcessSample,
    fast: bool = True,
    migs: tuple[str, ...] = (),
    util: float | None = None,
) -> GpuSample:
    return GpuSample(
        identity=GpuIdentity(index, UUIDS[index], "A100-SXM4-80GB", f"0000:0{index}:00.0"),
        fast=FastFields(utilization_ratio=util, processes=procs) if fast else None,
        slow=SlowFields(mig_instances=tuple(MigInstance(1, 0, "1g.10gb", m) for m in migs)),
        health=HEALTHY,
        sampled_at=0.0,
    )


def proc(pid: int, mib: int | None, sm: float | None = None) -> ProcessSample:
    return ProcessSample(pid, mib * MIB if mib is not None else None, sm)


def meta(
    ns: str,
    name: str,
    uid: str,
    containers: Mapping[str, str],
    *,
    annotations: Mapping[str, str] | None = None,
    limits: Mapping[str, Mapping[str, str]] | None = None,
) -> PodMeta:
    """``containers``: name -> container ID."""
    return PodMeta(
        uid=uid,
        namespace=ns,
        name=name,
        init_containers=(),
        containers=tuple(ContainerLimits(c, (limits or {}).get(c, {})) for c in containers),
        container_ids={cid: c for c, cid in containers.items()},
        annotations=dict(annotations or {}),
    )


def shares(pods: Mapping[str, PodMeta]) -> dict[str, sharing.SharingResult]:
    return {
        uid: sharing.shared_allocations(
            p.annotations, p.init_containers, p.containers, gpushare_unit_bytes=GIB
        )
        for uid, p in pods.items()
    }


# Four pods: two gpushare pods on GPU 0, one HAMi pod on GPU 1, one exclusive pod on GPU 2.
SHARE_A = meta(
    "ml",
    "share-a",
    UID_A,
    {"main": "a" * 64},
    annotations={sharing.GPUSHARE_INDEX: "0", sharing.GPUSHARE_ASSIGNED: "true"},
    limits={"main": {sharing.GPUSHARE_MEMORY_RESOURCE: "10", sharing.CGPU_CORE_RESOURCE: "30"}},
)
SHARE_B = meta(
    "ml",
    "share-b",
    UID_B,
    {"main": "b" * 64},
    annotations={sharing.GPUSHARE_INDEX: "0", sharing.GPUSHARE_ASSIGNED: "true"},
    limits={"main": {sharing.GPUSHARE_MEMORY_RESOURCE: "20"}},
)
HAMI = meta(
    "ml",
    "hami",
    UID_H,
    {"app": "c" * 64},
    annotations={sharing.HAMI_ALLOCATED: f"{UUIDS[1]},NVIDIA,4096,40:;"},
)
EXCLUSIVE = meta("ml", "exclusive", UID_X, {"cuda": "d" * 64, "logger": "e" * 64})
PODS = {p.uid: p for p in (SHARE_A, SHARE_B, HAMI, EXCLUSIVE)}
PR_VIEW = {
    ("ml", "exclusive"): {"cuda": (DeviceAssignment("nvidia.com/gpu", (UUIDS[2],)),), "logger": ()},
    ("ml", "share-a"): {"main": ()},
    ("ml", "share-b"): {"main": ()},
    # HAMi's device plugin hands the kubelet virtual IDs: the annotation is what counts.
    ("ml", "hami"): {"app": (DeviceAssignment("nvidia.com/gpu", (f"{UUIDS[1]}-3",)),)},
}
PIDS = {
    100: ContainerKey(UID_A, "a" * 64),
    101: ContainerKey(UID_A, "a" * 64),
    200: ContainerKey(UID_B, "b" * 64),
    300: ContainerKey(UID_H, "c" * 64),
    400: ContainerKey(UID_X, "d" * 64),
}


def ref(pod: PodMeta, container: str) -> PodRef:
    return PodRef(pod.namespace, pod.name, container, pod.uid)


def run(
    gpus: list[GpuSample],
    pods: Mapping[str, PodMeta] = PODS,
    pr: Mapping[tuple[str, str], Mapping[str, tuple[DeviceAssignment, ...]]] | None = PR_VIEW,
    *,
    fresh: bool = True,
    lookup: bool = True,
) -> dict[tuple[str, str, int], PodGpuUsage]:
    view = build_view(pods, shares(pods), pr, fresh)
    allocations, _ = resolve_grants(view.grants, gpus)
    out = usages(gpus, PIDS.get if lookup else None, view, allocations)
    return {(u.ref.pod, u.ref.container, u.gpu_index): u for u in out}


def test_shared_and_exclusive_pods() -> None:
    gpus = [
        gpu(0, proc(100, 3000, 0.10), proc(101, 1000, 0.05), proc(200, 8000, 0.50)),
        gpu(1, proc(300, 2048, 0.20)),
        gpu(2, proc(400, 70000, 0.90)),
        gpu(3),
    ]
    got = run(gpus)
    assert set(got) == {
        ("share-a", "main", 0),
        ("share-b", "main", 0),
        ("hami", "app", 1),
        ("exclusive", "cuda", 2),
    }
    a = got[("share-a", "main", 0)]
    assert (a.used_memory_bytes, a.utilization_ratio) == (4000 * MIB, pytest.approx(0.15))
    assert (a.allocated_memory_bytes, a.allocated_core_ratio, a.allocated_resources) == (10 * GIB, 0.30, ())
    assert a.ref == ref(SHARE_A, "main") and a.gpu_uuid == UUIDS[0] and not a.unallocated
    b = got[("share-b", "main", 0)]
    assert (b.used_memory_bytes, b.allocated_memory_bytes, b.allocated_core_ratio) == (
        8000 * MIB,
        20 * GIB,
        None,
    )
    h = got[("hami", "app", 1)]
    assert (h.used_memory_bytes, h.allocated_memory_bytes, h.allocated_core_ratio) == (
        2048 * MIB,
        4096 * MIB,
        0.40,
    )
    assert h.allocated_resources == ()
    x = got[("exclusive", "cuda", 2)]
    assert (x.used_memory_bytes, x.utilization_ratio, x.allocated_resources) == (
        70000 * MIB,
        0.90,
        ("nvidia.com/gpu",),
    )
    assert x.allocated_memory_bytes is None and not x.unallocated


def test_per_pod_usage_adds_up_to_at_most_the_card() -> None:
    # Raw samples: share-a 0.9, share-b 0.4 (1.3 together) on a card measured at 0.8 busy.
    procs = (proc(100, 3000, 0.6), proc(101, 1000, 0.3), proc(200, 8000, 0.4), proc(999, 500, 0.1))
    got = run([gpu(0, *procs, util=0.8)])
    assert sum(u.used_memory_bytes or 0 for u in got.values()) == 12000 * MIB  # pid 999 is no pod's
    a, b = got[("share-a", "main", 0)].utilization_ratio, got[("share-b", "main", 0)].utilization_ratio
    assert a == pytest.approx(0.8 * 0.9 / 1.3) and b == pytest.approx(0.8 * 0.4 / 1.3)
    assert a + b == pytest.approx(0.8)
    # Below the card's figure the samples stand as measured.
    got = run([gpu(0, proc(100, 1, 0.2), proc(200, 1, 0.3), util=0.6)])
    assert [got[("share-a", "main", 0)].utilization_ratio, got[("share-b", "main", 0)].utilization_ratio] == [
        0.2,
        0.3,
    ]


def test_sm_utilization_of_a_container_is_capped_at_one() -> None:
    # A card that reports no utilization of its own: its containers add up to at most 1.
    got = run([gpu(0, proc(100, 1, 0.8), proc(101, 1, 0.7))])
    assert got[("share-a", "main", 0)].utilization_ratio == 1.0


def test_idle_allocated_pods_show_zero_not_nothing() -> None:
    got = run([gpu(0), gpu(1), gpu(2), gpu(3)])
    assert {k: (u.used_memory_bytes, u.utilization_ratio) for k, u in got.items()} == {
        ("share-a", "main", 0): (0, 0.0),
        ("share-b", "main", 0): (0, 0.0),
        ("hami", "app", 1): (0, 0.0),
        ("exclusive", "cuda", 2): (0, 0.0),
    }


def test_without_process_data_usage_is_unknown_but_allocations_stay() -> None:
    for got in (run([gpu(i) for i in range(4)], lookup=False), run([gpu(i, fast=False) for i in range(4)])):
        assert len(got) == 4
        assert all(u.used_memory_bytes is None and u.utilization_ratio is None for u in got.values())
        assert got[("hami", "app", 1)].allocated_memory_bytes == 4096 * MIB


def test_processes_without_utilization_samples() -> None:
    got = run([gpu(2, proc(400, 100, None))])
    assert (
        got[("exclusive", "cuda", 2)].used_memory_bytes,
        got[("exclusive", "cuda", 2)].utilization_ratio,
    ) == (
        100 * MIB,
        None,
    )


def test_use_of_a_gpu_not_allocated_is_attributed_and_flagged() -> None:
    # The exclusive pod was given GPU 2, and runs something on GPU 3 too.
    gpus = [gpu(0), gpu(2), gpu(3, proc(400, 500, 0.1))]
    got = run(gpus)
    rogue = got[("exclusive", "cuda", 3)]
    assert rogue.unallocated and rogue.used_memory_bytes == 500 * MIB and rogue.allocated_resources == ()
    assert not got[("exclusive", "cuda", 2)].unallocated


def test_not_flagged_when_allocations_are_unknown() -> None:
    # pod-resources down and no sharing annotations: the exclusive pod's GPUs are unknown.
    got = run([gpu(2), gpu(3, proc(400, 500, 0.1))], pr=None)
    assert not got[("exclusive", "cuda", 3)].unallocated
    got = run([gpu(2), gpu(3, proc(400, 500, 0.1))], fresh=False)
    assert not got[("exclusive", "cuda", 3)].unallocated
    assert got[("exclusive", "cuda", 2)].allocated_resources == ("nvidia.com/gpu",)  # last good view


def test_pods_the_kubelet_no_longer_runs_hold_nothing() -> None:
    pr = {k: v for k, v in PR_VIEW.items() if k != ("ml", "share-b")}
    got = run([gpu(0), gpu(1), gpu(2)], pr=pr)
    assert ("share-b", "main", 0) not in got


def test_deleted_pod_vanishes() -> None:
    pods = {uid: p for uid, p in PODS.items() if uid != UID_X}
    pr = {k: v for k, v in PR_VIEW.items() if k != ("ml", "exclusive")}
    got = run([gpu(0), gpu(1), gpu(2)], pods=pods, pr=pr)
    assert not [k for k in got if k[0] == "exclusive"]


def test_pod_resources_alone_names_pods_without_uid() -> None:
    # No API (disabled, or Windows): names come from pod-resources, usage from nowhere.
    got = run([gpu(2)], pods={}, lookup=False)
    x = got[("exclusive", "cuda", 2)]
    assert x.ref == PodRef("ml", "exclusive", "cuda", "") and x.allocated_resources == ("nvidia.com/gpu",)
    assert x.used_memory_bytes is None


def test_process_with_unknown_container_id_falls_back_to_its_pod() -> None:
    pods = {UID_X: meta("ml", "solo", UID_X, {"only": "f" * 64})}
    view = build_view(pods, {}, None, False)
    gpus = [gpu(0, proc(7, 10, 0.1))]
    out = usages(gpus, {7: ContainerKey(UID_X, "9" * 64)}.get, view, {})
    assert [(u.ref.container, u.used_memory_bytes) for u in out] == [("only", 10 * MIB)]
    # The pod of a static pod's process is known by its mirror's annotation.
    mirror = PodMeta(
        "api-uid", "kube-system", "static", (), (ContainerLimits("c", {}),), {}, {}, mirror_uid="hash"
    )
    view = build_view({"api-uid": mirror}, {}, None, False)
    out = usages(gpus, {7: ContainerKey("hash", "")}.get, view, {})
    assert [u.ref.pod for u in out] == ["static"]


@pytest.mark.parametrize(
    "device",
    [UUIDS[1], "1", f"{UUIDS[1]}::3", MIG0, f"MIG-{UUIDS[1]}/1/0"],
    ids=["uuid", "index", "time-sliced", "mig", "legacy-mig"],
)
def test_device_plugin_id_forms(device: str) -> None:
    gpus = [gpu(0), gpu(1, migs=(MIG0,))]
    pr = {("ml", "p"): {"c": (DeviceAssignment("nvidia.com/gpu", (device,)),)}}
    got = run(gpus, pods={}, pr=pr, lookup=False)
    assert list(got) == [("p", "c", 1)]


def test_unknown_devices_are_reported() -> None:
    pr = {("ml", "p"): {"c": (DeviceAssignment("nvidia.com/gpu", ("GPU-gone", UUIDS[0])),)}}
    view = build_view({}, {}, pr, True)
    allocations, unknown = resolve_grants(view.grants, [gpu(0)])
    assert [g.device for g in unknown] == ["GPU-gone"]
    assert len(allocations) == 1


def test_cap_keeps_busy_series_first() -> None:
    series = list(run([gpu(0, proc(200, 5, 0.1)), gpu(1), gpu(2)]).values())
    kept, dropped = cap(series, 2)
    assert [(u.ref.pod, u.gpu_index) for u in kept] == [("share-b", 0), ("exclusive", 2)]
    assert len(dropped) == 2


def pod_source(*pods: PodMeta) -> View[PodMeta]:
    """A pod watch holding ``pods``, as if listed from the API (its loop is tested on its own)."""
    watch = pod_watch("node-a", lambda source, kind: None)
    set_pods(watch, *pods)
    watch.informer.up = True
    return watch


def set_pods(watch: View[PodMeta], *pods: PodMeta) -> None:
    watch._listed({p.uid: p for p in pods})  # what a list does


@pytest.fixture
def host_proc(tmp_path: Path) -> Path:
    for pid, key in PIDS.items():
        path = container_path("systemd", "containerd", "burstable", key.pod_uid, key.container_id)
        write_process(tmp_path, pid, cgroup_file(path, 2))
    return tmp_path


@pytest.fixture
def kubelet() -> Iterator[tuple[FakeKubelet, Path]]:
    with short_socket_dir() as d, serve(d / "kubelet.sock") as k:
        k.pods = [
            pod_resources(ns, name, {c: {a.resource: a.device_ids for a in v} for c, v in cs.items()})
            for (ns, name), cs in PR_VIEW.items()
        ]
        yield k, d / "kubelet.sock"


async def test_attributor_with_real_sources(host_proc: Path, kubelet: tuple[FakeKubelet, Path]) -> None:
    config = PodsConfig(host_proc=host_proc, pod_resources_socket=kubelet[1], max_series=3)
    metrics = AttributionMetrics()
    pods = pod_source(*PODS.values())
    pr = PodResourcesClient(kubelet[1], metrics.error, watched_resource(config), timeout_seconds=5)
    attributor = PodAttribution(
        config,
        metrics,
        pod_resources=pr,
        pods=pods,
        processes=ProcessPods(host_proc, metrics.error),
        call_timeout_seconds=5,
        initial_states={"proc": SourceState.UP},
    )
    gpus = [gpu(0, proc(100, 3000, 0.1), proc(200, 1000, 0.2)), gpu(1), gpu(2, proc(400, 9000, 0.7))]
    first = attributor.attribute(gpus)  # before any refresh: allocations unknown, pids unresolved
    assert first == ()
    await attributor.refresh()
    series = attributor.attribute(gpus)
    assert [(u.ref.pod, u.gpu_index, u.used_memory_bytes) for u in series] == [
        ("exclusive", 2, 9000 * MIB),
        ("share-a", 0, 3000 * MIB),
        ("share-b", 0, 1000 * MIB),
    ]
    assert metrics.dropped_total == 1  # the idle HAMi pod, over the cap of 3
    attributor.attribute(gpus)
    assert metrics.dropped_total == 1  # the same series dropped again is not counted again

    # The exclusive pod is deleted: gone from the API and the kubelet, its process exits.
    set_pods(pods, SHARE_A, SHARE_B, HAMI)
    kubelet[0].pods = [p for p in kubelet[0].pods if p.name != "exclusive"]
    gpus = [gpus[0], gpus[1], gpu(2)]
    await attributor.refresh()
    assert [u.ref.pod for u in attributor.attribute(gpus)] == ["share-a", "share-b", "hami"]

    text = render(metrics)
    assert 'gpumon_exporter_pod_source_state{source="pod_resources",state="up"} 1.0' in text
    assert 'gpumon_exporter_pod_source_state{source="api",state="up"} 1.0' in text
    assert 'gpumon_exporter_pod_source_state{source="proc",state="up"} 1.0' in text
    assert "gpumon_exporter_pod_series 3.0" in text
    assert "gpumon_exporter_pod_series_dropped_total 1.0" in text


async def test_refresh_never_raises() -> None:
    broken = pod_source()
    broken.items = {"u": "not a pod"}  # type: ignore[dict-item]
    metrics = AttributionMetrics()
    attributor = PodAttribution(
        PodsConfig(),
        metrics,
        pod_resources=None,
        pods=broken,
        processes=None,
        call_timeout_seconds=1,
        initial_states={},
    )
    await attributor.refresh()
    assert metrics.errors() == {("attribution", "internal"): 1}
    assert attributor.attribute([gpu(0)]) == ()


async def test_sharing_problems_are_counted_once_per_pod_change() -> None:
    bad = meta("ml", "bad", UID_BAD, {"c": "1" * 64}, annotations={sharing.HAMI_ALLOCATED: "junk:;x:;"})
    metrics = AttributionMetrics()
    pods = pod_source(bad)
    attributor = PodAttribution(
        PodsConfig(api=True),
        metrics,
        pod_resources=None,
        pods=pods,
        processes=None,
        call_timeout_seconds=1,
        initial_states={},
    )
    await attributor.refresh()
    set_pods(pods, bad, SHARE_A)
    await attributor.refresh()
    await attributor.refresh()
    assert metrics.errors() == {("annotations", "hami_container_mismatch"): 1}


async def test_open_without_api_and_without_proc(
    monkeypatch: pytest.MonkeyPatch, kubelet: tuple[FakeKubelet, Path]
) -> None:
    """A Windows node: no /proc; here also no API. Allocations from pod-resources, no crash."""
    monkeypatch.setattr(sys, "platform", "win32")
    config = PodsConfig(api=False, pod_resources_socket=kubelet[1], host_proc=Path("/nonexistent"))
    attributor = build_attribution(config, "node-a", call_timeout_seconds=5)
    async with attributor.running():
        await attributor.refresh()
        series = attributor.attribute([gpu(0, proc(100, 1, 0.1)), gpu(1), gpu(2)])
        assert {(u.ref.pod, u.gpu_index, u.used_memory_bytes) for u in series} == {("exclusive", 2, None)}
        text = render(attributor.metrics)
    assert 'gpumon_exporter_pod_source_state{source="proc",state="unsupported"} 1.0' in text
    assert 'gpumon_exporter_pod_source_state{source="api",state="disabled"} 1.0' in text
    assert 'gpumon_exporter_pod_source_state{source="pod_resources",state="up"} 1.0' in text


async def test_open_with_nothing_reachable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Socket missing, API unreachable, /proc missing: per-pod metrics degrade, errors counted."""
    monkeypatch.setattr(sys, "platform", "linux")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    config = PodsConfig(pod_resources_socket=tmp_path / "none.sock", host_proc=tmp_path / "proc")
    attributor = build_attribution(config, "node-a", call_timeout_seconds=1)
    async with attributor.running():
        await attributor.refresh()
        assert attributor.attribute([gpu(0, proc(1, 1, 0.1))]) == ()
        errors = attributor.metrics.errors()
    assert errors[("pod_resources", "socket_missing")] == 1
    assert errors[("proc", "host_proc_missing")] == 1
    text = render(attributor.metrics)
    assert 'gpumon_exporter_pod_source_state{source="proc",state="down"} 1.0' in text
    assert 'gpumon_exporter_pod_source_errors_total{kind="socket_missing",source="pod_resources"} 1.0' in text


def render(metrics: AttributionMetrics) -> str:
    registry = CollectorRegistry()
    registry.register(metrics)
    return generate_latest(registry).decode()


def test_view_default_is_empty() -> None:
    assert usages([gpu(0, proc(1, 1))], {}.get, AttributionView(), {}) == []


# --- MIG ------------------------------------------------------------------------------------------

MIG_1 = MigInstance(1, 0, "3g.40gb", "MIG-11111111-0000-4000-8000-000000000001")
MIG_2 = MigInstance(2, 0, "3g.40gb", "MIG-11111111-0000-4000-8000-000000000002")


def mig_gpu(index: int, *procs: ProcessSample) -> GpuSample:
    return replace(gpu(index, *procs), slow=SlowFields(mig_instances=(MIG_1, MIG_2)))


def test_a_mig_device_is_attributed_to_its_instance_not_the_card() -> None:
    # Two pods, each given one MIG device of GPU 1 by pod-resources; NVML lists their processes
    # on the card with the instance they run in.
    pods = {
        UID_A: meta("ml", "mig-a", UID_A, {"main": "a" * 64}),
        UID_B: meta("ml", "mig-b", UID_B, {"main": "b" * 64}),
    }
    pr = {
        ("ml", "mig-a"): {"main": (DeviceAssignment("nvidia.com/mig-3g.40gb", (MIG_1.uuid,)),)},
        # An old driver's name for the same kind of device.
        ("ml", "mig-b"): {"main": (DeviceAssignment("nvidia.com/mig-3g.40gb", (f"MIG-{UUIDS[1]}/2/0",)),)},
    }
    on_1 = ProcessSample(100, 3 * GIB, None, gpu_instance=1, compute_instance=0)
    on_2 = ProcessSample(200, 5 * GIB, None, gpu_instance=2, compute_instance=0)
    got = {u.ref.pod: u for u in usages_of([gpu(0), mig_gpu(1, on_1, on_2)], pods, pr)}
    a, b = got["mig-a"], got["mig-b"]
    assert (a.gpu_index, a.gpu_uuid, a.mig, a.device_uuid) == (1, UUIDS[1], MIG_1, MIG_1.uuid)
    assert (a.used_memory_bytes, a.allocated_resources, a.unallocated) == (
        3 * GIB,
        ("nvidia.com/mig-3g.40gb",),
        False,
    )
    assert (b.mig, b.used_memory_bytes, b.unallocated) == (MIG_2, 5 * GIB, False)
    assert len(got) == 2  # nothing left over on the card itself


def test_use_of_another_mig_instance_is_flagged() -> None:
    pods = {UID_A: meta("ml", "mig-a", UID_A, {"main": "a" * 64})}
    pr = {("ml", "mig-a"): {"main": (DeviceAssignment("nvidia.com/mig-3g.40gb", (MIG_1.uuid,)),)}}
    rogue = ProcessSample(100, GIB, None, gpu_instance=2, compute_instance=0)
    out = {u.mig: u for u in usages_of([mig_gpu(1, rogue)], pods, pr)}
    assert out[MIG_2].unallocated and out[MIG_2].used_memory_bytes == GIB
    assert not out[MIG_1].unallocated and out[MIG_1].used_memory_bytes == 0


def test_mig_through_the_simulated_backend() -> None:
    """The simulated backend runs MIG instances and processes in them (NVIDIA's mock NVML
    enumerates no MIG instance, so the nvml tier cannot): per-pod series name the MIG device."""
    scenario = FaultScenario.model_validate(
        {
            "mig": [{"gpu": 1, "profiles": ["3g.40gb", "3g.40gb"]}],
            "processes": [
                {"gpu": 1, "pid": 100, "used_memory_mib": 2048, "sm_share": 0.3, "gpu_instance": 2}
            ],
        }
    )
    backend = SimulatedBackend(gpus=2, scenario=scenario, clock=lambda: 1000.0)
    backend.open()
    gpus = [
        GpuSample(ident, backend.read_fast(ident.index), backend.read_slow(ident.index), HEALTHY, 1000.0)
        for ident in backend.devices()
    ]
    second = gpus[1].slow.mig_instances[1] if gpus[1].slow else None
    assert second is not None and second.gpu_instance == 2
    pods = {UID_A: meta("ml", "mig-a", UID_A, {"main": "a" * 64})}
    pr = {("ml", "mig-a"): {"main": (DeviceAssignment("nvidia.com/mig-3g.40gb", (second.uuid,)),)}}
    (u,) = usages_of(gpus, pods, pr)
    assert (u.gpu_index, u.gpu_uuid, u.device_uuid, u.used_memory_bytes) == (
        1,
        gpus[1].identity.uuid,
        second.uuid,
        2048 * MIB,
    )
    assert u.mig is not None and (u.mig.gpu_instance, u.mig.compute_instance, u.mig.profile) == (
        2,
        0,
        "3g.40gb",
    )
    snap = Snapshot("n", None, tuple(gpus), (u,), 1000.0, True, True)
    text = exposition.render(snap, profile="native").text.decode()
    assert (
        'gpumon_pod_gpu_memory_used_bytes{compute_instance="0",container="main",gpu="1",gpu_instance="2",'
        f'mig_profile="3g.40gb",namespace="ml",node="n",pod="mig-a",uuid="{second.uuid}"}} 2.147483648e+09'
    ) in text
    with pytest.raises(SimulationError, match="MIG instance 3"):
        SimulatedBackend(
            gpus=2,
            scenario=FaultScenario.model_validate(
                {
                    "mig": [{"gpu": 1, "profiles": ["3g.40gb"]}],
                    "processes": [
                        {"gpu": 1, "pid": 1, "used_memory_mib": 1, "sm_share": 0, "gpu_instance": 3}
                    ],
                }
            ),
        )


def usages_of(
    gpus: list[GpuSample],
    pods: Mapping[str, PodMeta],
    pr: Mapping[tuple[str, str], Mapping[str, tuple[DeviceAssignment, ...]]],
) -> list[PodGpuUsage]:
    view = build_view(pods, shares(pods), pr, True)
    allocations, unknown = resolve_grants(view.grants, gpus)
    assert unknown == []
    return usages(gpus, PIDS.get, view, allocations)
