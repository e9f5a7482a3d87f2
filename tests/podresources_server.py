"""A kubelet pod-resources endpoint for tests: gpumon's own (the real v1 proto on a unix
socket, :mod:`gpumon.devcluster.podresources_server`) plus knobs to make it fail or hang."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc

from gpumon.devcluster import podresources_server
from gpumon.devcluster.podresources_server import Devices, pod_resources  # noqa: F401 - re-exported
from gpumon.exporter.podresources import api_pb2


class FakeKubelet(podresources_server.PodResourcesFixture):
    def __init__(self) -> None:
        super().__init__()
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
        return super().List(request, context)


@contextlib.contextmanager
def serve(socket: Path, kubelet: FakeKubelet | None = None) -> Iterator[FakeKubelet]:
    """Serve ``kubelet`` on ``socket`` until the block exits; the socket is removed after."""
    kubelet = kubelet or FakeKubelet()
    with podresources_server.serve(socket, kubelet):
        try:
            yield kubelet
        finally:
            if kubelet.hold is not None:
                kubelet.hold.set()  # a held List must return before the server can stop


@contextlib.contextmanager
def short_socket_dir() -> Iterator[Path]:
    """A directory with a short path: unix socket paths are limited to 107 bytes."""
    d = Path(tempfile.mkdtemp(prefix="gpumon-pr-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
