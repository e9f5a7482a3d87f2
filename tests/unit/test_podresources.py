"""The pod-resources client against a gRPC server speaking the real kubelet v1 proto."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from podresources_server import pod_resources, serve, short_socket_dir

from gpumon.config import PodsConfig
from gpumon.exporter.attribution import watched_resource
from gpumon.exporter.podresources import api_pb2, api_pb2_grpc
from gpumon.exporter.podresources_client import DeviceAssignment, PodResourcesClient, view_from_response
from gpumon.k8s.dra import NVIDIA_GPU_DRIVER, ClaimDevice, ClaimRef, DeviceRef

GPU0 = "GPU-7c1f2a9e-0d3b-4c5a-8e6f-1a2b3c4d5e6f"
MIG = "MIG-3a2b1c0d-9e8f-4a7b-b6c5-d4e3f2a1b0c9"


class Errors(list[tuple[str, str]]):
    def __call__(self, source: str, kind: str) -> None:
        self.append((source, kind))


@contextlib.contextmanager
def stale_file(path: Path) -> Iterator[None]:
    path.touch()
    try:
        yield
    finally:
        path.unlink()


@pytest.fixture
def socket() -> Iterator[Path]:
    with short_socket_dir() as d:
        yield d / "kubelet.sock"


@pytest.fixture
def client(socket: Path) -> tuple[PodResourcesClient, Errors]:
    errors = Errors()
    return PodResourcesClient(socket, errors, watched_resource(PodsConfig()), timeout_seconds=0.5), errors


def sample_pods() -> list[api_pb2.PodResources]:
    return [
        pod_resources(
            "ml",
            "trainer",
            {"main": {"nvidia.com/gpu": [GPU0], "example.com/nic": ["eth9"]}, "logger": {}},
        ),
        pod_resources("ml", "small", {"main": {"nvidia.com/mig-1g.10gb": [MIG]}}),
        pod_resources("web", "frontend", {"nginx": {}}),
    ]


async def test_list_gives_every_pod_and_only_watched_resources(
    socket: Path, client: tuple[PodResourcesClient, Errors]
) -> None:
    c, errors = client
    with serve(socket) as kubelet:
        kubelet.pods = sample_pods()
        await c.poll()
    assert c.fresh
    assert errors == []
    assert c.view == {
        ("ml", "trainer"): {"main": (DeviceAssignment("nvidia.com/gpu", (GPU0,)),), "logger": ()},
        ("ml", "small"): {"main": (DeviceAssignment("nvidia.com/mig-1g.10gb", (MIG,)),)},
        ("web", "frontend"): {"nginx": ()},
    }


def test_dra_claims_of_gpu_drivers_each_device_once() -> None:
    """A container's DynamicResources as the kubelet lists them: claim resources of the GPU
    driver become ClaimDevices, one per device however many shares of it the claim holds;
    other drivers' devices (a NIC) are left out, like unwatched resources."""

    def resource(driver: str, device: str, share: str | None = None) -> api_pb2.ClaimResource:
        return api_pb2.ClaimResource(
            cdi_devices=[api_pb2.CDIDevice(name=f"k8s.{driver}/claim=x-{device}")],
            driver_name=driver,
            pool_name="node-a",
            device_name=device,
            share_id=share,
        )

    container = api_pb2.ContainerResources(
        name="main",
        devices=[api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[GPU0])],
        dynamic_resources=[
            api_pb2.DynamicResource(
                claim_name="train-0-gpu-x7k2p",
                claim_namespace="ml",
                claim_resources=[
                    resource(NVIDIA_GPU_DRIVER, "gpu-1", "a1b2"),
                    resource(NVIDIA_GPU_DRIVER, "gpu-1", "c3d4"),
                    resource("nic.example.com", "eth1"),
                    resource(NVIDIA_GPU_DRIVER, "gpu-2-mig-9-4-4"),
                ],
            ),
        ],
    )
    response = api_pb2.ListPodResourcesResponse(
        pod_resources=[api_pb2.PodResources(name="train-0", namespace="ml", containers=[container])]
    )
    claim = ClaimRef("ml", "train-0-gpu-x7k2p")
    watched = watched_resource(PodsConfig())
    assert view_from_response(response.SerializeToString(), watched, frozenset({NVIDIA_GPU_DRIVER})) == {
        ("ml", "train-0"): {
            "main": (
                DeviceAssignment("nvidia.com/gpu", (GPU0,)),
                ClaimDevice(claim, DeviceRef(NVIDIA_GPU_DRIVER, "node-a", "gpu-1")),
                ClaimDevice(claim, DeviceRef(NVIDIA_GPU_DRIVER, "node-a", "gpu-2-mig-9-4-4")),
            )
        }
    }
    # DRA off (no drivers): the device plugin's devices only.
    assert view_from_response(response.SerializeToString(), watched) == {
        ("ml", "train-0"): {"main": (DeviceAssignment("nvidia.com/gpu", (GPU0,)),)}
    }


