"""The exporter's own pod-resources client on a real socket: against the real grpcio server
(replies larger than HTTP/2's first 64 KiB window and beyond the 16 MiB bound, a server without
the service, refusals) and against servers that break the protocol, which must cost one bounded
error each and never a hang."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from podresources_server import pod_resources, serve, short_socket_dir

from gpumon.exporter.podresources import api_pb2, h2
from gpumon.exporter.podresources.h2 import FrameType, frame
from gpumon.exporter.podresources.hpack import encode_literals
from gpumon.exporter.podresources_client import DeviceAssignment, PodResourcesClient
from gpumon.k8s.dra import NVIDIA_GPU_DRIVER

TIMEOUT = 0.5
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Errors(list[tuple[str, str]]):
    def __call__(self, source: str, kind: str) -> None:
        self.append((source, kind))


@pytest.fixture
def socket() -> Iterator[Path]:
    with short_socket_dir() as d:
        yield d / "kubelet.sock"


def client(socket: Path, errors: Errors, timeout: float = TIMEOUT) -> PodResourcesClient:
    return PodResourcesClient(
        socket,
        errors,
        lambda r: r.startswith("nvidia.com/"),
        timeout_seconds=timeout,
        dra_drivers=frozenset({NVIDIA_GPU_DRIVER}),
    )


async def poll(c: PodResourcesClient) -> None:
    # Each poll bounds itself by its timeout; this bound only turns a hang into a failure.
    async with asyncio.timeout(30):
        await c.poll()


def uuid(pod: int, gpu: int) -> str:
    return f"GPU-{pod:08x}-{gpu:04x}-4c5a-8e6f-{pod * gpu:012x}"


async def test_a_reply_larger_than_the_first_window(socket: Path) -> None:
    """110 pods (the kubelet's default maximum) of 8 GPUs and 8 DRA claim devices: 108 KiB, more
    than HTTP/2's initial 64 KiB window of the stream and of the connection, so it only arrives
    whole if the client grew both."""
    pods = [
        pod_resources(
            "ml",
            f"train-{i}",
            {
                "main": {"nvidia.com/gpu": [uuid(i, g) for g in range(8)]},
                "sidecar": {"example.com/nic": ["eth0"]},
            },
            {
                "main": [
                    api_pb2.DynamicResource(
                        claim_name=f"train-{i}-gpu",
                        claim_namespace="ml",
                        claim_resources=[
                            api_pb2.ClaimResource(
                                cdi_devices=[
                                    api_pb2.CDIDevice(name=f"k8s.{NVIDIA_GPU_DRIVER}/claim={i}-gpu-{g}")
                                ],
                                driver_name=NVIDIA_GPU_DRIVER,
                                pool_name="node-a",
                                device_name=f"gpu-{g}",
                            )
                            for g in range(8)
                        ],
                    )
                ]
            },
        )
        for i in range(110)
    ]
    size = api_pb2.ListPodResourcesResponse(pod_resources=pods).ByteSize()
    assert size > 65_535
    errors = Errors()
    c = client(socket, errors, timeout=10)
    with serve(socket) as kubelet:
        kubelet.pods = pods
        await poll(c)
    assert (errors, c.fresh) == ([], True)
    assert c.view is not None and len(c.view) == 110
    main = c.view[("ml", "train-109")]["main"]
    assert main[0] == DeviceAssignment("nvidia.com/gpu", tuple(uuid(109, g) for g in range(8)))
    assert [a.device.device for a in main[1:]] == [f"gpu-{g}" for g in range(8)]  # type: ignore[union-attr]
    assert c.view[("ml", "train-0")]["sidecar"] == ()


async def test_a_reply_beyond_16_mib_is_refused(socket: Path) -> None:
    pods = [api_pb2.PodResources(name=f"p{i}-" + "x" * 9000, namespace="ml") for i in range(1900)]
    assert api_pb2.ListPodResourcesResponse(pod_resources=pods).ByteSize() > 16 << 20
    errors = Errors()
    c = client(socket, errors, timeout=20)  # the server takes a while to serialize 17 MB
    with serve(socket) as kubelet:
        kubelet.pods = pods
        await poll(c)
        assert errors == [("pod_resources", "resource_exhausted")]
        kubelet.pods = pods[:3]  # the connection refused was closed: the next poll is whole
        await poll(c)
    assert c.fresh and c.view is not None and len(c.view) == 3


@pytest.mark.parametrize(
    ("code", "kind"),
    [(grpc.StatusCode.UNIMPLEMENTED, "unimplemented"), (grpc.StatusCode.PERMISSION_DENIED, "forbidden")],
)
async def test_refusals_are_counted_by_kind(socket: Path, code: grpc.StatusCode, kind: str) -> None:
    errors = Errors()
    c = client(socket, errors)
    with serve(socket) as kubelet:
        kubelet.fail_with = code
        await poll(c)
    assert (errors, c.fresh) == ([("pod_resources", kind)], False)


async def test_a_server_without_the_service_is_unimplemented(socket: Path) -> None:
    """A gRPC server that does not serve PodResourcesLister (a kubelet older than v1)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        errors = Errors()
        await poll(client(socket, errors))
    finally:
        server.stop(None)
    assert errors == [("pod_resources", "unimplemented")]


@contextlib.asynccontextmanager
async def raw_server(socket: Path, handler: Handler) -> AsyncIterator[None]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client hung up: what several of these tests expect
        finally:
            writer.close()

    server = await asyncio.start_unix_server(handle, path=str(socket))
    try:
        yield
    finally:
        server.close()


SETTINGS = frame(FrameType.SETTINGS, 0, 0)
OK = frame(
    FrameType.HEADERS,
    h2.END_HEADERS,
    1,
    encode_literals([(b":status", b"200"), (b"content-type", b"application/grpc")]),
)


def scripted(wire: bytes) -> Handler:
    """Reads the client's opening, writes ``wire``, then closes."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(len(h2.PREFACE))
        writer.write(wire)
        await writer.drain()

    return handler


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(60)  # accepts, reads nothing, answers nothing


async def endless_pings(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(SETTINGS)
    while True:  # and never reads the acknowledgements
        writer.write(frame(FrameType.PING, 0, 0, b"pingping") * 1000)
        await writer.drain()


async def endless_continuation(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(SETTINGS + frame(FrameType.HEADERS, 0, 1, b"\x82"))
    while True:
        writer.write(frame(FrameType.CONTINUATION, 0, 1, b"\x82" * 1000))
        await writer.drain()


@pytest.mark.parametrize(
    ("handler", "kind"),
    [
        (scripted(SETTINGS + OK + frame(FrameType.DATA, 0, 1, b"\x00\x00\x00\x01\x00abc")), "unavailable"),
        (scripted(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"), "internal"),
        (scripted(SETTINGS + (1 << 24 - 1).to_bytes(3, "big") + b"\x00\x00\x00\x00\x00\x01"), "internal"),
        (scripted(SETTINGS + frame(FrameType.GOAWAY, 0, 0, bytes(8))), "unavailable"),
        (endless_continuation, "resource_exhausted"),
        (silent, "timeout"),
        (endless_pings, "timeout"),
    ],
    ids=[
        "closed-mid-message",
        "http1",
        "oversized-frame",
        "goaway",
        "endless-headers",
        "silent",
        "pings-never-reading",
    ],
)
async def test_a_broken_server_costs_one_bounded_error(socket: Path, handler: Handler, kind: str) -> None:
    errors = Errors()
    c = client(socket, errors)
    loop = asyncio.get_running_loop()
    async with raw_server(socket, handler):
        started = loop.time()
        await poll(c)
        took = loop.time() - started
    assert (errors, c.fresh, c.view) == ([("pod_resources", kind)], False, None)
    assert took < TIMEOUT + 2
