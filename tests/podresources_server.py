"""A kubelet pod-resources endpoint for tests: a real gRPC server speaking the v1 proto on a
unix socket, serving List and Get from whatever pods the test sets."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent import futures
from pathlib import Path

import grpc

from gpumon.exporter.podresources import api_pb2, api_pb2_grpc

Devices = Mapping[str, Sequence[str]]
"""resource name -> device IDs"""


def pod_resources(namespace: str, name: str, containers: Mapping[str, Devices]) -> api_pb2.PodResources:
    return api_pb2.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            api_pb2.ContainerResources(
                name=cname,
                devices=[
                    api_pb2.ContainerDevices(resource_name=r, device_ids=list(ids))
                    for r, ids in devices.items()
                ],
                cpu_ids=[0, 1],
            )
            for cname, devices in containers.items()
        ],
    )


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.pods: list[api_pb2.PodResources] = []
        self.fail_with: grpc.StatusCode | None = None
        # When set, List waits for it before answering (to make calls time out).
        self.hold: threading.Event | None = None
        self.calls = 0

    def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        if self.hold is not None:
            self.hold.wait(30)
        if self.fail_with is not None:
            context.abort(self.fail_with, "refused by the test")
        return api_pb2.ListPodResourcesResponse(pod_resources=list(self.pods))

    def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        for p in self.pods:
            if (p.namespace, p.name) == (request.pod_namespace, request.pod_name):
                return api_pb2.GetPodResourcesResponse(pod_resources=p)
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found")
        raise AssertionError("unreachable")


@contextlib.contextmanager
def serve(socket: Path, kubelet: FakeKubelet | None = None) -> Iterator[FakeKubelet]:
    """Serve ``kubelet`` on ``socket`` until the block exits; the socket is removed after."""
    kubelet = kubelet or FakeKubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield kubelet
    finally:
        if kubelet.hold is not None:
            kubelet.hold.set()
        server.stop(grace=None).wait()
        socket.unlink(missing_ok=True)


@contextlib.contextmanager
def short_socket_dir() -> Iterator[Path]:
    """A directory with a short path: unix socket paths are limited to 107 bytes."""
    d = Path(tempfile.mkdtemp(prefix="gpumon-pr-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