async def test_fixture_answers_get_by_name(socket: Path) -> None:
    with serve(socket) as kubelet:
        kubelet.pods = sample_pods()
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = api_pb2_grpc.PodResourcesListerStub(channel)
            got = await stub.Get(
                api_pb2.GetPodResourcesRequest(pod_name="small", pod_namespace="ml"), timeout=5
            )
            assert got.pod_resources.containers[0].devices[0].device_ids == [MIG]
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Get(api_pb2.GetPodResourcesRequest(pod_name="nope", pod_namespace="ml"), timeout=5)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND


async def test_missing_socket_is_counted(client: tuple[PodResourcesClient, Errors]) -> None:
    c, errors = client
    await c.poll()
    assert (c.view, c.fresh) == (None, False)
    assert errors == [("pod_resources", "socket_missing")]


async def test_kubelet_restart_keeps_last_view_then_recovers(
    socket: Path, client: tuple[PodResourcesClient, Errors]
) -> None:
    c, errors = client
    with serve(socket) as kubelet:
        kubelet.pods = sample_pods()
        await c.poll()
    before = c.view
    await c.poll()  # socket removed with the server
    assert (c.view, c.fresh) == (before, False)
    assert errors == [("pod_resources", "socket_missing")]

    # A stale socket file with nobody listening: the call itself fails.
    with stale_file(socket):
        await c.poll()
    assert (c.view, c.fresh) == (before, False)
    assert errors[-1] == ("pod_resources", "unavailable")

    with serve(socket) as kubelet:
        kubelet.pods = sample_pods()[:1]
        deadline = asyncio.get_running_loop().time() + 30
        while not c.fresh and asyncio.get_running_loop().time() < deadline:
            await c.poll()
            if not c.fresh:
                await asyncio.sleep(0.2)  # waiting for the channel to reconnect, not for a result
        assert c.fresh
        assert c.view is not None and list(c.view) == [("ml", "trainer")]


async def test_refusal_is_counted_by_kind(socket: Path, client: tuple[PodResourcesClient, Errors]) -> None:
    c, errors = client
    with serve(socket) as kubelet:
        kubelet.pods = sample_pods()
        await c.poll()
        kubelet.fail_with = grpc.StatusCode.PERMISSION_DENIED
        await c.poll()
    assert not c.fresh and c.view is not None
    assert errors == [("pod_resources", "forbidden")]


async def test_slow_kubelet_times_out(socket: Path, client: tuple[PodResourcesClient, Errors]) -> None:
    c, errors = client
    with serve(socket) as kubelet:
        kubelet.hold = threading.Event()
        await c.poll()
        kubelet.hold.set()
    assert not c.fresh
    assert errors == [("pod_resources", "timeout")]


def test_watched_resources_follow_config() -> None:
    watched = watched_resource(PodsConfig(resource_names=("nvidia.com/gpu", "example.com/gpu")))
    assert [
        r for r in ("nvidia.com/gpu", "example.com/gpu", "nvidia.com/mig-2g.20gb", "cpu") if watched(r)
    ] == [
        "nvidia.com/gpu",
        "example.com/gpu",
        "nvidia.com/mig-2g.20gb",
    ]
