"""The kubelet pod-resources API (v1 ``PodResourcesLister.List``) over its unix socket.

Polled on the slow cadence and never on a scrape. A failed poll is counted (``pod_resources``
errors by kind) and leaves the last good view in place; it is logged once per outage.

The call is made by gpumon's own small gRPC client (h2c on asyncio streams: the pure parts are
:mod:`.podresources.grpc_unary`, :mod:`.podresources.h2`, :mod:`.podresources.hpack` and
:mod:`.podresources.view`), not by grpcio: grpc and protobuf cost the exporter's process 16.5 MiB
of RSS and 7 threads on every node, for one unary call every 10 seconds (docs/pod-attribution.md,
"The pod-resources client"). One connection per poll: a connect on a local socket costs
microseconds, and nothing then needs reconnecting, backing off or keeping alive across kubelet
restarts. Each poll is bounded by its timeout, from connect to the last byte.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from gpumon.devices.backend import ErrorSink
from gpumon.exporter.podresources.grpc_unary import CallFailed, GrpcStatus, UnaryCall
from gpumon.exporter.podresources.protowire import DecodeError
from gpumon.exporter.podresources.view import (
    Assignment,
    DeviceAssignment,
    PodKey,
    PodResourcesView,
    view_from_response,
)

__all__ = [
    "Assignment",
    "DeviceAssignment",
    "PodKey",
    "PodResourcesClient",
    "PodResourcesView",
    "error_kind",
    "view_from_response",
]

log = logging.getLogger(__name__)

SOURCE = "pod_resources"
LIST = "/v1.PodResourcesLister/List"
_MAX_MESSAGE_BYTES = 16 << 20  # what the kubelet itself allows for this API
_READ_BYTES = 1 << 16


def error_kind(status: GrpcStatus) -> str:
    return {
        GrpcStatus.UNAVAILABLE: "unavailable",
        GrpcStatus.DEADLINE_EXCEEDED: "timeout",
        GrpcStatus.PERMISSION_DENIED: "forbidden",
        GrpcStatus.UNIMPLEMENTED: "unimplemented",
    }.get(status, status.name.lower())


class PodResourcesClient:
    def __init__(
        self,
        socket: Path,
        errors: ErrorSink,
        watched: Callable[[str], bool],
        *,
        timeout_seconds: float,
        dra_drivers: frozenset[str] = frozenset(),
    ) -> None:
        self._socket = socket
        self._errors = errors
        self._watched = watched
        self._dra_drivers = dra_drivers
        self._timeout = timeout_seconds
        self.view: PodResourcesView | None = None
        self.fresh = False
        self._outage_logged = False

    async def poll(self) -> None:
        """List once; on success replace :attr:`view`, otherwise count why and keep it."""
        self.fresh = False
        if not self._socket.exists():
            self._errors(SOURCE, "socket_missing")
            return
        try:
            view = view_from_response(await self._list(), self._watched, self._dra_drivers)
        except CallFailed as e:
            self._failed(e)
            return
        except DecodeError as e:  # grpcio gave INTERNAL for a reply protobuf would not parse
            self._failed(CallFailed(GrpcStatus.INTERNAL, f"the reply is no ListPodResourcesResponse: {e}"))
            return
        self.view = view
        self.fresh = True
        self._outage_logged = False

    async def _list(self) -> bytes:
        call = UnaryCall(LIST, b"", timeout_seconds=self._timeout, max_message=_MAX_MESSAGE_BYTES)
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self._timeout):
                reader, writer = await asyncio.open_unix_connection(self._socket)
                writer.write(call.start())
                while call.reply is None:
                    data = await reader.read(_READ_BYTES)
                    if not data:
                        call.closed()
                    elif out := call.receive(data):
                        writer.write(out)
                        # A server that sends and never reads makes us wait (and time out),
                        # not buffer its PING acknowledgements without end.
                        await writer.drain()
                return call.reply
        except TimeoutError as e:
            raise CallFailed(GrpcStatus.DEADLINE_EXCEEDED, f"no reply within {self._timeout} s") from e
        except PermissionError as e:
            raise CallFailed(GrpcStatus.PERMISSION_DENIED, str(e)) from e
        except OSError as e:  # refused (nobody listening), reset, not a socket
            raise CallFailed(GrpcStatus.UNAVAILABLE, str(e) or type(e).__name__) from e
        finally:
            if writer is not None:
                writer.close()

    def _failed(self, e: CallFailed) -> None:
        kind = error_kind(e.status)
        self._errors(SOURCE, kind)
        # Logged once per outage; the error metric counts every failure.
        log.log(
            logging.DEBUG if self._outage_logged else logging.WARNING,
            "pod-resources List failed",
            extra={"kind": kind, "detail": e.message[:200]},
        )
        self._outage_logged = True
