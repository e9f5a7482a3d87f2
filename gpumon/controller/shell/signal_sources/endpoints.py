"""Where the exporters are: node name -> exporter base URL, from config, from a Prometheus
file_sd file, or from the API.

The direct source subscribes to each; ``changed`` tells it to look at the map again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from gpumon.kube.informer import Selection, View
from gpumon.kube.registry import Informers
from gpumon.wire import file_sd

log = logging.getLogger(__name__)


class Endpoints(Protocol):
    changed: asyncio.Event

    def current(self) -> Mapping[str, str]:
        """Node name -> exporter base URL."""


class StaticEndpoints:
    """A fixed node -> URL map from config (tests, demo, or exporters outside the cluster)."""

    def __init__(self, urls: Mapping[str, str]) -> None:
        self._urls = dict(urls)
        self.changed = asyncio.Event()
        self.changed.set()

    def current(self) -> Mapping[str, str]:
        return self._urls


def _exporter_endpoint(port: int, scheme: str) -> Callable[[Mapping[str, Any]], tuple[str, str] | None]:
    def convert(obj: Mapping[str, Any]) -> tuple[str, str] | None:
        status = obj.get("status") or {}
        node = (obj.get("spec") or {}).get("nodeName")
        ip = status.get("podIP")
        if status.get("phase") != "Running" or not node or not ip:
            return None
        host = f"[{ip}]" if ":" in ip else ip
        return str(node), f"{scheme}://{host}:{port}"

    return convert


class DiscoveredEndpoints:
    """Exporter pods found through the API (namespace + label selector), by node."""

    def __init__(self, informers: Informers, namespace: str, selector: str, port: int, scheme: str) -> None:
        self.changed = asyncio.Event()
        self.view: View[tuple[str, str]] = informers.informer(
            Selection(f"/api/v1/namespaces/{namespace}/pods", label_selector=selector)
        ).view(
            _exporter_endpoint(port, scheme),
            name="exporter-pods",
            on_change=lambda key, old, new: self.changed.set(),
        )

    def current(self) -> Mapping[str, str]:
        return dict(self.view.items().values())


class FileEndpoints:
    """Exporters listed in a Prometheus file_sd file (:mod:`gpumon.wire.file_sd`), the same file
    Prometheus scrapes them from. Its stat (inode, size, mtime) is checked every
    ``refresh_seconds`` and the file read again when that changed, as Prometheus re-reads its
    own; a writer should replace it whole (write elsewhere, then rename). A file that is missing,
    unreadable or refused leaves the last accepted map in force, counted by ``on_error`` and
    logged once until the file changes or is accepted again."""

    def __init__(
        self,
        path: Path,
        *,
        node_label: str,
        scheme: str,
        refresh_seconds: float,
        on_error: Callable[[str], None],
    ) -> None:
        self._path = path
        self._node_label = node_label
        self._scheme = scheme
        self._refresh = refresh_seconds
        self._on_error = on_error
        self._urls: Mapping[str, str] = {}
        self._seen: tuple[int, int, int] | None = None
        self._told: str | None = None
        self.changed = asyncio.Event()

    def current(self) -> Mapping[str, str]:
        return self._urls

    def refresh(self) -> None:
        """Read the file again if its stat changed since the last look."""
        try:
            st = self._path.stat()
        except OSError as e:
            self._refused("missing", f"cannot stat: {e.strerror}", None)
            return
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        if seen == self._seen:
            return
        try:
            urls = file_sd.read_exporter_urls(
                self._path.read_bytes(),
                filename=self._path.name,
                node_label=self._node_label,
                scheme=self._scheme,
            )
        except OSError as e:
            self._refused("unreadable", f"cannot read: {e.strerror}", seen)
            return
        except file_sd.FileSdError as e:
            self._refused("invalid", str(e), seen)
            return
        self._seen, self._told = seen, None
        if urls != self._urls:
            log.info("exporter targets file read", extra={"path": str(self._path), "exporters": len(urls)})
            self._urls = urls
            self.changed.set()

    def _refused(self, kind: str, why: str, seen: tuple[int, int, int] | None) -> None:
        self._seen = seen
        self._on_error(f"targets_file_{kind}")
        if why != self._told:
            self._told = why
            log.warning(
                "exporter targets file refused; the last accepted exporters stay",
                extra={"path": str(self._path), "error": why, "exporters": len(self._urls)},
            )

    async def run(self) -> None:
        # On the loop, not a thread: a stat is microseconds, the file is read only when it
        # changed and is bounded (file_sd.MAX_FILE_BYTES), and ``changed`` is the loop's.
        while True:
            self.refresh()
            await asyncio.sleep(self._refresh)
