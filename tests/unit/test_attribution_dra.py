"""DRA attribution: pod-resources claim devices resolved to GPUs and MIG devices through the node's
ResourceSlices (pure), the series and labels they give, and the shell that watches the slices only
once a claim shows up (against gpumon's own API client and a gRPC pod-resources server)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import podresources_server
import pytest
from aiohttp import web
from api_stand_in import until
from metrics_text import parse, select
from podresources_server import FakeKubelet, short_socket_dir
from test_attribution import MIB, UUIDS, gpu, meta, pod_source, proc, render, shares

from gpumon.config import PodsConfig
from gpumon.exporter import exposition
from gpumon.exporter.attribution import PodAttribution, build_view, resolve_grants, usages, watched_resource
from gpumon.exporter.attribution_metrics import AttributionMetrics, SourceState
from gpumon.exporter.cgroups import ContainerKey
from gpumon.exporter.dra_slices import PoolSlice, ResourceSliceWatch, device_index, project_slice
from gpumon.exporter.pod_metadata import PodMeta
from gpumon.exporter.podresources import api_pb2
from gpumon.exporter.podresources_client import Assignment, DeviceAssignment, PodKey, PodResourcesClient
from gpumon.gpu.model import GpuSample, MemoryInfo, MigInstance, PodGpuUsage, PodRef, SlowFields, Snapshot
from gpumon.k8s.dra import (
    NVIDIA_GPU_DRIVER,
    RESOURCE_SLICES_PATH,
    ClaimDevice,
    ClaimRef,
    DeviceRef,
    slice_devices,
)
from gpumon.kube.client import KubeClient

NODE = "node-a"
DRIVERS = frozenset({NVIDIA_GPU_DRIVER})
MIG_A = MigInstance(1, 0, "3g.40gb", "MIG-aaaaaaaa-0000-4000-8000-000000000001")
MIG_B = MigInstance(2, 0, "3g.40gb", "MIG-aaaaaaaa-0000-4000-8000-000000000002")
UID_T, UID_U, UID_V = (f"00000000-0000-4000-9000-{n:012d}" for n in range(1, 4))
PIDS = {
    100: ("t" * 64, UID_T),
    200: ("u" * 64, UID_U),
    300: ("v" * 64, UID_V),
}


def gpu_device(minor: int, uuid: str) -> dict[str, Any]:
    """A whole GPU as NVIDIA's kubelet plugin publishes it (deviceinfo.go, GetDevice)."""
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": uuid},
            "productName": {"string": "NVIDIA A100-SXM4-80GB"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Ampere"},
            "cudaComputeCapability": {"version": "8.0.0"},
            "driverVersion": {"version": "570.124.6"},
            "cudaDriverVersion": {"version": "12.8.0"},
            "pcieBusID": {"string": f"0000:0{minor}:00.0"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }


def mig_device(minor: int, parent: str, mig: MigInstance, start: int) -> dict[str, Any]:
    """A MIG device as NVIDIA's kubelet plugin publishes it."""
    return {
        "name": f"gpu-{minor}-mig-9-{start}-4",
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": mig.uuid},
            "parentUUID": {"string": parent},
            "profile": {"string": mig.profile},
            "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        },
        "capacity": {"memory": {"value": "40Gi"}, "multiprocessors": {"value": "42"}},
    }


def resource_slice(
    devices: list[dict[str, Any]],
    *,
    uid: str = "slice-1",
    generation: int = 1,
    driver: str = NVIDIA_GPU_DRIVER,
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-{driver}-x1", "uid": uid, "resourceVersion": "5"},
        "spec": {
            "driver": driver,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


# GPU 0 whole, GPU 1 in MIG mode with two 3g.40gb devices, as the slices and NVML both see them.
SLICE = resource_slice(
    [
        gpu_device(0, UUIDS[0]),
        mig_device(1, UUIDS[1], MIG_A, 0),
        mig_device(1, UUIDS[1], MIG_B, 4),
        gpu_device(2, UUIDS[2]),
    ]
)
INDEX = device_index([PoolSlice(NVIDIA_GPU_DRIVER, NODE, 1, slice_devices(SLICE))])


def ref_of(name: str) -> DeviceRef:
    return DeviceRef(NVIDIA_GPU_DRIVER, NODE, name)


def claim(name: str, device: str, ns: str = "ml") -> ClaimDevice:
    return ClaimDevice(ClaimRef(ns, name), ref_of(device))


def gpus(*, peer: bool = False) -> list[GpuSample]:
    """train-0's process on GPU 0 (and peer-0's, with ``peer``); mig-0's in MIG_B on GPU 1."""
    in_mig_b = replace(proc(200, 5000, 0.3), gpu_instance=MIG_B.gpu_instance, compute_instance=0)
    g1 = replace(gpu(1, in_mig_b, util=0.3), slow=SlowFields(mig_instances=(MIG_A, MIG_B)))
    g0 = gpu(0, proc(100, 7000, 0.4), *([proc(300, 1000, 0.2)] if peer else []), util=0.5)
    return [g0, g1, gpu(2), gpu(3)]


TRAIN = meta("ml", "train-0", UID_T, {"main": "t" * 64})
MIG_POD = meta("ml", "mig-0", UID_U, {"main": "u" * 64})
PEER = meta("ml", "peer-0", UID_V, {"main": "v" * 64})
PODS = {p.uid: p for p in (TRAIN, MIG_POD, PEER)}


def ref(p: PodMeta) -> PodRef:
    return PodRef(p.namespace, p.name, "main", p.uid)


def attribute(
    pr: Mapping[PodKey, Mapping[str, tuple[Assignment, ...]]],
    index: Mapping[DeviceRef, Any] = INDEX,
    samples: list[GpuSample] | None = None,
) -> tuple[dict[tuple[str, int], PodGpuUsage], Any]:
    samples = samples if samples is not None else gpus()
    view = build_view(PODS, shares(PODS), pr, True, index)
    allocations, unknown = resolve_grants(view.grants, samples)
    assert unknown == []
    lookup = {pid: ContainerKey(uid, cid) for pid, (cid, uid) in PIDS.items()}.get
    out = usages(samples, lookup, view, allocations)
    return {(u.ref.pod, u.gpu_index): u for u in out}, view


def test_a_whole_gpu_and_a_mig_device_through_claims() -> None:
    train, mig = claim("train-0-gpu", "gpu-0"), claim("mig-0-gpu", "gpu-1-mig-9-4-4")
    got, view = attribute({("ml", "train-0"): {"main": (train,)}, ("ml", "mig-0"): {"main": (mig,)}})
    t = got[("train-0", 0)]
    assert (t.gpu_uuid, t.mig, t.used_memory_bytes) == (UUIDS[0], None, 7000 * MIB)
    assert t.allocated_resources == (NVIDIA_GPU_DRIVER,) and t.claims == (train,)
    assert not t.unallocated
    # The MIG device: its card is the slice's parentUUID, its labels NVML's instance (as #15
    # gives device-plugin MIG pods), whatever instance the process runs in.
    m = got[("mig-0", 1)]
    assert (m.gpu_uuid, m.mig, m.device_uuid) == (UUIDS[1], MIG_B, MIG_B.uuid)
    assert (m.used_memory_bytes, m.claims) == (5000 * MIB, (mig,))
    assert view.unresolved == frozenset()
    assert ("ml", "train-0") in view.authoritative


def test_a_mig_device_nvml_does_not_list_counts_for_its_card() -> None:
    mig = claim("mig-0-gpu", "gpu-1-mig-9-4-4")
    samples = gpus()
    samples[1] = replace(samples[1], slow=SlowFields(mig_instances=(MIG_A,)))  # MIG_B not (yet) listed
    got, _ = attribute({("ml", "mig-0"): {"main": (mig,)}}, samples=samples)
    m = got[("mig-0", 1)]
    assert (m.gpu_uuid, m.mig, m.claims, m.used_memory_bytes) == (UUIDS[1], None, (mig,), 5000 * MIB)


def test_a_shared_claim_counts_each_pods_own_use_once() -> None:
    # One claim, two pods (a claim named directly by both): the device is each pod's; the card's
    # memory and SM use are split by process, never counted twice.
    shared = claim("shared-gpu", "gpu-0")
    got, _ = attribute(
        {("ml", "train-0"): {"main": (shared,)}, ("ml", "peer-0"): {"main": (shared,)}},
        samples=gpus(peer=True),
    )
    t, p = got[("train-0", 0)], got[("peer-0", 0)]
    assert (t.used_memory_bytes, p.used_memory_bytes) == (7000 * MIB, 1000 * MIB)
    assert t.used_memory_bytes + p.used_memory_bytes == 8000 * MIB  # the card's processes, once
    assert (t.utilization_ratio or 0) + (p.utilization_ratio or 0) <= 0.5 + 1e-9  # the card's own
    assert t.claims == p.claims == (shared,)


def test_both_mechanisms_on_one_device_are_one_series_and_on_two_devices_two() -> None:
    same = claim("train-0-gpu", "gpu-0")
    both = {
        ("ml", "train-0"): {"main": (DeviceAssignment("nvidia.com/gpu", (UUIDS[0],)), same, same)},
    }
    got, _ = attribute(both)
    assert [k for k in got if k[0] == "train-0"] == [("train-0", 0)]
    u = got[("train-0", 0)]
    assert u.allocated_resources == (NVIDIA_GPU_DRIVER, "nvidia.com/gpu") and u.claims == (same,)
    assert u.used_memory_bytes == 7000 * MIB

    other = {
        ("ml", "train-0"): {
            "main": (DeviceAssignment("nvidia.com/gpu", (UUIDS[2],)), claim("train-0-gpu", "gpu-0"))
        },
    }
    got, _ = attribute(other)
    assert {k: u.allocated_resources for k, u in got.items() if k[0] == "train-0"} == {
        ("train-0", 0): (NVIDIA_GPU_DRIVER,),
        ("train-0", 2): ("nvidia.com/gpu",),
    }


def test_a_device_no_slice_names_is_unresolved_not_guessed_until_the_slice_arrives() -> None:
    late = claim("train-0-gpu", "gpu-3")
    pr = {("ml", "train-0"): {"main": (late,)}}
    got, view = attribute(pr)
    # No allocation; the process on GPU 0 is still the pod's, and not flagged as use of a GPU
    # the pod was not given: its allocations are not known in full.
    assert view.unresolved == {(ref(TRAIN), late)}
    assert ("ml", "train-0") not in view.authoritative
    t = got[("train-0", 0)]
    assert (t.allocated_resources, t.claims, t.unallocated) == ((), (), False)

    index = dict(INDEX)
    index[ref_of("gpu-3")] = slice_devices(resource_slice([gpu_device(3, UUIDS[3])]))[0]
    got, view = attribute(pr, index)
    assert view.unresolved == frozenset()
    assert got[("train-0", 3)].claims == (late,)
    assert got[("train-0", 0)].unallocated  # now known in full: GPU 0 was not given


def test_the_newest_generation_of_a_pool_and_only_gpu_drivers() -> None:
    old = project_slice(resource_slice([gpu_device(0, "GPU-old")], uid="s0", generation=1), DRIVERS)
    new = project_slice(resource_slice([gpu_device(0, UUIDS[0])], uid="s1", generation=2), DRIVERS)
    assert old is not None and new is not None
    assert {r: d.uuid for r, d in device_index([old, new]).items()} == {ref_of("gpu-0"): UUIDS[0]}
    assert project_slice(resource_slice([], driver="nic.example.com"), DRIVERS) is None
    broken = resource_slice([])
    del broken["spec"]["pool"]["generation"]
    with pytest.raises(KeyError):
        project_slice(broken, DRIVERS)


def snapshot(*pods: PodGpuUsage) -> Snapshot:
    """The GPUs of :func:`gpus`, their MIG instances with memory (for their dcgm series)."""
    memory = MemoryInfo(40 << 30, 5000 * MIB, (40 << 30) - 5000 * MIB)
    samples = gpus()
    samples[1] = replace(
        samples[1], slow=SlowFields(mig_instances=tuple(replace(m, memory=memory) for m in (MIG_A, MIG_B)))
    )
    return Snapshot("node-a", None, tuple(samples), pods, 0.0, True, True)


def test_claim_info_series_and_dcgm_dra_labels() -> None:
    train, mig = claim("train-0-gpu", "gpu-0"), claim("mig-0-gpu", "gpu-1-mig-9-4-4")
    got, _ = attribute({("ml", "train-0"): {"main": (train,)}, ("ml", "mig-0"): {"main": (mig,)}})
    series = parse(exposition.render(snapshot(*got.values()), profile="both").text.decode())
    pod = {"node": "node-a", "namespace": "ml", "container": "main"}
    assert select(series, "gpumon_pod_dra_claim_info") == {
        frozenset(
            {
                **pod,
                "pod": "train-0",
                "gpu": "0",
                "uuid": UUIDS[0],
                "claim_namespace": "ml",
                "claim_name": "train-0-gpu",
                "driver": NVIDIA_GPU_DRIVER,
                "pool": NODE,
                "device": "gpu-0",
            }.items()
        ): 1.0,
        frozenset(
            {
                **pod,
                "pod": "mig-0",
                "gpu": "1",
                "uuid": MIG_B.uuid,
                "gpu_instance": "2",
                "compute_instance": "0",
                "mig_profile": "3g.40gb",
                "claim_namespace": "ml",
                "claim_name": "mig-0-gpu",
                "driver": NVIDIA_GPU_DRIVER,
                "pool": NODE,
                "device": "gpu-1-mig-9-4-4",
            }.items()
        ): 1.0,
    }
    # dcgm-exporter's DRA labels on the held device's series: the card for a whole GPU...
    card = select(series, "DCGM_FI_DEV_GPU_UTIL", UUID=UUIDS[0])
    assert [dict(labels) for labels in card] == [
        {
            "gpu": "0",
            "UUID": UUIDS[0],
            "pci_bus_id": "0000:00:00.0",
            "device": "nvidia0",
            "modelName": "A100-SXM4-80GB",
            "Hostname": "node-a",
            "pod": "train-0",
            "namespace": "ml",
            "container": "main",
            "dra_claim_name": "train-0-gpu",
            "dra_claim_namespace": "ml",
            "dra_driver_name": NVIDIA_GPU_DRIVER,
            "dra_pool_name": NODE,
            "dra_device_name": "gpu-0",
        }
    ]
    # ... and the MIG instance's for a MIG device (its card keeps no pod labels).
    (instance,) = select(series, "DCGM_FI_DEV_FB_USED", UUID=UUIDS[1], GPU_I_ID="2")
    assert {k: v for k, v in instance if k.startswith(("dra_", "pod"))} == {
        "pod": "mig-0",
        "dra_claim_name": "mig-0-gpu",
        "dra_claim_namespace": "ml",
        "dra_driver_name": NVIDIA_GPU_DRIVER,
        "dra_pool_name": NODE,
        "dra_device_name": "gpu-1-mig-9-4-4",
        "dra_mig_profile": "3g.40gb",
        "dra_mig_device_uuid": MIG_B.uuid,
    }
    (parent,) = select(series, "DCGM_FI_DEV_GPU_UTIL", UUID=UUIDS[1])
    assert not any(k.startswith(("dra_", "pod")) for k, _ in parent)


def test_no_dra_labels_where_one_series_cannot_name_the_claim() -> None:
    # Two claims give the container the same GPU: the dcgm series keeps its pod labels only.
    two = (claim("a", "gpu-0"), claim("b", "gpu-0"))
    got, _ = attribute({("ml", "train-0"): {"main": two}})
    series = parse(exposition.render(snapshot(*got.values()), profile="dcgm").text.decode())
    (card,) = select(series, "DCGM_FI_DEV_GPU_UTIL", UUID=UUIDS[0])
    assert ("pod", "train-0") in card and not any(k.startswith("dra_") for k, _ in card)


# --- the shell: the slice watch starts with the first claim -------------------------------------


class SliceApi:
    """GET /apis/resource.k8s.io/v1/resourceslices: a list, then a watch that sends queued events."""

    def __init__(self, *slices: dict[str, Any], status: int = 200) -> None:
        self.slices = list(slices)
        self.status = status
        self.requests: list[dict[str, str]] = []
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(dict(request.query))
        if self.status != 200:
            return web.json_response({"kind": "Status", "code": self.status}, status=self.status)
        if request.query.get("watch") != "true":
            return web.json_response(
                {"kind": "ResourceSliceList", "metadata": {"resourceVersion": "10"}, "items": self.slices}
            )
        resp = web.StreamResponse()
        await resp.prepare(request)
        while True:
            event = await self.events.get()
            await resp.write(json.dumps(event).encode() + b"\n")


@pytest.fixture
def kubelet() -> Iterator[tuple[FakeKubelet, Path]]:
    with short_socket_dir() as d, podresources_server.serve(d / "kubelet.sock") as k:
        yield k, d / "kubelet.sock"


def claim_pod(name: str, claim_name: str, device: str) -> api_pb2.PodResources:
    return api_pb2.PodResources(
        name=name,
        namespace="ml",
        containers=[
            api_pb2.ContainerResources(
                name="main",
                dynamic_resources=[
                    api_pb2.DynamicResource(
                        claim_name=claim_name,
                        claim_namespace="ml",
                        claim_resources=[
                            api_pb2.ClaimResource(
                                driver_name=NVIDIA_GPU_DRIVER, pool_name=NODE, device_name=device
                            )
                        ],
                    )
                ],
            )
        ],
    )


async def quick(seconds: float) -> None:
    await asyncio.sleep(min(seconds, 0.05))


def attributor_for(
    kubelet: tuple[FakeKubelet, Path], client: KubeClient, metrics: AttributionMetrics
) -> tuple[PodAttribution, ResourceSliceWatch]:
    config = PodsConfig(pod_resources_socket=kubelet[1])
    pr = PodResourcesClient(
        kubelet[1], metrics.error, watched_resource(config), timeout_seconds=5, dra_drivers=DRIVERS
    )
    slices = ResourceSliceWatch(NODE, DRIVERS, metrics.error, sleep=quick)
    attributor = PodAttribution(
        config,
        metrics,
        pod_resources=pr,
        pods=pod_source(TRAIN),
        processes=None,
        call_timeout_seconds=5,
        initial_states={},
        pods_api=client,
        slices=slices,
    )
    return attributor, slices


async def test_slices_are_watched_from_the_first_claim_and_late_devices_resolve(
    kubelet: tuple[FakeKubelet, Path], api_stand_in: Any
) -> None:
    api = SliceApi(resource_slice([gpu_device(0, UUIDS[0])]))
    metrics = AttributionMetrics()
    attributor, slices = attributor_for(kubelet, await api_stand_in(api, RESOURCE_SLICES_PATH), metrics)
    async with attributor.running():
        await attributor.refresh()  # no DRA pod on the node: no slice is ever asked for
        await asyncio.sleep(0.1)
        assert api.requests == [] and "dra" not in metrics.states

        kubelet[0].pods = [claim_pod("train-0", "train-0-gpu", "gpu-2")]
        await attributor.refresh()
        await until(lambda: slices.view.synced.is_set())
        assert api.requests[0] == {"fieldSelector": f"spec.nodeName={NODE}", "limit": "500"}
        await attributor.refresh()
        assert attributor.attribute(gpus()) == ()  # gpu-2 is in no slice yet
        assert metrics.dra_unresolved == 1
        # Another pod comes: the view is rebuilt, the same device is not counted again.
        kubelet[0].pods = [*kubelet[0].pods, claim_pod("peer-0", "peer-0-gpu", "gpu-0")]
        await attributor.refresh()
        assert metrics.errors() == {("dra", "unknown_device"): 1}  # once, not per rebuild
        assert metrics.states["dra"] is SourceState.UP

        # The driver publishes gpu-2: resolved from the next refresh on.
        api.events.put_nowait(
            {"type": "ADDED", "object": resource_slice([gpu_device(2, UUIDS[2])], uid="slice-2")}
        )
        await until(lambda: ref_of("gpu-2") in slices.index)
        await attributor.refresh()
        series = attributor.attribute(gpus())
        assert sorted((u.ref.pod, u.gpu_uuid, u.claims) for u in series) == [
            ("peer-0", UUIDS[0], (claim("peer-0-gpu", "gpu-0"),)),
            ("train-0", UUIDS[2], (claim("train-0-gpu", "gpu-2"),)),
        ]
        assert metrics.dra_unresolved == 0
        assert "gpumon_exporter_dra_unresolved_devices 0.0" in render(metrics)


async def test_an_api_without_resource_slices_is_unsupported_and_device_plugins_unaffected(
    kubelet: tuple[FakeKubelet, Path], api_stand_in: Any
) -> None:
    api = SliceApi(status=404)
    metrics = AttributionMetrics()
    attributor, slices = attributor_for(kubelet, await api_stand_in(api, RESOURCE_SLICES_PATH), metrics)
    plugin = api_pb2.PodResources(
        name="train-0",
        namespace="ml",
        containers=[
            api_pb2.ContainerResources(
                name="main",
                devices=[api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[UUIDS[0]])],
                dynamic_resources=claim_pod("x", "train-0-gpu", "gpu-2").containers[0].dynamic_resources,
            )
        ],
    )
    async with attributor.running():
        kubelet[0].pods = [plugin]
        await attributor.refresh()
        await until(lambda: slices.view.informer.failure == "not_found")
        await attributor.refresh()
        assert metrics.states["dra"] is SourceState.UNSUPPORTED
        assert metrics.errors()[("dra", "not_found")] >= 1
        assert ("dra", "unknown_device") not in metrics.errors()  # never listed: not judged
        series = attributor.attribute(gpus())
        assert [(u.ref.pod, u.gpu_index, u.allocated_resources) for u in series] == [
            ("train-0", 0, ("nvidia.com/gpu",))
        ]
